#include "nn/cuda_device.h"

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/handle_pool.h"
#include "nn/cuda_check.h"
#include "nn/cuda_kernels.h"
#include "nn/op_checks.h"

namespace ferry::nn {

namespace {

constexpr const char* kDev = "cuda";
constexpr size_t kBlockAlign = 256;  // cudaMalloc's own alignment; enough for every vector load
constexpr size_t kCublasWorkspace = 32u << 20;  // what cuBLAS recommends for Hopper
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
constexpr size_t kPoolAllowance = size_t{64} << 20;
constexpr size_t kLateAllowance = size_t{256} << 20;
constexpr size_t kReserve = kCublasWorkspace + kPoolAllowance + kLateAllowance;

// FERRY_CUDA_SYNC=1: after every op, wait for the device and check (cuda_check.h).
bool sync_each_op() {
  return cuda::sync_each_launch();
}

using checks::fail;
using checks::rows_of;
using cuda::Arr;

Arr arr(const Tensor& t) {
  return {t.data(), t.dtype()};
}

size_t round_up(size_t n, size_t a) {
  return (std::max<size_t>(n, 1) + a - 1) / a * a;
}

// Events for fences, reused: a GPT step frees about a thousand tensors per micro-batch,
// and creating and destroying an event per free is microseconds of driver time each.
// Re-recording an event is safe while streams still wait on an earlier record
// (cudaStreamWaitEvent takes the event's state at the call). Thread safe.
class EventPool {
 public:
  EventPool() = default;
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  // An event ready to record; null when one cannot be created.
  cudaEvent_t get() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();  // not left for the next launch check to misreport
      return nullptr;
    }
    return e;
  }
  void put(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(e);
  }
 private:
  mutable std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

// A point on the compute stream after which a freed block is no longer used: the event
// recorded when it was freed (later ops that reuse the block are issued after it).
struct Fence {
  cudaEvent_t event = nullptr;
  uint64_t seq = 0;   // later frees have larger numbers (and later records: one lock)
  bool done = false;  // a query found it complete (it stays so); under the device's mutex
  EventPool* pool = nullptr;
  Fence() = default;
  Fence(const Fence&) = delete;
  Fence& operator=(const Fence&) = delete;
  ~Fence() {
    if (event) pool->put(event);
  }
};
using FencePtr = std::shared_ptr<Fence>;

// Whether nothing queued can still use a block with this fence. Asks the driver at most
// once per fence that has completed.
bool idle(const FencePtr& f) {
  if (!f || f->done) return true;
  const cudaError_t q = cudaEventQuery(f->event);
  if (q == cudaSuccess) return f->done = true;
  if (q != cudaErrorNotReady) cudaGetLastError();  // unknown: treated as busy
  return false;
}

// First fit over one slab, preferring idle blocks; blocks are coalesced with free
// neighbours, a coalesced block keeping the later of its parts' fences. Not thread safe
// (the device's mutex guards it).
class Arena {
 public:
  Arena(char* base, size_t size) : base_(base) { free_[0] = {size, nullptr}; }
  // The first free block that fits and is idle (its fence has fired, or it was never
  // used), else the first that fits: a block freed a moment ago (first fit often hands
  // back the most recent) would make copy_into_new wait for nearly all queued work,
  // while compute ops, ordered on the stream, do not care. Fences known to have fired
  // cost nothing; the driver is asked (in address order, about at most kQueries blocks
  // before the first known idle one) only where more than one block fits.
  void* take(size_t bytes) {
    constexpr size_t kQueries = 8;
    std::vector<std::map<size_t, Block>::iterator> busy;  // fitting, before a known idle one
    auto known_idle = free_.end();
    bool more = false;  // a fitting block beyond those collected
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second.len < bytes) continue;
      const FencePtr& f = it->second.fence;
      if (!f || f->done) {
        known_idle = it;
        break;
      }
      if (busy.size() == kQueries) {
        more = true;
        break;
      }
      busy.push_back(it);
    }
    auto pick = known_idle;
    if (!busy.empty() && (busy.size() > 1 || known_idle != free_.end() || more)) {
      for (auto it : busy) {
        if (idle(it->second.fence)) {
          pick = it;
          break;
        }
      }
    }
    if (pick == free_.end() && !busy.empty()) pick = busy.front();
    if (pick == free_.end()) return nullptr;
    const size_t at = pick->first, left = pick->second.len - bytes;
    const FencePtr fence = pick->second.fence;
    free_.erase(pick);
    if (left > 0) free_[at + bytes] = {left, fence};
    used_[at] = {bytes, fence};
    return base_ + at;
  }
  void give(void* p, FencePtr fence) {
    const size_t at = static_cast<size_t>(static_cast<char*>(p) - base_);
    auto u = used_.find(at);
    if (u == used_.end()) return;
    size_t start = at, len = u->second.len;
    used_.erase(u);
    auto later = [](const FencePtr& a, const FencePtr& b) { return !a ? b : !b ? a : a->seq > b->seq ? a : b; };
    auto next = free_.lower_bound(at);
    if (next != free_.end() && next->first == at + len) {
      len += next->second.len;
      fence = later(fence, next->second.fence);
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second.len == start) {
        start = prev->first;
        len += prev->second.len;
        fence = later(fence, prev->second.fence);
        free_.erase(prev);
      }
    }
    free_[start] = {len, fence};
  }
  // The fence of the allocated block holding `p` (null: never used since the slab was made).
  FencePtr fence_of(const void* p) const {
    const size_t at = static_cast<size_t>(static_cast<const char*>(p) - base_);
    auto it = used_.upper_bound(at);
    if (it == used_.begin()) return nullptr;
    --it;
    return at < it->first + it->second.len ? it->second.fence : nullptr;
  }
  size_t largest_free() const {
    size_t m = 0;
    for (const auto& [at, b] : free_) m = std::max(m, b.len);
    return m;
  }

 private:
  struct Block {
    size_t len = 0;
    FencePtr fence;
  };
  char* base_;
  std::map<size_t, Block> free_;  // offset -> block
  std::map<size_t, Block> used_;
};

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
  mutable std::mutex mu_;
  MemoryStats stats_;
  size_t slab_bytes_ = 0;
  char* slab_ = nullptr;
  EventPool events_;  // before arena_: the arena's fences give their events back to it
  std::unique_ptr<Arena> arena_;
  cudaStream_t compute_ = nullptr, h2d_ = nullptr, d2h_ = nullptr;
  cudaEvent_t compute_done_ = nullptr, copy_done_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_ws_ = nullptr;
  int* err_ = nullptr;            // device int[3]: flag, index, value
  int* err_host_ = nullptr;       // pinned int[3 * kErrorSlots]
  double* partial_ = nullptr;     // device double[kSumSquaresBlocks + 1]
  double* total_host_ = nullptr;  // pinned double
  uint64_t frees_ = 0;            // fences handed out (their order)
};

