// StagedUnits (tests only): compute on one device while the units live behind another
// UnitAccess whose tensors are in host memory. The runtime used it for GPU offload until
// whole units crossing PCIe gave way to shards (runtime/zero/sharded_units.h); it stays as
// the harness that runs a model on a device from units resident on the CPU device, so
// every device's forward and backward can be compared with the CPU's on the same units.
//
// acquire_weights copies the unit's weights (whatever dtype the home hands out: bf16
// under mixed precision) to the compute device; the copy is dropped on the last release.
// acquire_grads copies the home's gradient buffer up and release_grads copies it back,
// so the += of every backward op lands in the home's buffer exactly as if the ops had
// run there (the same f32 arithmetic, in the same order). Nested acquires of one unit
// (a tied embedding) share one staged copy.
// The home's tensors must be host-accessible (std::invalid_argument otherwise).
// Memory: staged copies come from the compute device's arena (its cap and peak count them).
// Threads: the model's thread, as every UnitAccess.
#pragma once

#include <map>

#include "nn/unit.h"

namespace ferry::testing {

class StagedUnits final : public nn::UnitAccess {
 public:
  StagedUnits(nn::UnitAccess& home, nn::Device& compute) : home_(home), compute_(compute) {}

  nn::Tensor acquire_weights(int unit) override;
  void release_weights(int unit) override;
  nn::Tensor acquire_grads(int unit) override;
  void release_grads(int unit, bool complete) override;

 private:
  struct Staged {
    nn::Tensor home, here;
    int refs = 0;
  };
  nn::Tensor acquire(std::map<int, Staged>& staged, int unit, bool grads);
  nn::Tensor stage(const nn::Tensor& home, const char* what, int unit);

  nn::UnitAccess& home_;
  nn::Device& compute_;
  std::map<int, Staged> weights_, grads_;
};

}  // namespace ferry::testing
