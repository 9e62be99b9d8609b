// The cuda device's class, shared by the files that implement it (nn/cuda/device_*.cpp;
// the contract is nn/cuda_device.h): memory (device_memory.cpp), copies, events and clocks
// (device_transfers.cpp), cuBLAS GEMM (device_gemm.cpp), the model's ops
// (device_ops.cpp), and the factory and probes (device_probe.cpp). Internal: needs the CUDA
// runtime's and cuBLAS's headers; in ferry::nn::cuda_dev inside the ABI namespace of
// nn/cuda_abi.h, so the CPU emulation's copy never meets the real one at link time.
#pragma once

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "base/handle_pool.h"
#include "nn/cuda/arena.h"
#include "nn/cuda_abi.h"
#include "nn/cuda_check.h"
#include "nn/cuda_device.h"
#include "nn/cuda_kernels.h"
#include "nn/op_checks.h"

namespace ferry::nn::cuda_dev {
FERRY_CUDA_ABI_BEGIN

inline constexpr const char* kDev = "cuda";
inline constexpr size_t kBlockAlign = 256;  // cudaMalloc's own alignment; enough for every vector load
inline constexpr size_t kCublasWorkspace = 32u << 20;  // what cuBLAS recommends for Hopper
// GPU memory kept free outside device.memory (checked against cudaMemGetInfo when the
// device is made and again when its slab is carved). cudaMemGetInfo's free memory already
// excludes the CUDA context and, in the trainer, NCCL's buffers (the communicator starts
// before the slab, with NCCL_RUNTIME_CONNECT=0 so it connects then); what comes after is:
// - cuBLAS's workspace (kCublasWorkspace), allocated with the device;
// - the default memory pool's stream-ordered allocations, kept by the pool (its release
//   threshold is raised to "never", so a cudaMallocAsync does not map memory again after
//   every synchronisation): only NCCL's staging of host buffers (a loss, a norm, the
//   order check's few bytes), as the device's own scratch comes from the slab;
// - what arrives lazily: kernel images loaded at first launch (CUDA_MODULE_LOADING=LAZY),
//   their local memory, cuBLAS's internal buffers, and NCCL's connections where
//   NCCL_RUNTIME_CONNECT=0 is not honoured (NCCL before 2.22 connects at init anyway).
// 64 MiB for the pool and 256 MiB for the rest leave room for each with a margin; a run
// that needs more fails in the named CUDA call, not in the middle of the budget's work.
inline constexpr size_t kPoolAllowance = size_t{64} << 20;
inline constexpr size_t kLateAllowance = size_t{256} << 20;
inline constexpr size_t kReserve = kCublasWorkspace + kPoolAllowance + kLateAllowance;

// FERRY_CUDA_SYNC=1: after every op, wait for the device and check (cuda_check.h).
inline bool sync_each_op() {
  return cuda::sync_each_launch();
}

using checks::fail;
using checks::rows_of;
using cuda::Arr;

inline Arr arr(const Tensor& t) {
  return {t.data(), t.dtype()};
}

inline size_t round_up(size_t n, size_t a) {
  return (std::max<size_t>(n, 1) + a - 1) / a * a;
}

class CudaDevice final : public Device, private DeviceClock {
 public:
  CudaDevice(size_t capacity, int ordinal, AttentionKernel attention);
  ~CudaDevice() override;

  DeviceKind kind() const override { return DeviceKind::cuda; }
  std::string name() const override { return name_; }
  bool host_accessible() const override { return false; }
  cudaStream_t compute_stream() const { return compute_; }
  int ordinal() const { return ordinal_; }
  AttentionKernel attention_kernel() const { return attention_; }

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) noexcept override;
  MemoryStats memory() const override;
  void reset_peak() override;

  void copy_from_host(const Tensor& dst, const void* src) override;
  void copy_into_new(const Tensor& dst, const void* src) override;
  void copy_to_host(void* dst, const Tensor& src) override;
  TransferPtr upload(const Tensor& dst, const void* src) override;
  TransferPtr download(void* dst, const Tensor& src, const std::shared_ptr<void>& after) override;
  TransferBytes transfer_bytes() const override { return {to_device_.load(), to_host_.load()}; }
  void copy(const Tensor& dst, const Tensor& src) override;
  void cast(const Tensor& dst, const Tensor& src) override;
  void fill(const Tensor& dst, double value) override;
  void synchronize() override;