CudaDevice::CudaDevice(size_t capacity, int ordinal, AttentionKernel attention)
    : ordinal_(ordinal), attention_(attention) {
  FERRY_CUDA_CHECK(cudaSetDevice(ordinal));
  cudaDeviceProp prop{};
  FERRY_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
  name_ = "cuda:" + std::to_string(ordinal) + " (" + prop.name + ", sm_" +
          std::to_string(prop.major) + std::to_string(prop.minor) + ", cap " +
          format_bytes(capacity) + ")";
  stats_.capacity = capacity;
  // Room for rounding every block up to 256 bytes: the budget counts the bytes asked for.
  slab_bytes_ = capacity + capacity / 64 + (4u << 20);
  // Refused now, before anything is allocated, when the budget cannot fit; checked again
  // when the slab is carved (carve_slab).
  size_t free_bytes = 0, total = 0;
  FERRY_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  if (const std::string p = fits(slab_bytes_, free_bytes, kReserve, "when the device was made");
      !p.empty())
    throw std::runtime_error(p);
  // The default pool keeps what it has mapped (F14 of the GPU review): with the default
  // threshold 0 it gives its memory back at every synchronisation, and the next
  // cudaMallocAsync maps it again. What it keeps is counted in kReserve.
  cudaMemPool_t pool = nullptr;
  FERRY_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, ordinal));
  uint64_t keep_all = UINT64_MAX;
  FERRY_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&h2d_, cudaStreamNonBlocking));
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&d2h_, cudaStreamNonBlocking));
  FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
  FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&copy_done_, cudaEventDisableTiming));
  FERRY_CUBLAS_CHECK(cublasCreate(&cublas_));
  FERRY_CUBLAS_CHECK(cublasSetStream(cublas_, compute_));
  // Plain fp32 GEMMs stay fp32 (no TF32): they are the reference the CPU device is checked
  // against at 1e-5. bf16 GEMMs use tensor cores with fp32 accumulation either way, and
  // split-K partials are summed in fp32 too (cuBLAS may otherwise reduce them in the bf16
  // or f16 output type, rounding an output several times instead of once).
  FERRY_CUBLAS_CHECK(cublasSetMathMode(
      cublas_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                         CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  FERRY_CUDA_CHECK(cudaMalloc(&cublas_ws_, kCublasWorkspace));
  FERRY_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_ws_, kCublasWorkspace));
  FERRY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&err_), kErrorBytes));
  // On the compute stream: the legacy stream's cudaMemset is not ordered before the
  // non-blocking compute stream's kernels.
  FERRY_CUDA_CHECK(cudaMemsetAsync(err_, 0, kErrorBytes, compute_));
  FERRY_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&err_host_), kErrorBytes));
  FERRY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&partial_),
                              (cuda::kSumSquaresBlocks + 1) * sizeof(double)));
  FERRY_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&total_host_), sizeof(double)));
}

std::string CudaDevice::fits(size_t slab, size_t free, size_t reserve, const char* when) const {
  if (slab <= free && free - slab >= reserve) return "";
  const size_t room = slab - stats_.capacity;  // the slab's rounding room
  const size_t most = free > reserve + room ? free - reserve - room : 0;
  return "key 'device.memory': " + format_bytes(stats_.capacity) + " does not fit on " + name_ +
         ": " + format_bytes(free) + " of GPU memory free " +
         when + ", and ferry keeps " + format_bytes(reserve) +
         " free outside the budget (cuBLAS's workspace, the stream-ordered pool, kernel images "
         "and NCCL's late allocations) plus " +
         format_bytes(room) + " of rounding room: set device.memory to at most " +
         format_bytes(most);
}

void CudaDevice::carve_slab() {
  size_t free_bytes = 0, total = 0;
  FERRY_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  // cuBLAS's workspace is allocated by now: the rest of the reserve must still be free.
  if (const std::string p = fits(slab_bytes_, free_bytes, kReserve - kCublasWorkspace,
                                 "when its slab was carved (after NCCL started)");
      !p.empty())
    throw std::runtime_error(p);
  FERRY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&slab_), slab_bytes_));
  arena_ = std::make_unique<Arena>(slab_, slab_bytes_);
}

