// CountingDevice: a Device that only counts. `ferry plan` runs the real engine's
// construction and a training step on it, so its memory figures are the engine's own
// allocation sequence, not a model of it.
//
// Memory: allocate()/deallocate() account the bytes asked for exactly as the CPU and CUDA
// devices do (in_use, peak, the cap; OutOfDeviceMemory past it), so a peak read here is
// the peak a real run of the same sequence reports. The addresses handed out are lazily
// mapped anonymous memory (MAP_NORESERVE): no page exists until something writes to it.
// Nothing in nn/ reads them, since every op here is a no-op; they are real addresses only so
// that host-side engine code writing through a host-accessible device's tensors stays
// harmless (a page written is released again when its tensor is freed). The nvme staging
// through a count_only pinned pool moves no bytes at all (offload::PinnedPool::copy), so a
// dry run of any model size touches almost no memory.
// Ops: ShapeOnlyOps (nn/shape_only_ops.h): every GEMM and kernel checks its operands'
// shapes and does nothing else; copies check theirs and move nothing. Values in tensors are
// garbage; only the allocation sequence is meaningful.
// host_accessible(): as constructed. The engine requires a host-accessible device for
// offloaded placements; a counting stand-in for a GPU says false.
// Thread safety: accounting is guarded by a mutex; ops touch no state.
#pragma once

#include <mutex>
#include <string>

#include "nn/device.h"
#include "nn/shape_only_ops.h"

namespace ferry::nn {

class CountingDevice : public Device, public ShapeOnlyOps {
 public:
  CountingDevice(std::string label, size_t capacity_bytes, bool host_accessible, DeviceKind kind = DeviceKind::cpu);

  DeviceKind kind() const override { return kind_; }
  std::string name() const override;
  bool host_accessible() const override { return host_accessible_; }

  // DeviceMemory: the budget counted, nothing moved.
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) noexcept override;
  MemoryStats memory() const override;
  void reset_peak() override;
  size_t allocations() const;  // allocate() calls so far

  void copy_from_host(const Tensor&, const void*) override {}
  void copy_to_host(void*, const Tensor&) override {}
  void copy(const Tensor& dst, const Tensor& src) override;
  // As the device it stands for: kind cpu multiplies NF4 straight from the blobs where
  // CpuDevice::nf4_gemm would (no panel scratch); kind cuda dequantizes panels, or with
  // set_nf4_fused (device.nf4_gemm fused) multiplies 16-bit operands from the blobs too.
  bool nf4_gemm(const Tensor& c, int64_t c_col, const Tensor& a, int64_t a_col, const std::vector<Nf4Weight>& pieces,
                bool trans_w, double beta) override;
  void set_nf4_fused(bool on) { nf4_fused_ = on; }
  void synchronize() override {}

 private:
  std::string label_;
  bool host_accessible_;
  DeviceKind kind_;
  bool nf4_fused_ = false;
  mutable std::mutex mu_;
  MemoryStats stats_;
  size_t allocations_ = 0;
};

}  // namespace ferry::nn
