// What every kernel file of the cuda device shares (nn/cuda/*.cu; the launchers' contract is
// nn/cuda_kernels.h): the launch macro the CPU emulation replaces, block sizes, typed loads
// and stores (ld/st, Operand), the accumulation-type and storage-type dispatch, block
// reductions, the value-error report and stream-ordered scratch.
// Everything here is a template or inline, in ferry::nn::cuda::detail (inside the ABI
// namespace of nn/cuda_abi.h, so the emulated copy never meets the real one at link time):
// each .cu file compiles on its own with nvcc, and the emulation compiles them all as one
// translation unit (tests/cuda_emulated.cpp).
#pragma once

#include "nn/cuda_kernels.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "nn/cuda_check.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
// Every launch goes through this macro so that the emulation can run the same lines; the
// CPU emulation of tests (testing/cuda_emulation.h, through testing/cuda_shim) defines its own.
#ifndef FERRY_LAUNCH
#define FERRY_LAUNCH(kernel, grid, block, smem, stream, ...) \
  kernel<<<grid, block, smem, stream>>>(__VA_ARGS__)
#define FERRY_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#endif

// Full unrolling of the loops over a warp's rows and a lane's channels (register arrays);
// g++ compiling the emulation does not know nvcc's pragma.
#ifdef __CUDACC__
#define FERRY_UNROLL _Pragma("unroll")
#else
#define FERRY_UNROLL
#endif

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
namespace detail {

// Threads per block: multiples of the warp size (block reductions assume it), at most
// kMaxThreads (static shared arrays indexed by thread are sized for it). The CPU emulation
// runs a block's threads as fibers, so it uses fewer by default (two warps still exercise
// the reductions across warps); tests set the GPU's sizes with set_emulated_block_threads.
inline constexpr int kMaxThreads = 1024;
#ifdef FERRY_CUDA_EMULATION
inline int emulated_threads = 64;
inline int emulated_attn_threads = 64;
inline int block_threads() {
  return emulated_threads;
}
inline int attn_threads() {
  return emulated_attn_threads;
}
#else
constexpr int block_threads() {
  return 256;
}
constexpr int attn_threads() {  // attention's row kernels: rows of T scores and hs channels
  return 128;
}
#endif

inline cudaStream_t as_stream(Stream s) {
  return static_cast<cudaStream_t>(s);
}

inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + block_threads() - 1) / block_threads();
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t{1} << 20));
}

template <class A>
__device__ __forceinline__ A ld(const Arr& a, int64_t i) {
  switch (a.dtype) {
    case DType::f32:
      return static_cast<A>(static_cast<const float*>(a.p)[i]);
    case DType::f64:
      return static_cast<A>(static_cast<const double*>(a.p)[i]);
    case DType::bf16:
      return static_cast<A>(__bfloat162float(static_cast<const __nv_bfloat16*>(a.p)[i]));
    case DType::f16:
      return static_cast<A>(__half2float(static_cast<const __half*>(a.p)[i]));
    case DType::i32:
      return static_cast<A>(static_cast<const int32_t*>(a.p)[i]);
  }
  return A(0);
}

template <class A>
__device__ __forceinline__ void st(const Arr& a, int64_t i, A v) {
  switch (a.dtype) {
    case DType::f32:
      static_cast<float*>(a.p)[i] = static_cast<float>(v);
      return;
    case DType::f64:
      static_cast<double*>(a.p)[i] = static_cast<double>(v);
      return;
    // Through f32 first, as the CPU device rounds (f64 -> f32 -> bf16).
    case DType::bf16:
      static_cast<__nv_bfloat16*>(a.p)[i] = __float2bfloat16_rn(static_cast<float>(v));
      return;
    case DType::f16:
      static_cast<__half*>(a.p)[i] = __float2half_rn(static_cast<float>(v));
      return;
    case DType::i32:
      static_cast<int32_t*>(a.p)[i] = static_cast<int32_t>(v);
      return;
  }
}

// ---- operands of a storage type known at compile time --------------------------------------
// ld/st switch on the dtype at every element. Kernels whose inner loops load the same
// operands over and over take them as Operand<A, S> instead: S is the storage type (float,
// __nv_bfloat16, __half), picked once by the launcher (by_storage), so the loop
// body is a plain load and widening. Operand<A, Arr> keeps the per-element switch for the
// uncommon dtype mixes, so every mix the Device accepts still runs the same kernel.