void CudaDevice::debug_sync(const char* what) {
  if (!sync_each_op()) return;
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA error ") + cudaGetErrorName(e) + " (" +
                             cudaGetErrorString(e) + ") surfaced right after " + what + " on " +
                             name_ + " (FERRY_CUDA_SYNC=1)");
  }
}

CudaDevice::~CudaDevice() {
  // Errors here cannot be reported usefully (the process may be unwinding one already).
  cudaStreamSynchronize(compute_);
  cudaStreamSynchronize(h2d_);
  cudaStreamSynchronize(d2h_);
  cublasDestroy(cublas_);
  cudaFree(cublas_ws_);
  cudaFree(err_);
  cudaFreeHost(err_host_);
  cudaFree(partial_);
  cudaFreeHost(total_host_);
  cudaEventDestroy(compute_done_);
  cudaEventDestroy(copy_done_);
  cudaStreamDestroy(compute_);
  cudaStreamDestroy(h2d_);
  cudaStreamDestroy(d2h_);
  if (slab_) cudaFree(slab_);
}

void* CudaDevice::allocate(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > stats_.capacity - stats_.in_use) {
    throw OutOfDeviceMemory("the cuda device", bytes, stats_.in_use, stats_.capacity);
  }
  if (!arena_) carve_slab();
  void* p = arena_->take(round_up(bytes, kBlockAlign));
  if (!p) {
    // Within the budget but no free block is large enough: the slab is fragmented.
    throw OutOfDeviceMemory("the cuda device (fragmented: largest free block " +
                                format_bytes(arena_->largest_free()) + ")",
                            bytes, stats_.in_use, stats_.capacity);
  }
  stats_.in_use += bytes;
  stats_.peak = std::max(stats_.peak, stats_.in_use);
  return p;
}

// Safe without waiting: the block can be reused only by work issued later, which runs
// after the queued work on the compute stream, and the copy streams wait for that stream
// (copy_into_new: for the fence recorded here). The event is recorded and numbered under
// one lock, so when frees come from several threads the larger number is always the later
// point on the stream (a coalesced block keeps the larger). A thread whose current GPU is
// another one is switched to this device's first: events belong to the device current
// when they are made and recorded. A fence that cannot be made degrades to waiting for
// the stream here and now.
void CudaDevice::deallocate(void* ptr, size_t bytes) noexcept {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != ordinal_) cudaSetDevice(ordinal_);
  auto fence = std::make_shared<Fence>();
  fence->pool = &events_;
  std::lock_guard<std::mutex> lock(mu_);
  fence->event = events_.get();
  if (!fence->event || cudaEventRecord(fence->event, compute_) != cudaSuccess) {
    cudaGetLastError();  // cleared: the next launch check must not report it as its own
    cudaStreamSynchronize(compute_);
    fence = nullptr;  // gives the event back
  } else {
    fence->seq = ++frees_;
  }
  if (arena_) arena_->give(ptr, std::move(fence));
  stats_.in_use -= bytes;
}

MemoryStats CudaDevice::memory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CudaDevice::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak = stats_.in_use;
}

void CudaDevice::after_compute(cudaStream_t s) {
  FERRY_CUDA_CHECK(cudaEventRecord(compute_done_, compute_));
  FERRY_CUDA_CHECK(cudaStreamWaitEvent(s, compute_done_, 0));
}

void CudaDevice::copy_from_host(const Tensor& dst, const void* src) {
  FERRY_CUDA_CHECK(cudaEventRecord(compute_done_, compute_));
  upload_on(dst, src, compute_done_, /*hold_src=*/false);
  debug_sync("copy_from_host");
}

// Waits only for the last use of dst's block before it was freed, so the copy overlaps
// the queued kernels that do not touch it (StagedUnits' next unit, the next batch), and
// the host does not wait for that fence: a pageable source has been staged by the runtime
// when cudaMemcpyAsync returns; a page-locked one is read when the copy runs, which the
// header's contract covers (the caller keeps it until the device is next waited for).
void CudaDevice::copy_into_new(const Tensor& dst, const void* src) {
  FencePtr fence;
  upload_on(dst, src, pending_fence(dst, fence), /*hold_src=*/true);
  debug_sync("copy_into_new");
}

cudaEvent_t CudaDevice::pending_fence(const Tensor& dst, FencePtr& keep) {
  std::lock_guard<std::mutex> lock(mu_);
  keep = arena_ ? arena_->fence_of(dst.data()) : nullptr;
  if (keep && keep->done) keep = nullptr;  // fired already: nothing to wait for
  return keep ? keep->event : nullptr;
}

namespace {

// An upload's or download's completion: an event recorded after the copy on its stream.
class CudaTransfer final : public Transfer {
 public:
  using Event = std::shared_ptr<std::remove_pointer_t<cudaEvent_t>>;
  CudaTransfer(Event begin, Event event, const char* what)
      : begin_(std::move(begin)), event_(std::move(event)), what_(what) {}
  Span span() const override { return {begin_, event_}; }
  bool done() override {
    if (done_) return true;
    const cudaError_t q = cudaEventQuery(event_.get());
    if (q == cudaErrorNotReady) return false;
    if (q != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error(std::string("cuda device: ") + what_ + " failed: " + cudaGetErrorString(q));
    }
    return done_ = true;
  }
  void wait() override {
    if (done_) return;
    const cudaError_t e = cudaEventSynchronize(event_.get());
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error(std::string("cuda device: ") + what_ + " failed: " + cudaGetErrorString(e));
    }
    done_ = true;
  }

