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
// Ops: every copy, GEMM and kernel checks its operands' shapes (nn/op_checks.h) and does
// nothing else: no FLOPs, no data. sum_squares returns 0. Values in tensors are garbage;
// only the allocation sequence is meaningful.
// host_accessible(): as constructed. The engine requires a host-accessible device for
// offloaded placements; a counting stand-in for a GPU says false.
// Thread safety: accounting is guarded by a mutex; ops touch no state.
#pragma once

#include <mutex>
#include <string>

#include "nn/device.h"

namespace ferry::nn {

class CountingDevice final : public Device {
 public:
  CountingDevice(std::string label, size_t capacity_bytes, bool host_accessible, DeviceKind kind = DeviceKind::cpu);

  DeviceKind kind() const override { return kind_; }
  std::string name() const override;
  bool host_accessible() const override { return host_accessible_; }

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) noexcept override;
  MemoryStats memory() const override;
  void reset_peak() override;
  size_t allocations() const;  // allocate() calls so far

  void copy_from_host(const Tensor&, const void*) override {}
  void copy_to_host(void*, const Tensor&) override {}
  void copy(const Tensor& dst, const Tensor& src) override;
  void cast(const Tensor& dst, const Tensor& src) override;
  void fill(const Tensor&, double) override {}
  void synchronize() override {}

  void gemm(const Tensor& c, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, double alpha,
            double beta) override;
  void add_bias(const Tensor& out, const Tensor& bias) override;
  void bias_backward(const Tensor& dbias, const Tensor& dout) override;
  void add(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void accumulate(const Tensor& dst, const Tensor& src) override;
  double sum_squares(const Tensor&) override { return 0.0; }
  void scale(const Tensor&, double) override {}

  void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                         int64_t T) override;
  void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,
                          int64_t T) override;
  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                         const Tensor& weight, const Tensor& bias) override;
  void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd) override;
  void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t n_head,
                         int64_t n_kv_head = 0, const Tensor& doc_start = Tensor{}) override;
  void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, int64_t n_head, int64_t n_kv_head = 0,
                          const Tensor& doc_start = Tensor{}) override;
  void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                       double eps) override;
  void rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& rstd) override;
  void swiglu_forward(const Tensor& out, const Tensor& gate_up) override;
  void swiglu_backward(const Tensor& dgate_up, const Tensor& gate_up, const Tensor& dout) override;
  void rope_forward(const Tensor& out, const Tensor& inp, int64_t T, int64_t heads, int64_t head_dim,
                    const Rope& rope) override;
  void rope_backward(const Tensor& dinp, const Tensor& dout, int64_t T, int64_t heads, int64_t head_dim,
                     const Rope& rope) override;
  void gelu_forward(const Tensor& out, const Tensor& inp) override;
  void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) override;
  void softmax_cross_entropy_forward(const Tensor& losses, const Tensor& probs, const Tensor& logits,
                                     const Tensor& targets) override;
  void softmax_cross_entropy_backward(const Tensor& dlogits, const Tensor& probs, const Tensor& targets,
                                      double dloss) override;
  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
             const AdamWStep& step) override;

 private:
  std::string label_;
  bool host_accessible_;
  DeviceKind kind_;
  mutable std::mutex mu_;
  MemoryStats stats_;
  size_t allocations_ = 0;
};

}  // namespace ferry::nn
