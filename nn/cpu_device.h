// The CPU device: Eigen GEMMs (multi-threaded through OpenMP) and the plain C++ kernels of
// cpu_kernels.h, over memory drawn from a capped budget.
//
// The cap (`device.memory`) makes a CPU run meet exactly the limits a GPU run meets: model
// states that exceed it fail at allocation with a message, and offload must make them fit.
// Memory is 64-byte aligned host memory (from the process allocator, mimalloc in ferry's
// executables), so host_accessible() is true.
// Supported dtypes: f32 and f64 for every op; bf16 and f16 for every op too, computed in
// f32 and rounded once per output (see Widen in cpu_device.cpp), mixed freely with f32
// operands (weight gradients stay f32 under mixed precision).
// Thread safety: allocation accounting is guarded by a mutex; ops are issued by one thread.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "nn/device.h"

namespace ferry::nn {

class CpuDevice final : public Device {
 public:
  // threads = 0: every core OpenMP sees. Sets the constructing thread's OpenMP team size
  // (omp_set_num_threads: nthreads-var is per thread), which Eigen's products follow too:
  // the device's parallel work runs with `threads` threads on the thread that made it.
  explicit CpuDevice(size_t capacity_bytes, int threads = 0);
  ~CpuDevice() override;

  DeviceKind kind() const override { return DeviceKind::cpu; }
  std::string name() const override;
  bool host_accessible() const override { return true; }
  int threads() const { return threads_; }

  // Host memory for a GPU's offloaded states (gradient and parameter shards): from now on
  // every allocation of at least `min_bytes` is page-locked through `pin` (undone by
  // `unpin` before it is freed), so the GPU's uploads and downloads from it overlap
  // (Device::upload/download). A pinned allocation takes whole pages (page-aligned, its
  // length rounded up to pages): no two registrations share a page, so an allocation of
  // any size can be pinned. Small shards matter too: a download into pageable memory
  // blocks the host until it is done (on a GPU as on the emulation), so the default pins
  // everything. A pin that fails ("" = success, else why) leaves the memory pageable:
  // copies are then staged, slower but correct; the first reason is kept.
  struct Pinning {
    std::function<std::string(void*, size_t)> pin;
    std::function<void(void*)> unpin;
    size_t min_bytes = 0;
  };
  void set_pinning(Pinning p);
  std::string pinning_problem() const;  // the first failed pin's reason, "" if none
  size_t pinned_bytes() const;          // bytes page-locked now (whole pages)

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) noexcept override;
  MemoryStats memory() const override;
  void reset_peak() override;

  void copy_from_host(const Tensor& dst, const void* src) override;
  void copy_to_host(void* dst, const Tensor& src) override;
  void copy(const Tensor& dst, const Tensor& src) override;
  void cast(const Tensor& dst, const Tensor& src) override;
  void fill(const Tensor& dst, double value) override;
  void synchronize() override {}

  void gemm(const Tensor& c, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
            double alpha, double beta) override;
  void gemm_cols(const Tensor& c, int64_t c_col, int64_t c_cols, const Tensor& a, int64_t a_col, int64_t a_cols,
                 bool trans_a, const Tensor& b, bool trans_b, double alpha, double beta) override;
  void add_bias(const Tensor& out, const Tensor& bias) override;
  void bias_backward(const Tensor& dbias, const Tensor& dout) override;
  void add(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void accumulate(const Tensor& dst, const Tensor& src) override;
  double sum_squares(const Tensor& x) override;
  void scale(const Tensor& x, double factor) override;
  void dropout_rows(const Tensor& out, const Tensor& in, double p, uint64_t key, int64_t row0) override;
  void nf4_dequantize(const Tensor& panel, const Tensor& blob, const Nf4Layout& l, int64_t r0, int64_t c0) override;
  bool nf4_gemm(const Tensor& c, int64_t c_col, const Tensor& a, int64_t a_col, const std::vector<Nf4Weight>& pieces,
                bool trans_w, double beta) override;
  // Whether nf4_gemm multiplies these dtypes straight from the blobs (bf16 a, f32 or bf16 c,
  // a CPU with AVX512-BF16): ferry plan's counting device of kind cpu asks, so that the plan
  // leaves out the panel the run does not allocate.
  static bool nf4_gemm_direct(DType c, DType a);

  void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                         const Tensor& wpe, int64_t T) override;
  void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens, int64_t T) override;
  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         const Tensor& inp, const Tensor& weight, const Tensor& bias) override;
  void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                          const Tensor& dout, const Tensor& inp, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd) override;
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
  void softmax_cross_entropy_forward(const Tensor& losses, const Tensor& probs,
                                     const Tensor& logits, const Tensor& targets) override;
  void softmax_cross_entropy_backward(const Tensor& dlogits, const Tensor& probs,
                                      const Tensor& targets, double dloss) override;
  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
             const AdamWStep& step) override;

 private:
  class Widen;
  static constexpr size_t kScratchCapacity = size_t{1} << 62;
  mutable std::mutex mu_;
  MemoryStats stats_;
  Pinning pinning_;                       // under mu_
  std::unordered_map<void*, size_t> pinned_;  // under mu_: address -> bytes registered
  size_t pinned_bytes_ = 0;               // under mu_
  std::string pin_problem_;               // under mu_
  int threads_;
  std::unique_ptr<CpuDevice> scratch_;  // f32 copies of low-precision operands, outside the budget
};

}  // namespace ferry::nn