 private:
  Event begin_, event_;  // timing events around the copy on its stream
  const char* what_;
  bool done_ = false;
};

}  // namespace

// Like copy_into_new, but the host never waits (not even to stage a pageable source: the
// caller keeps `src` unchanged until done()), and the caller gets the completion.
TransferPtr CudaDevice::upload(const Tensor& dst, const void* src) {
  FencePtr fence;
  if (cudaEvent_t wait = pending_fence(dst, fence)) FERRY_CUDA_CHECK(cudaStreamWaitEvent(h2d_, wait, 0));
  auto begin = marks_->take();
  FERRY_CUDA_CHECK(cudaEventRecord(begin.get(), h2d_));
  FERRY_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src, dst.nbytes(), cudaMemcpyHostToDevice, h2d_));
  to_device_ += dst.nbytes();
  auto done = marks_->take();
  FERRY_CUDA_CHECK(cudaEventRecord(done.get(), h2d_));
  FERRY_CUDA_CHECK(cudaStreamWaitEvent(compute_, done.get(), 0));
  debug_sync("upload");
  return std::make_shared<CudaTransfer>(std::move(begin), std::move(done), "upload");
}

// On the device-to-host stream after `after` (a collective's completion event) or after
// the compute work issued so far.
TransferPtr CudaDevice::download(void* dst, const Tensor& src, const std::shared_ptr<void>& after) {
  if (after) {
    FERRY_CUDA_CHECK(cudaStreamWaitEvent(d2h_, static_cast<cudaEvent_t>(after.get()), 0));
  } else {
    after_compute(d2h_);
  }
  auto begin = marks_->take();
  FERRY_CUDA_CHECK(cudaEventRecord(begin.get(), d2h_));
  FERRY_CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), src.nbytes(), cudaMemcpyDeviceToHost, d2h_));
  to_host_ += src.nbytes();
  auto done = marks_->take();
  FERRY_CUDA_CHECK(cudaEventRecord(done.get(), d2h_));
  debug_sync("download");
  return std::make_shared<CudaTransfer>(std::move(begin), std::move(done), "download");
}

void CudaDevice::upload_on(const Tensor& dst, const void* src, cudaEvent_t wait, bool hold_src) {
  if (wait) FERRY_CUDA_CHECK(cudaStreamWaitEvent(h2d_, wait, 0));
  FERRY_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src, dst.nbytes(), cudaMemcpyHostToDevice, h2d_));
  to_device_ += dst.nbytes();
  FERRY_CUDA_CHECK(cudaEventRecord(copy_done_, h2d_));
  FERRY_CUDA_CHECK(cudaStreamWaitEvent(compute_, copy_done_, 0));
  if (hold_src) return;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, src) != cudaSuccess) {
    cudaGetLastError();
    a.type = cudaMemoryTypeHost;  // unknown: wait, the safe side
  }
  // The caller may reuse `src` once this returns.
  if (a.type == cudaMemoryTypeHost) FERRY_CUDA_CHECK(cudaEventSynchronize(copy_done_));
}

void CudaDevice::copy_to_host(void* dst, const Tensor& src) {
  after_compute(d2h_);
  FERRY_CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), src.nbytes(), cudaMemcpyDeviceToHost, d2h_));
  to_host_ += src.nbytes();
  FERRY_CUDA_CHECK(cudaStreamSynchronize(d2h_));
  debug_sync("copy_to_host");
  check_errors();  // a value read back after a flagged op must not hide its error
}

void CudaDevice::copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() != src.dtype() || dst.numel() != src.numel()) {
    fail(kDev, "copy", dst.describe() + " <- " + src.describe());
  }
  FERRY_CUDA_CHECK(
      cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToDevice, compute_));
  debug_sync("copy");
}

void CudaDevice::cast(const Tensor& dst, const Tensor& src) {
  if (dst.numel() != src.numel()) fail(kDev, "cast", dst.describe() + " <- " + src.describe());
  if (dst.dtype() == src.dtype()) return copy(dst, src);
  cuda::cast(st(), arr(dst), arr(src), src.numel());
}

void CudaDevice::fill(const Tensor& dst, double value) {
  cuda::fill(st(), arr(dst), value, dst.numel());
}

void CudaDevice::synchronize() {
  FERRY_CUDA_CHECK(cudaStreamSynchronize(compute_));
  FERRY_CUDA_CHECK(cudaStreamSynchronize(h2d_));
  FERRY_CUDA_CHECK(cudaStreamSynchronize(d2h_));
  check_errors();
}

// One read of every slot, only when a flagging op ran since the last: the step loop pays
// it at the host read it makes anyway (the loss), not after every op (review F7).
void CudaDevice::check_errors() {
  if (!flags_pending_.exchange(false)) return;
  FERRY_CUDA_CHECK(cudaMemcpyAsync(err_host_, err_, kErrorBytes, cudaMemcpyDeviceToHost, compute_));
  to_host_ += kErrorBytes;
  FERRY_CUDA_CHECK(cudaStreamSynchronize(compute_));
  for (int slot = 0; slot < kErrorSlots; ++slot) {
    const int* e = err_host_ + 3 * slot;
    if (e[0] == 0) continue;
    const int index = e[1], value = e[2];
    const std::string range = std::to_string(flag_limit_[slot]);
    FERRY_CUDA_CHECK(cudaMemsetAsync(err_, 0, kErrorBytes, compute_));
    if (slot == kTokenSlot) {
      throw std::out_of_range("embedding_forward: token " + std::to_string(value) + " at position " +
                              std::to_string(index) + " is outside the vocabulary [0, " + range + ")");
    }
    throw std::out_of_range("softmax_cross_entropy: target " + std::to_string(value) + " at row " +
                            std::to_string(index) + " is outside [0, " + range + ")");
  }
}

