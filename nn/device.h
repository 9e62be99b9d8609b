// Device: where tensors live and where the model's ops run.
//
// One interface for every backend (the CPU device, the CUDA device, the counting device of
// `ferry plan`), composed of two halves with their own contracts:
// - DeviceMemory (nn/device_memory.h): memory against a byte budget, copies, the offload
//   path's transfers, ordering and the device clock;
// - DeviceOps (nn/device_ops.h): numeric conversion, GEMM, the kernels the models use,
//   forward and backward, and AdamW.
// Device adds what names the device. The halves are virtual bases, so an implementation
// may take one half from a class of its own: CountingDevice counts memory and takes its
// ops from ShapeOnlyOps (nn/shape_only_ops.h), which only checks shapes. Every op of every
// device is checked against the CPU device, which is the oracle.
#pragma once

#include <string>

#include "nn/device_memory.h"
#include "nn/device_ops.h"

namespace ferry::nn {

enum class DeviceKind { cpu, cuda };

class Device : public virtual DeviceMemory, public virtual DeviceOps {
 public:
  ~Device() override = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;
  // True when tensor data pointers may be dereferenced by host code (CPU device).
  virtual bool host_accessible() const = 0;

  // DeviceOps::sum_squares_to's default, which needs both halves: sum_squares, then a copy.
  void sum_squares_to(const Tensor& x, const Tensor& out) override {
    const double v = sum_squares(x);
    copy_from_host(out, &v);
  }
};

}  // namespace ferry::nn
