// The cuda device's memory: the budget against the GPU's free memory, the slab carved at
// the first allocation, allocate/deallocate through the arena with fences, and the
// streams, cuBLAS handle and flag words made with the device (nn/cuda_device.h, "Memory").
#include "nn/cuda/device_impl.h"

#include <stdexcept>

namespace ferry::nn::cuda_dev {
FERRY_CUDA_ABI_BEGIN

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
  FERRY_CUBLAS_CHECK(cublasLtCreate(&lt_));
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
  cublasLtDestroy(lt_);
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

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda_dev