Arr CudaDevice::widen(const Tensor& t, Scratch& keep) {
  keep = Scratch(*this, static_cast<size_t>(t.numel()) * 4);
  const Arr w{keep.get(), DType::f32};
  cuda::cast(st(), w, arr(t), t.numel());
  return w;
}

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f64:
      return CUDA_R_64F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    case DType::i32:
      break;
  }
  throw std::invalid_argument("cuda.gemm: i32 is not a GEMM type");
}

}  // namespace

// cuBLAS is column-major: row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T,
// so B goes first and the leading dimensions are the row-major row lengths.
// Operand types cuBLAS takes directly: A and B of one type, C of that type, or f32 C for
// bf16/f16 A and B (weight gradients from bf16 activations). Anything else is widened to
// f32 scratch, computed, and rounded back once.
void CudaDevice::gemm(const Tensor& c, const Tensor& a, bool ta, const Tensor& b, bool tb,
                      double alpha, double beta) {
  const auto [M, N, K] = checks::gemm(kDev, c, a, ta, b, tb);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    // cuBLAS refuses lda or ldb of 0; the product is empty, so C = beta C (C unread at 0).
    if (beta == 0) {
      fill(c, 0.0);
    } else if (beta != 1) {
      scale(c, beta);
    }
    return;
  }
  const bool any_f64 =
      a.dtype() == DType::f64 || b.dtype() == DType::f64 || c.dtype() == DType::f64;
  const bool all_f64 =
      a.dtype() == DType::f64 && b.dtype() == DType::f64 && c.dtype() == DType::f64;
  if (any_f64 && !all_f64) {
    fail(kDev, "gemm",
         "f64 does not mix: c " + c.describe() + ", a " + a.describe() + ", b " + b.describe());
  }
  Scratch wa, wb, wc;
  Arr A = arr(a), B = arr(b), Cm = arr(c);
  if (A.dtype != B.dtype) {
    if (A.dtype != DType::f32) A = widen(a, wa);
    if (B.dtype != DType::f32) B = widen(b, wb);
  }
  const bool direct = Cm.dtype == A.dtype || (is_low_precision(A.dtype) && Cm.dtype == DType::f32);
  if (!direct) {
    wc = Scratch(*this, static_cast<size_t>(c.numel()) * 4);
    Cm = {wc.get(), DType::f32};
    if (beta != 0) cuda::cast(st(), Cm, arr(c), c.numel());
  }
  const int lda = static_cast<int>(ta ? M : K), ldb = static_cast<int>(tb ? K : N),
            ldc = static_cast<int>(N);
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                          opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (all_f64) {
    FERRY_CUBLAS_CHECK(cublasGemmEx(cublas_, opb, opa, static_cast<int>(N), static_cast<int>(M),
                                    static_cast<int>(K), &alpha, B.p, CUDA_R_64F, ldb, A.p,
                                    CUDA_R_64F, lda, &beta, Cm.p, CUDA_R_64F, ldc,
                                    CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT));
  } else {
    const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
    FERRY_CUBLAS_CHECK(cublasGemmEx(
        cublas_, opb, opa, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha_f,
        B.p, cuda_type(B.dtype), ldb, A.p, cuda_type(A.dtype), lda, &beta_f, Cm.p,
        cuda_type(Cm.dtype), ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  if (!direct) cuda::cast(st(), arr(c), Cm, c.numel());
  debug_sync("gemm (cublasGemmEx)");
}

void CudaDevice::add_bias(const Tensor& out, const Tensor& bias) {
  if (bias.numel() != out.dim(-1)) fail(kDev, "add_bias", out.describe() + " + " + bias.describe());
  cuda::add_bias(st(), arr(out), arr(bias), rows_of(out), out.dim(-1));
}

void CudaDevice::bias_backward(const Tensor& dbias, const Tensor& dout) {
  if (dbias.numel() != dout.dim(-1))
    fail(kDev, "bias_backward", dbias.describe() + " from " + dout.describe());
  cuda::column_sums(st(), arr(dbias), arr(dout), rows_of(dout), dout.dim(-1));
}

void CudaDevice::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  checks::same_shape(kDev, "add", out, a);
  checks::same_shape(kDev, "add", out, b);
  cuda::add(st(), arr(out), arr(a), arr(b), out.numel());
}

void CudaDevice::accumulate(const Tensor& dst, const Tensor& src) {
  checks::same_shape(kDev, "accumulate", dst, src);
  cuda::accumulate(st(), arr(dst), arr(src), dst.numel());
}

DeviceClock::Mark CudaDevice::mark() {
  auto e = marks_->take();
  FERRY_CUDA_CHECK(cudaEventRecord(e.get(), compute_));
  return e;
}

DeviceClock::Mark CudaDevice::passed_mark() {
  DeviceClock::Mark m = mark();
  FERRY_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(m.get())));
  return m;
}

double CudaDevice::seconds_between(const DeviceClock::Mark& a, const DeviceClock::Mark& b) {
  float ms = 0;
  const cudaError_t e =
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a.get()), static_cast<cudaEvent_t>(b.get()));
  if (e != cudaSuccess) {
    cudaGetLastError();  // not passed yet (cudaErrorNotReady): asked again later
    return std::nan("");
  }
  return ms / 1e3;
}

