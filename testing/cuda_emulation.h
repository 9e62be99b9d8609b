// A CPU emulation of the CUDA runtime and cuBLAS calls the cuda device makes, for tests on
// machines without a GPU (FERRY_CUDA_EMULATION; never part of ferry's libraries).
//
// It lets tests compile nn/cuda_kernels.cu and nn/cuda_device.cpp unchanged with g++ and
// run them: each kernel launch runs its blocks one after another, each block's threads as
// fibers that meet at barriers for __syncthreads and per warp of 32 for
// __shfl_down_sync, with __shared__ arrays shared by the block's threads (static, as
// blocks do not overlap). So the index arithmetic, the shared-memory use, the reductions
// and their barriers, the row-major <-> column-major GEMM mapping, the widening, the
// flags and the arena all execute as written. What it cannot show: timing, memory
// coalescing, races between blocks, anything about the real driver or the real cuBLAS
// (its GEMM here is a plain loop in double over column-major operands, the documented
// cublasGemmEx semantics). "Device" memory is host memory; streams and events are
// ordered trivially because every call completes before it returns.
// One launch at a time, from one thread; 1-D blocks, multiples of 32 threads. Not for
// sanitizer builds (ASan needs fiber annotations for swapcontext; they are left out).
#pragma once

#include <ucontext.h>
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "nn/dtype.h"

// Unqualified math in the kernels gets the float overloads, as CUDA's device math does.
using std::cos;
using std::exp;
using std::log;
using std::pow;
using std::sin;
using std::sqrt;
using std::tanh;

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

namespace ferry_emu {

// A block's threads are fibers (ucontext) on the calling thread: each runs until it reaches
// a barrier, and a barrier opens once every thread it concerns (the block, or the 32 lanes
// of a warp) has reached it. Threads that wait at different barriers, or finish while
// others wait, are a kernel bug in CUDA too (a hang or undefined behaviour): reported.
struct Fiber {
  enum State { ready, at_block, at_warp, done };
  ucontext_t context{};
  std::unique_ptr<char[]> stack;
  State state = done;
};

constexpr size_t kFiberStack = size_t{256} << 10;  // kernels keep a few scalars and small loops

struct Warp {
  double lanes[32] = {};
};

inline dim3 thread_index, block_index, block_dim, grid_dim;
inline std::vector<Fiber> fibers;
inline unsigned current = 0;
inline ucontext_t scheduler;
inline const std::function<void()>* kernel_body = nullptr;
inline Warp* warps = nullptr;
inline unsigned char* dynamic_shared_memory = nullptr;

inline unsigned char* dynamic_shared() {
  return dynamic_shared_memory;
}

inline void fiber_main() {
  (*kernel_body)();
  fibers[current].state = Fiber::done;  // uc_link returns to the scheduler
}

inline void wait_at(Fiber::State barrier) {
  Fiber& f = fibers[current];
  f.state = barrier;
  swapcontext(&f.context, &scheduler);
}

// Runs one block to completion.
inline void run_block(unsigned n) {
  for (unsigned t = 0; t < n; ++t) {
    Fiber& f = fibers[t];
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack.get();
    f.context.uc_stack.ss_size = kFiberStack;
    f.context.uc_link = &scheduler;
    makecontext(&f.context, fiber_main, 0);
    f.state = Fiber::ready;
  }
  while (true) {
    for (unsigned t = 0; t < n; ++t) {
      if (fibers[t].state != Fiber::ready) continue;
      current = t;
      thread_index = dim3(t);
      swapcontext(&scheduler, &fibers[t].context);
    }
    unsigned done = 0, at_block = 0;
    bool opened = false;
    for (unsigned w = 0; w < n / 32; ++w) {
      unsigned waiting = 0;
      for (unsigned l = 0; l < 32; ++l) waiting += fibers[w * 32 + l].state == Fiber::at_warp;
      if (waiting == 32) {
        for (unsigned l = 0; l < 32; ++l) fibers[w * 32 + l].state = Fiber::ready;
        opened = true;
      }
    }
    if (opened) continue;
    for (unsigned t = 0; t < n; ++t) {
      done += fibers[t].state == Fiber::done;
      at_block += fibers[t].state == Fiber::at_block;
    }
    if (done == n) return;
    if (at_block == n) {
      for (unsigned t = 0; t < n; ++t) fibers[t].state = Fiber::ready;
      continue;
    }
    throw std::logic_error("cuda emulation: the threads of block (" +
                           std::to_string(block_index.x) + ", " + std::to_string(block_index.y) +
                           ", " + std::to_string(block_index.z) + ") wait at different barriers (" +
                           std::to_string(at_block) + " at __syncthreads, " + std::to_string(done) +
                           " finished)");
  }
}

inline void launch(dim3 grid, dim3 block, size_t shared_bytes,
                   const std::function<void()>& kernel) {
  if (block.y != 1 || block.z != 1 || block.x == 0 || block.x % 32 != 0) {
    throw std::invalid_argument("cuda emulation: 1-D blocks of a multiple of 32 threads only");
  }
  block_dim = block;
  grid_dim = grid;
  kernel_body = &kernel;
  std::vector<unsigned char> shared(shared_bytes + 64);
  dynamic_shared_memory =
      shared.data() + (64 - reinterpret_cast<uintptr_t>(shared.data()) % 64) % 64;
  auto warp_list = std::make_unique<Warp[]>(block.x / 32);
  warps = warp_list.get();
  while (fibers.size() < block.x) {
    fibers.emplace_back();
    fibers.back().stack = std::make_unique<char[]>(kFiberStack);
  }
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        block_index = dim3(x, y, z);
        run_block(block.x);
      }
}

}  // namespace ferry_emu