__device__ __forceinline__ float widen(float x) {
  return x;
}
__device__ __forceinline__ float widen(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float widen(__half x) {
  return __half2float(x);
}

template <class S>
struct Narrow {  // rounds an accumulator to S as st does (through f32 for bf16 and f16)
  template <class A>
  __device__ static S to(A v) {
    return static_cast<S>(v);
  }
};
template <>
struct Narrow<__nv_bfloat16> {
  template <class A>
  __device__ static __nv_bfloat16 to(A v) {
    return __float2bfloat16_rn(static_cast<float>(v));
  }
};
template <>
struct Narrow<__half> {
  template <class A>
  __device__ static __half to(A v) {
    return __float2half_rn(static_cast<float>(v));
  }
};

// x[i] loads element i widened to A; x.set(i, v) stores v rounded to the storage type.
// Built on the host from an Arr whose dtype matches S (by_storage guarantees it).
template <class A, class S>
struct Operand {
  S* p;
  explicit Operand(Arr a) : p(static_cast<S*>(a.p)) {}
  __device__ A operator[](int64_t i) const {
    return static_cast<A>(widen(p[i]));
  }
  __device__ void set(int64_t i, A v) const {
    p[i] = Narrow<S>::to(v);
  }
};
template <class A>
struct Operand<A, Arr> {
  Arr a;
  explicit Operand(Arr x) : a(x) {}
  __device__ A operator[](int64_t i) const {
    return ld<A>(a, i);
  }
  __device__ void set(int64_t i, A v) const {
    st<A>(a, i, v);
  }
};

template <class S>
struct Storage {
  using type = S;
};

// Picks the kernel instantiation for accumulation type A: runs f(Storage<X>{}, Storage<Y>{})
// where X is the storage of every array in `acts` (activations) and Y that of every array in
// `stats` (statistics, gradients). Typed for the mixes f32 and bf16/f16 models hand the
// kernels (acts all f32, bf16 or f16; stats all f32) with A = float; any other mix, and
// A = double, gets Storage<Arr> for both: the same kernels with ld's switch.
template <class A, class F>
void by_storage(std::initializer_list<Arr> acts, std::initializer_list<Arr> stats, F&& f) {
  if constexpr (std::is_same_v<A, float>) {
    const DType t = acts.begin()->dtype;
    const bool uniform =
        std::all_of(acts.begin(), acts.end(), [t](const Arr& a) { return a.dtype == t; }) &&
        std::all_of(stats.begin(), stats.end(),
                    [](const Arr& a) { return a.dtype == DType::f32; });
    if (uniform) {
      switch (t) {
        case DType::f32:
          f(Storage<float>{}, Storage<float>{});
          return;
        case DType::bf16:
          f(Storage<__nv_bfloat16>{}, Storage<float>{});
          return;
        case DType::f16:
          f(Storage<__half>{}, Storage<float>{});
          return;
        default:
          break;
      }
    }
  }
  f(Storage<Arr>{}, Storage<Arr>{});
}

// Grid-stride loop over [0, n).
#define FERRY_FOR_EACH(i, n)                                                \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

struct Sum {
  template <class A>
  __device__ A operator()(A a, A b) const {
    return a + b;
  }
  template <class A>
  __device__ static A identity() {
    return A(0);
  }
};
struct Max {
  template <class A>
  __device__ A operator()(A a, A b) const {
    return a > b ? a : b;
  }
  template <class A>
  __device__ static A identity() {
    return -INFINITY;
  }
};

// Reduces v over the block (blockDim.x a multiple of 32); every thread gets the result.
// `scratch` holds 32 values; the call may be repeated with the same scratch.
template <class A, class Op>
__device__ A block_reduce(A v, A* scratch, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();  // an earlier call may still be reading scratch[0]
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? scratch[lane]
                     : Op::template identity<A>();  // lanes past the last warp add nothing
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  return scratch[0];
}

__device__ inline void report(int* err, int64_t index, int value) {
  if (atomicCAS(err, 0, 1) == 0) {
    err[1] = static_cast<int>(index);
    err[2] = value;
  }
}

// Runs f(A{}) with the accumulation type: double when any operand is f64.
template <class F>
void by_acc(bool wide, F&& f) {
  if (wide) {
    f(double{});
  } else {
    f(float{});
  }
}

template <class... Arrs>
bool wide(const Arrs&... a) {
  return ((a.dtype == DType::f64) || ...);
}

// Device scratch for one launcher's kernels, allocated and freed in stream order
// (cudaMallocAsync / cudaFreeAsync on the launch stream): no host synchronisation, and the
// memory is reused by the stream's pool as soon as the kernels that read it are done.
// (Whether the pool keeps it across synchronisations is the device's release threshold:
// GPU-REVIEW F14, set in nn/cuda/device_memory.cpp.)
class StreamScratch {
 public:
  StreamScratch(cudaStream_t s, size_t bytes) : stream_(s) {
    FERRY_CUDA_CHECK(cudaMallocAsync(&p_, bytes, s));
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  // Only on an error path (a launch threw before release): the error is already on its way.
  ~StreamScratch() {
    if (p_ != nullptr) (void)cudaFreeAsync(p_, stream_);
  }
  template <class T>
  T* get() const {
    return static_cast<T*>(p_);
  }
  // Frees after the kernels enqueued so far.
  void release() {
    void* p = p_;
    p_ = nullptr;
    FERRY_CUDA_CHECK(cudaFreeAsync(p, stream_));
  }

 private:
  cudaStream_t stream_;
  void* p_ = nullptr;
};

}  // namespace detail
FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