void CudaDevice::sum_squares_to(const Tensor& x, const Tensor& out) {
  if (out.dtype() != DType::f64 || out.numel() != 1) fail(kDev, "sum_squares_to", "out " + out.describe());
  cuda::sum_squares(st(), arr(x), x.numel(), partial_);
  FERRY_CUDA_CHECK(cudaMemcpyAsync(out.data(), partial_ + cuda::kSumSquaresBlocks, sizeof(double),
                                   cudaMemcpyDeviceToDevice, compute_));
  debug_sync("sum_squares_to");
}

double CudaDevice::sum_squares(const Tensor& x) {
  cuda::sum_squares(st(), arr(x), x.numel(), partial_);
  FERRY_CUDA_CHECK(cudaMemcpyAsync(total_host_, partial_ + cuda::kSumSquaresBlocks, sizeof(double),
                                   cudaMemcpyDeviceToHost, compute_));
  to_host_ += sizeof(double);
  FERRY_CUDA_CHECK(cudaStreamSynchronize(compute_));
  return *total_host_;
}

void CudaDevice::scale(const Tensor& x, double factor) {
  cuda::scale(st(), arr(x), factor, x.numel());
}

void CudaDevice::embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                   const Tensor& wpe, int64_t T) {
  const int64_t N = tokens.numel(), C = wte.dim(1), V = wte.dim(0);
  if (tokens.dtype() != DType::i32 || out.numel() != N * C || wpe.dim(1) != C || wpe.dim(0) < T ||
      N % T != 0) {
    fail(kDev, "embedding_forward",
         "out " + out.describe() + ", tokens " + tokens.describe() + ", wte " + wte.describe() +
             ", wpe " + wpe.describe() + ", T " + std::to_string(T));
  }
  cuda::embedding_forward(st(), arr(out), tokens.data_as<int32_t>(), arr(wte), arr(wpe), N, T, C, V,
                          err_ + 3 * kTokenSlot);
  flag_limit_[kTokenSlot] = V;
  flags_pending_ = true;
}

void CudaDevice::embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                    const Tensor& tokens, int64_t T) {
  const int64_t N = tokens.numel(), C = dwte.dim(1);
  if (tokens.dtype() != DType::i32 || dout.numel() != N * C || dwpe.dim(1) != C ||
      dwpe.dim(0) < T || N % T != 0) {
    fail(kDev, "embedding_backward", "dout " + dout.describe() + ", dwte " + dwte.describe());
  }
  // A low-precision dwte would be rounded after every row's addition: widened instead, so
  // the sum is rounded once (the CPU device's rule).
  Scratch keep;
  const Arr wte = is_low_precision(dwte.dtype()) ? widen(dwte, keep) : arr(dwte);
  cuda::embedding_backward(st(), wte, arr(dwpe), arr(dout), tokens.data_as<int32_t>(), N, T, C);
  if (wte.p != dwte.data()) cuda::cast(st(), arr(dwte), wte, dwte.numel());
}

void CudaDevice::layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  checks::same_shape(kDev, "layernorm_forward", out, inp);
  const int64_t C = inp.dim(-1), N = rows_of(inp);
  if (weight.numel() != C || bias.numel() != C || mean.numel() != N || rstd.numel() != N) {
    fail(kDev, "layernorm_forward",
         "inp " + inp.describe() + ", weight " + weight.describe() + ", mean " + mean.describe());
  }
  cuda::layernorm_forward(st(), arr(out), arr(mean), arr(rstd), arr(inp), arr(weight), arr(bias), N,
                          C);
}

void CudaDevice::layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                    const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                    const Tensor& mean, const Tensor& rstd) {
  checks::same_shape(kDev, "layernorm_backward", dinp, inp);
  checks::same_shape(kDev, "layernorm_backward", dout, inp);
  const int64_t C = inp.dim(-1), N = rows_of(inp);
  if (dweight.numel() != C || dbias.numel() != C || weight.numel() != C || mean.numel() != N ||
      rstd.numel() != N) {
    fail(kDev, "layernorm_backward", "inp " + inp.describe() + ", dweight " + dweight.describe());
  }
  cuda::layernorm_backward(st(), arr(dinp), arr(dweight), arr(dbias), arr(dout), arr(inp),
                           arr(weight), arr(mean), arr(rstd), N, C);
}

void CudaDevice::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                   int64_t n_head, int64_t n_kv_head, const Tensor& doc_start) {
  const int64_t kv = n_kv_head > 0 ? n_kv_head : n_head;
  const int64_t C = checks::attention(kDev, "attention_forward", out, lse, qkv, n_head, kv);
  checks::doc_start(kDev, "attention_forward", doc_start, qkv);
  cuda::attention_forward(st(), arr(out), arr(lse), arr(qkv), qkv.dim(0), qkv.dim(1), C, n_head,
                          kv, doc_start.defined() ? doc_start.data_as<int32_t>() : nullptr, attention_);
}

void CudaDevice::attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                    const Tensor& out, const Tensor& lse, int64_t n_head,
                                    int64_t n_kv_head, const Tensor& doc_start) {
  const int64_t kv = n_kv_head > 0 ? n_kv_head : n_head;
  const int64_t C = checks::attention(kDev, "attention_backward", dout, lse, qkv, n_head, kv);
  checks::same_shape(kDev, "attention_backward", dqkv, qkv);
  checks::same_shape(kDev, "attention_backward", out, dout);
  checks::doc_start(kDev, "attention_backward", doc_start, qkv);
  const bool f64 = dqkv.dtype() == DType::f64 || dout.dtype() == DType::f64 ||
                   qkv.dtype() == DType::f64 || out.dtype() == DType::f64 || lse.dtype() == DType::f64;
  const int64_t rows = qkv.dim(0) * n_head * qkv.dim(1);
  Scratch rowdot(*this, static_cast<size_t>(rows) * (f64 ? 8 : 4));
  cuda::attention_backward(st(), arr(dqkv), arr(dout), arr(qkv), arr(out), arr(lse), qkv.dim(0),
                           qkv.dim(1), C, n_head, kv,
                           doc_start.defined() ? doc_start.data_as<int32_t>() : nullptr, rowdot.get(),
                           attention_);
}