#define threadIdx ::ferry_emu::thread_index
#define blockIdx ::ferry_emu::block_index
#define blockDim ::ferry_emu::block_dim
#define gridDim ::ferry_emu::grid_dim
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define FERRY_DYNAMIC_SHARED(name) unsigned char* name = ::ferry_emu::dynamic_shared()
#define FERRY_LAUNCH(kernel, grid, block, smem, stream, ...) \
  ((void)(stream),                                           \
   ::ferry_emu::launch(dim3(grid), dim3(block), (smem), [&] { kernel(__VA_ARGS__); }))

inline void __syncthreads() {
  ::ferry_emu::wait_at(::ferry_emu::Fiber::at_block);
}

template <class T>
T __shfl_down_sync(unsigned, T v, int offset) {
  const unsigned lane = threadIdx.x % 32;
  ::ferry_emu::Warp& w = ::ferry_emu::warps[threadIdx.x / 32];
  w.lanes[lane] = static_cast<double>(v);  // exact for float and double
  ::ferry_emu::wait_at(::ferry_emu::Fiber::at_warp);
  const unsigned from = lane + static_cast<unsigned>(offset);
  const T r = from < 32 ? static_cast<T>(w.lanes[from]) : v;
  ::ferry_emu::wait_at(::ferry_emu::Fiber::at_warp);  // every lane has read before any writes again
  return r;
}

inline int atomicCAS(int* address, int compare, int value) {
  std::atomic_ref<int> a(*address);
  a.compare_exchange_strong(compare, value);
  return compare;  // the old value, as CUDA returns it
}

struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 h) {
  return ferry::nn::bf16_to_f32(h.bits);
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  return {ferry::nn::f32_to_bf16(f)};
}
inline float __half2float(__half h) {
  return ferry::nn::f16_to_f32(h.bits);
}
inline __half __float2half_rn(float f) {
  return {ferry::nn::f32_to_f16(f)};
}

// ---- the runtime calls ---------------------------------------------------------------------

using cudaError_t = int;
constexpr cudaError_t cudaSuccess = 0;
constexpr cudaError_t cudaErrorNotReady = 600;
using cudaStream_t = struct ferry_emu_stream*;
using cudaEvent_t = struct ferry_emu_event*;
constexpr unsigned cudaStreamNonBlocking = 1, cudaEventDisableTiming = 2;
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
struct cudaDeviceProp {
  char name[256];
  int major, minor;
};