  void gemm(const Tensor& c, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
            double alpha, double beta) override;
  void gemm_cols(const Tensor& c, int64_t c_col, int64_t c_cols, const Tensor& a, int64_t a_col, int64_t a_cols,
                 bool trans_a, const Tensor& b, bool trans_b, double alpha, double beta) override;
  void linear_forward(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                      const Tensor& pre) override;
  void add_bias(const Tensor& out, const Tensor& bias) override;
  void bias_backward(const Tensor& dbias, const Tensor& dout) override;
  void add(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void accumulate(const Tensor& dst, const Tensor& src) override;
  double sum_squares(const Tensor& x) override;
  void sum_squares_to(const Tensor& x, const Tensor& out) override;
  void check_errors() override;
  DeviceClock* clock() override { return this; }
  DeviceClock::Mark mark() override;
  double seconds_between(const DeviceClock::Mark& a, const DeviceClock::Mark& b) override;
  DeviceClock::Mark passed_mark() override;
  void scale(const Tensor& x, double factor) override;
  void dropout_rows(const Tensor& out, const Tensor& in, double p, uint64_t key, int64_t row0) override;
  void nf4_dequantize(const Tensor& panel, const Tensor& blob, const Nf4Layout& l, int64_t r0, int64_t c0) override;
  // With set_nf4_fused(true) (device.nf4_gemm "fused"): bf16/f16 products straight from the
  // blobs (nn/cuda/nf4_gemm.cu), matching the panel path to the GEMM's rounding; otherwise
  // false, and the caller dequantizes panels for cuBLAS.
  bool nf4_gemm(const Tensor& c, int64_t c_col, const Tensor& a, int64_t a_col, const std::vector<Nf4Weight>& pieces,
                bool trans_w, double beta) override;
  void set_nf4_fused(bool on) { nf4_fused_ = on; }

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
  void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, double eps) override;
  void rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& rstd) override;
  void swiglu_forward(const Tensor& out, const Tensor& gate_up) override;
  void swiglu_backward(const Tensor& dgate_up, const Tensor& gate_up, const Tensor& dout) override;
  void rope_forward(const Tensor& out, const Tensor& inp, int64_t T, int64_t heads,
                    int64_t head_dim, const Rope& rope) override;
  void rope_backward(const Tensor& dinp, const Tensor& dout, int64_t T, int64_t heads,
                     int64_t head_dim, const Rope& rope) override;
  void gelu_forward(const Tensor& out, const Tensor& inp) override;
  void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) override;
  void softmax_cross_entropy_forward(const Tensor& losses, const Tensor& probs,
                                     const Tensor& logits, const Tensor& targets) override;
  void softmax_cross_entropy_backward(const Tensor& dlogits, const Tensor& probs,
                                      const Tensor& targets, double dloss) override;
  // The fused head with nn/cuda/linear_xent.cu's in-place rows (no f32 probabilities).
  void linear_cross_entropy_forward(const Tensor& losses, const Tensor& x, const Tensor& w,
                                    const Tensor& targets) override;
  void linear_cross_entropy_backward(const Tensor& dx, const Tensor& dw, const Tensor& x, const Tensor& w,
                                     const Tensor& targets, double dloss) override;
  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
             const AdamWStep& step) override;

 private:
  // Scratch for one op (the f32 copies of a mixed-dtype GEMM, attention backward's row
  // sums): a block of the slab, counted against the budget like any tensor, so a GPU run
  // fails with OutOfDeviceMemory naming device.memory rather than in a driver call, and
  // the peak shows it. Freed when the op has been issued: later compute work is ordered
  // after the op's kernels, and copies wait for the block's fence.
  class Scratch {
   public:
    Scratch() = default;
    Scratch(CudaDevice& d, size_t bytes) : d_(&d), bytes_(bytes), p_(d.allocate(bytes)) {}
    Scratch(Scratch&& o) noexcept
        : d_(o.d_), bytes_(o.bytes_), p_(std::exchange(o.p_, nullptr)) {}
    Scratch& operator=(Scratch&& o) noexcept {
      std::swap(d_, o.d_);
      std::swap(bytes_, o.bytes_);
      std::swap(p_, o.p_);
      return *this;
    }
    ~Scratch() {
      if (p_) d_->deallocate(p_, bytes_);
    }
    void* get() const { return p_; }

   private:
    CudaDevice* d_ = nullptr;
    size_t bytes_ = 0;
    void* p_ = nullptr;
  };

  // A copy stream `s` waits for the compute work issued so far; returns nothing.
  void after_compute(cudaStream_t s);
  // Copies on the host-to-device stream, after `wait` (null: nothing), then orders the
  // compute stream after the copy. Waits for the copy on the host only where `src` is
  // page-locked and `hold_src` is false: a pageable source is staged by the runtime
  // before cudaMemcpyAsync returns, a page-locked one is read when the copy runs.
  void upload_on(const Tensor& dst, const void* src, cudaEvent_t wait, bool hold_src);
  // The block's fence when it has not fired yet (copy_into_new's and upload's wait).
  cudaEvent_t pending_fence(const Tensor& dst, FencePtr& keep);
  // The slab, carved at the first allocation (under mu_): after NCCL has started, so
  // that the free memory checked is what is left once it has taken its buffers.
  void carve_slab();
  // "" when `bytes` of slab fit in `free` bytes with `reserve` kept aside, else why.
  std::string fits(size_t slab, size_t free, size_t reserve, const char* when) const;
  // FERRY_CUDA_SYNC=1: waits for the device and checks for an error after `what`.
  void debug_sync(const char* what);
  // Reads the kernels' error flag back (synchronizing the compute stream) and throws the
  // recorded error, if any, as std::out_of_range built by `what(index, value)`.
  // Value errors flagged by kernels, one slot per kind (flag, index, value): tokens outside
  // the vocabulary, targets outside the logits. Checked late: check_errors().
  static constexpr int kTokenSlot = 0, kTargetSlot = 1, kErrorSlots = 2;
  static constexpr size_t kErrorBytes = 3 * kErrorSlots * sizeof(int);
  std::atomic<bool> flags_pending_{false};
  // Timing events for trace marks, reused (base/handle_pool.h).
  std::shared_ptr<HandlePool<cudaEvent_t>> marks_ = HandlePool<cudaEvent_t>::make(
      [] {
        cudaEvent_t e = nullptr;
        FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
        return e;
      },
      [](cudaEvent_t e) { cudaEventDestroy(e); });
  std::atomic<uint64_t> to_device_{0}, to_host_{0};  // transfer_bytes()
  int64_t flag_limit_[kErrorSlots] = {0, 0};  // V of the latest launch per slot, for the message
  Arr widen(const Tensor& t, Scratch& keep);
  cuda::Stream st() const { return compute_; }

  std::string name_;
  int ordinal_;
  AttentionKernel attention_;
  bool nf4_fused_ = false;
  mutable std::mutex mu_;
  MemoryStats stats_;
  size_t slab_bytes_ = 0;
  char* slab_ = nullptr;
  EventPool events_;  // before arena_: the arena's fences give their events back to it
  std::unique_ptr<Arena> arena_;
  cudaStream_t compute_ = nullptr, h2d_ = nullptr, d2h_ = nullptr;
  cudaEvent_t compute_done_ = nullptr, copy_done_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_ws_ = nullptr;  // cuBLAS's and cuBLASLt's (both on the compute stream)
  cublasLtHandle_t lt_ = nullptr;
  // linear_forward's cuBLASLt algorithm per (M, N, K, type, epilogue); nullopt: none, unfused.
  std::mutex lt_mu_;
  std::map<std::array<int64_t, 5>, std::optional<cublasLtMatmulAlgo_t>> lt_algos_;
  bool lt_fusable(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& pre);
  int* err_ = nullptr;            // device int[3]: flag, index, value
  int* err_host_ = nullptr;       // pinned int[3 * kErrorSlots]
  double* partial_ = nullptr;     // device double[kSumSquaresBlocks + 1]
  double* total_host_ = nullptr;  // pinned double
  uint64_t frees_ = 0;            // fences handed out (their order)
};

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda_dev