void CudaDevice::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp,
                                 const Tensor& weight, double eps) {
  checks::same_shape(kDev, "rmsnorm_forward", out, inp);
  const int64_t C = inp.dim(-1), N = rows_of(inp);
  if (weight.numel() != C || rstd.numel() != N) {
    fail(kDev, "rmsnorm_forward",
         "inp " + inp.describe() + ", weight " + weight.describe() + ", rstd " + rstd.describe());
  }
  cuda::rmsnorm_forward(st(), arr(out), arr(rstd), arr(inp), arr(weight), N, C, eps);
}

void CudaDevice::rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout,
                                  const Tensor& inp, const Tensor& weight, const Tensor& rstd) {
  checks::same_shape(kDev, "rmsnorm_backward", dinp, inp);
  checks::same_shape(kDev, "rmsnorm_backward", dout, inp);
  const int64_t C = inp.dim(-1), N = rows_of(inp);
  if (dweight.numel() != C || weight.numel() != C || rstd.numel() != N) {
    fail(kDev, "rmsnorm_backward",
         "inp " + inp.describe() + ", dweight " + dweight.describe() + ", rstd " + rstd.describe());
  }
  cuda::rmsnorm_backward(st(), arr(dinp), arr(dweight), arr(dout), arr(inp), arr(weight), arr(rstd),
                         N, C);
}

void CudaDevice::swiglu_forward(const Tensor& out, const Tensor& gate_up) {
  const int64_t H = out.dim(-1), N = rows_of(out);
  if (gate_up.numel() != 2 * N * H || gate_up.dim(-1) != 2 * H) {
    fail(kDev, "swiglu_forward",
         "out " + out.describe() + ", gate_up " + gate_up.describe() + " (must be [N, 2H])");
  }
  cuda::swiglu_forward(st(), arr(out), arr(gate_up), N, H);
}

void CudaDevice::swiglu_backward(const Tensor& dgate_up, const Tensor& gate_up,
                                 const Tensor& dout) {
  checks::same_shape(kDev, "swiglu_backward", dgate_up, gate_up);
  const int64_t H = dout.dim(-1), N = rows_of(dout);
  if (gate_up.numel() != 2 * N * H || gate_up.dim(-1) != 2 * H) {
    fail(kDev, "swiglu_backward",
         "dout " + dout.describe() + ", gate_up " + gate_up.describe() + " (must be [N, 2H])");
  }
  cuda::swiglu_backward(st(), arr(dgate_up), arr(gate_up), arr(dout), N, H);
}

void CudaDevice::rope_forward(const Tensor& out, const Tensor& inp, int64_t T, int64_t heads,
                              int64_t head_dim, const Rope& rope) {
  checks::rope(kDev, "rope_forward", out, inp, T, heads, head_dim);
  cuda::rope(st(), arr(out), arr(inp), rows_of(inp), T, heads, head_dim, inp.dim(-1), rope, false,
             false);
}

void CudaDevice::rope_backward(const Tensor& dinp, const Tensor& dout, int64_t T, int64_t heads,
                               int64_t head_dim, const Rope& rope) {
  checks::rope(kDev, "rope_backward", dinp, dout, T, heads, head_dim);
  cuda::rope(st(), arr(dinp), arr(dout), rows_of(dout), T, heads, head_dim, dout.dim(-1), rope,
             true, true);
}

void CudaDevice::gelu_forward(const Tensor& out, const Tensor& inp) {
  checks::same_shape(kDev, "gelu_forward", out, inp);
  cuda::gelu_forward(st(), arr(out), arr(inp), inp.numel());
}

void CudaDevice::gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  checks::same_shape(kDev, "gelu_backward", dinp, inp);
  checks::same_shape(kDev, "gelu_backward", dout, inp);
  cuda::gelu_backward(st(), arr(dinp), arr(inp), arr(dout), inp.numel());
}

void CudaDevice::softmax_cross_entropy_forward(const Tensor& losses, const Tensor& probs,
                                               const Tensor& logits, const Tensor& targets) {
  checks::same_shape(kDev, "softmax_cross_entropy_forward", probs, logits);
  const int64_t V = logits.dim(-1), N = rows_of(logits);
  if (targets.dtype() != DType::i32 || targets.numel() != N || losses.numel() != N) {
    fail(kDev, "softmax_cross_entropy_forward",
         "logits " + logits.describe() + ", targets " + targets.describe() + ", losses " +
             losses.describe());
  }
  cuda::softmax_cross_entropy_forward(st(), arr(losses), arr(probs), arr(logits),
                                      targets.data_as<int32_t>(), N, V, err_ + 3 * kTargetSlot);
  flag_limit_[kTargetSlot] = V;
  flags_pending_ = true;
}