inline const char* cudaGetErrorName(cudaError_t) {
  return "cudaErrorEmulation";
}
inline const char* cudaGetErrorString(cudaError_t) {
  return "error in the CPU emulation";
}
inline cudaError_t cudaGetLastError() {
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int) {
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::strcpy(p->name, "emulated on CPU threads");
  p->major = 9;
  p->minor = 0;
  return cudaSuccess;
}
inline cudaError_t cudaMalloc(void** p, size_t n) {
  *p = std::aligned_alloc(256, (std::max<size_t>(n, 1) + 255) / 256 * 256);
  return *p ? cudaSuccess : 2;
}
inline cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMallocHost(void** p, size_t n) {
  return cudaMalloc(p, n);
}
inline cudaError_t cudaFreeHost(void* p) {
  return cudaFree(p);
}
inline cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t) {
  return cudaMalloc(p, n);
}
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) {
  return cudaFree(p);
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind,
                                   cudaStream_t) {
  if (n) std::memmove(dst, src, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemset(void* p, int v, size_t n) {
  std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
  return cudaMemset(p, v, n);
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = nullptr;
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t) {
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = nullptr;
  return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t) {
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) {
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) {
  return cudaSuccess;
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) {
  return cudaSuccess;
}
inline cudaError_t cudaEventQuery(cudaEvent_t) {
  return cudaSuccess;
}  // everything has finished
enum cudaMemoryType {
  cudaMemoryTypeUnregistered,
  cudaMemoryTypeHost,
  cudaMemoryTypeDevice,
  cudaMemoryTypeManaged
};
struct cudaPointerAttributes {
  cudaMemoryType type;
};
// Every pointer is "device" memory here: host and device memory are the same.
inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void*) {
  a->type = cudaMemoryTypeDevice;
  return cudaSuccess;
}
template <class K>
cudaError_t cudaFuncSetAttribute(K, cudaFuncAttribute, int) {
  return cudaSuccess;
}

// ---- cuBLAS ------------------------------------------------------------------------------------

using cublasHandle_t = struct ferry_emu_cublas*;
enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_SUPPORTED = 15 };
enum cublasOperation_t { CUBLAS_OP_N, CUBLAS_OP_T };
enum cublasMath_t { CUBLAS_DEFAULT_MATH };
enum cudaDataType_t { CUDA_R_32F, CUDA_R_64F, CUDA_R_16BF, CUDA_R_16F };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_64F };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT };

inline const char* cublasGetStatusName(cublasStatus_t) {
  return "CUBLAS_STATUS_EMULATION";
}
inline const char* cublasGetStatusString(cublasStatus_t) {
  return "error in the CPU emulation";
}
inline cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = nullptr;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasDestroy(cublasHandle_t) {
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) {
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) {
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetWorkspace(cublasHandle_t, void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}

namespace ferry_emu {

inline double load(cudaDataType_t t, const void* p, int64_t i) {
  switch (t) {
    case CUDA_R_32F:
      return static_cast<const float*>(p)[i];
    case CUDA_R_64F:
      return static_cast<const double*>(p)[i];
    case CUDA_R_16BF:
      return ferry::nn::bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case CUDA_R_16F:
      return ferry::nn::f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}

inline void store(cudaDataType_t t, void* p, int64_t i, double v) {
  switch (t) {
    case CUDA_R_32F:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      return;
    case CUDA_R_64F:
      static_cast<double*>(p)[i] = v;
      return;
    case CUDA_R_16BF:
      static_cast<uint16_t*>(p)[i] = ferry::nn::f32_to_bf16(static_cast<float>(v));
      return;
    case CUDA_R_16F:
      static_cast<uint16_t*>(p)[i] = ferry::nn::f32_to_f16(static_cast<float>(v));
      return;
  }
}

}  // namespace ferry_emu

// Column-major C[m,n] = alpha op(A)[m,k] op(B)[k,n] + beta C, C not read when beta is 0.
inline cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t opa, cublasOperation_t opb,
                                   int m, int n, int k, const void* alpha, const void* A,
                                   cudaDataType_t at, int lda, const void* B, cudaDataType_t bt,
                                   int ldb, const void* beta, void* C, cudaDataType_t ct, int ldc,
                                   cublasComputeType_t compute, cublasGemmAlgo_t) {
  const bool f64 = compute == CUBLAS_COMPUTE_64F;
  if (f64 != (at == CUDA_R_64F) || at != bt) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (ct != at && !(ct == CUDA_R_32F && (at == CUDA_R_16BF || at == CUDA_R_16F)))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const double al = f64 ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  const double be = f64 ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double acc = 0;
      for (int l = 0; l < k; ++l) {
        const double a = ferry_emu::load(
            at, A, opa == CUBLAS_OP_N ? i + int64_t{l} * lda : l + int64_t{i} * lda);
        const double b = ferry_emu::load(
            bt, B, opb == CUBLAS_OP_N ? l + int64_t{j} * ldb : j + int64_t{l} * ldb);
        acc += a * b;
      }
      const int64_t at_c = i + int64_t{j} * ldc;
      ferry_emu::store(ct, C, at_c, al * acc + (be != 0 ? be * ferry_emu::load(ct, C, at_c) : 0.0));
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}
