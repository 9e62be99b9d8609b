// OptimizerState: AdamW's fp32 master weights and m, v for the range each rank updates,
// kept where zero_optimization.offload_optimizer.device says:
//   none  the device arena; when the compute weights are there too (the default), the
//         master weights ARE the compute weights (no copy), except where those are 16-bit
//         shards (a frozen base at stage 3, ShardedUnits::owned_rounded): then an fp32
//         master beside them, and each update's rounding is written to the shard
//   cpu   host memory; Adam runs in place, then the updated master range is copied to
//         the compute weights
//   nvme  an NVMe file; each tile of master, m and v is read into pinned buffers, updated,
//         written back, and copied to the compute weights; the swapper reads the next
//         tiles while Adam updates this one (buffer_count / 3 - 1 tiles ahead).
//         Two slots per array: a step reads the current slot and writes the other, and
//         commit() makes the written slots current only when every unit has succeeded, so
//         a failed write (EIO, ENOSPC) leaves the previous step's state whole and readable.
// Every placement computes the same fp32 arithmetic in the same order, so losses are
// identical across placements (a test checks it bit for bit).
// Threads: one thread at a time: step() and commit() run on the UpdateWorker's thread when
// the optimizer overlaps compute; the checkpoint methods run on the training thread between
// steps, after the worker has drained. Errors: StorageError naming the file on nvme.
// Trace: the update itself is "cpu adam"; its NVMe tile reads and writes have their tracks.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "base/trace.h"
#include "offload/cpu_adam.h"
#include "offload/pinned_pool.h"
#include "offload/shard_store.h"
#include "offload/swapper.h"
#include "runtime/config/sections.h"
#include "runtime/zero/sharded_units.h"

namespace ferry::runtime {

struct DecayRange {
  int64_t begin, end;  // within the owned range
  double weight_decay;
};

class OptimizerState {
 public:
  // Writes unit's owned range of the initial fp32 weights (owned length) into `dst`.
  using MasterInit = std::function<void(int unit, float* dst)>;
  // Initialises the master weights from the units' owned compute weights, m = v = 0; where
  // those are kept rounded (16-bit parameter shards: ShardedUnits::owned_rounded), from
  // `master_init`, which is then required. Updated weights go back to 16-bit shards through
  // CPU Adam's fused copy-out.
  OptimizerState(offload::Tier tier, ShardedUnits& units, nn::Device& device, nn::Device& host, const offload::CpuAdam& adam,
                 const OffloadConfig& offload, offload::PinnedPool* pool, int rank, std::string* warning,
                 const MasterInit& master_init = {});

  // One AdamW step over unit u's owned range with its reduced gradient shard `grads`
  // (owned length; on the GPU where the states are, else host-accessible); `ranges` are
  // the parts that hold parameters.
  void step(int unit, const nn::Tensor& grads, const std::vector<DecayRange>& ranges, int64_t step, double lr,
            double grad_scale);
  // After every unit's step: the new state becomes the current one (nvme: flips the slots).
  void commit();
  // Host copy of unit's current master weights (owned length), whatever the tier.
  std::vector<float> master(int unit);

  // Checkpoints. The arrays of a unit's owned range: master weights, Adam m and v.
  enum Array { kMaster = 0, kM = 1, kV = 2 };
  // Copies [offset, offset + n) of the unit's current `array` (owned coordinates) into any
  // host memory; nvme goes through one pinned buffer at a time, so memory stays bounded.
  void read_state(int unit, Array array, int64_t offset, int64_t n, float* dst);
  // Replaces the unit's whole current `array` (owned length, from host memory). Writing
  // the master also sets the unit's owned compute weights to it; stages 1-2 then need
  // ShardedUnits::publish_params() to spread them.
  void write_state(int unit, Array array, const float* src);

  void set_tracer(Tracer* t) { tracer_ = t; }
  void set_read_ahead(bool on) { read_ahead_ = on; }  // off: the plain sequential order
  offload::Tier tier() const { return tier_; }
  bool aliased() const { return alias_; }
  std::string where() const { return store_->where(); }
  size_t bytes() const { return store_->bytes(); }  // master (unless aliased), m and v

 private:
  // Region of array `which` (master, m, v) of a unit; nvme has two slots per array.
  int region(int unit, int which, int slot = 0) const {
    return unit * per_unit_ * slots_ + slot * per_unit_ + which - (alias_ ? 1 : 0);
  }
  offload::Tier tier_;
  bool alias_;
  int per_unit_;
  int slots_ = 1;
  int current_ = 0;  // nvme: the slot holding the last committed step
  int buffers_ = 0;  // nvme: pool buffers this state may hold at once (its share of the pool)
  int64_t tile_ = 0;  // elements per pinned buffer, a multiple of both stores' nvme quantum
  bool read_ahead_ = true;  // nvme: read the next tiles while updating this one
  ShardedUnits& units_;
  const offload::CpuAdam& adam_;
  offload::PinnedPool* pool_;
  std::unique_ptr<offload::ShardStore> store_;
  std::unique_ptr<offload::Swapper> swapper_;  // nvme: tile reads ahead of the update
  Tracer* tracer_ = nullptr;
};

}  // namespace ferry::runtime