void CudaDevice::softmax_cross_entropy_backward(const Tensor& dlogits, const Tensor& probs,
                                                const Tensor& targets, double dloss) {
  checks::same_shape(kDev, "softmax_cross_entropy_backward", dlogits, probs);
  const int64_t V = probs.dim(-1), N = rows_of(probs);
  if (targets.dtype() != DType::i32 || targets.numel() != N) {
    fail(kDev, "softmax_cross_entropy_backward", targets.describe());
  }
  cuda::softmax_cross_entropy_backward(st(), arr(dlogits), arr(probs), targets.data_as<int32_t>(),
                                       N, V, dloss);
}

void CudaDevice::adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                       const AdamWStep& step) {
  for (const Tensor* t : {&param, &grad, &m, &v}) {
    if (t->dtype() != DType::f32 || t->numel() != param.numel()) {
      fail(kDev, "adamw",
           "f32 tensors of one numel: param " + param.describe() + ", got " + t->describe());
    }
  }
  if (step.step < 1) fail(kDev, "adamw", "step must be >= 1, got " + std::to_string(step.step));
  cuda::adamw(st(), param.data_as<float>(), grad.data_as<float>(), m.data_as<float>(),
              v.data_as<float>(), param.numel(), adamw_constants(step));
}

}  // namespace

FERRY_CUDA_ABI_BEGIN

CudaStatus cuda_status() {
  CudaStatus s;
  s.built = true;
  const cudaError_t e = cudaGetDeviceCount(&s.gpus);
  if (e != cudaSuccess) {
    s.gpus = 0;
    s.reason = std::string("no usable GPU: cudaGetDeviceCount says ") + cudaGetErrorString(e);
    cudaGetLastError();  // clear it: later calls must not inherit this error
  } else if (s.gpus == 0) {
    s.reason = "no GPU: the CUDA runtime sees 0 devices";
  }
  return s;
}

std::unique_ptr<Device> make_cuda_device(size_t capacity_bytes, int ordinal, AttentionKernel attention) {
  const CudaStatus s = cuda_status();
  if (!s.available()) throw std::runtime_error("the cuda device is unavailable: " + s.reason);
  if (ordinal < 0 || ordinal >= s.gpus) {
    throw std::runtime_error("the cuda device: GPU " + std::to_string(ordinal) +
                             " does not exist (" + std::to_string(s.gpus) + " visible)");
  }
  return std::make_unique<CudaDevice>(capacity_bytes, ordinal, attention);
}

void* cuda_compute_stream(Device& device) {
  auto* d = dynamic_cast<CudaDevice*>(&device);
  if (!d)
    throw std::invalid_argument("cuda_compute_stream: " + device.name() + " is not a cuda device");
  return d->compute_stream();
}

namespace {
CudaDevice& cuda_device_of(Device& device, const char* what) {
  auto* d = dynamic_cast<CudaDevice*>(&device);
  if (!d) throw std::invalid_argument(std::string(what) + ": " + device.name() + " is not a cuda device");
  return *d;
}
}  // namespace

size_t cuda_budget_that_fits(int ordinal) {
  if (const CudaStatus st = cuda_status(); !st.available()) throw std::runtime_error(st.reason);
  FERRY_CUDA_CHECK(cudaSetDevice(ordinal));
  size_t free_bytes = 0, total = 0;
  FERRY_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  constexpr size_t kRounding = 4u << 20;  // the slab's fixed room (CudaDevice's constructor)
  // What a device takes as it starts, before its slab is carved (cuBLAS's handle and
  // workspace, the error words, the first kernels' images): measured at about 150 MiB on
  // an H100; 1 GiB leaves a margin for other GPUs and drivers.
  constexpr size_t kStartup = 1ull << 30;
  if (free_bytes <= kReserve + kRounding + kStartup) return 0;
  // capacity + capacity / 64 + kRounding <= free - kReserve - kStartup
  return (free_bytes - kReserve - kRounding - kStartup) / 65 * 64;
}

std::string cuda_pci_bus_id(Device& device) {
  CudaDevice& d = cuda_device_of(device, "cuda_pci_bus_id");
  char id[32] = {};
  FERRY_CUDA_CHECK(cudaDeviceGetPCIBusId(id, sizeof id, d.ordinal()));
  return id;
}

std::string cuda_attention_kernel(Device& device, DType act, int64_t head_size, std::string* why) {
  CudaDevice& d = cuda_device_of(device, "cuda_attention_kernel");
  FERRY_CUDA_CHECK(cudaSetDevice(d.ordinal()));
  const char* obstacle = cuda::tensor_core_attention_obstacle(act, DType::f32, head_size);
  if (why != nullptr) *why = obstacle != nullptr ? std::string("tensor cores need ") + obstacle : "";
  const bool tc = obstacle == nullptr && d.attention_kernel() != AttentionKernel::simt;
  return std::string(attention_kernel_name(tc ? AttentionKernel::tensor_cores : AttentionKernel::simt));
}

std::string cuda_register_host(Device& device, void* ptr, size_t bytes) {
  CudaDevice& d = cuda_device_of(device, "cuda_register_host");
  // The calling thread's current GPU decides where the registration's mappings go.
  cudaError_t e = cudaSetDevice(d.ordinal());
  if (e == cudaSuccess) e = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
  if (e == cudaSuccess) return "";
  cudaGetLastError();  // not left for the next launch check to misreport
  return std::string("cudaHostRegister of ") + std::to_string(bytes) + " bytes failed: " +
         cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

void cuda_unregister_host(Device& device, void* ptr) noexcept {
  auto* d = dynamic_cast<CudaDevice*>(&device);
  if (!d || cudaSetDevice(d->ordinal()) != cudaSuccess || cudaHostUnregister(ptr) != cudaSuccess)
    cudaGetLastError();
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn
