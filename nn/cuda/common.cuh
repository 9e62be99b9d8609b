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
#include <cstdio>
#include <cstdlib>
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

// The current device's compute capability major number (an attribute read: no
// synchronisation, cheap beside the launches it decides).
inline int compute_major() {
  int device = 0, v = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&device));
  FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, device));
  return v;
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

// ---- 16-byte vector access ---------------------------------------------------------------
// Vec<S, W>: W consecutive elements of S moved as whole 16-byte accesses (one 128-bit load
// or store per 16 bytes on a GPU, against one 2- or 4-byte access per element). Its address
// must be 16-byte aligned: a GPU faults on a misaligned vector access, and so does the
// emulation (it aborts naming the address). Launchers check with aligned16 and give the
// kernels no vector chunks where an operand is misaligned, so the scalar loop does it all.
inline constexpr int kVecBytes = 16;

template <class S, int W>
struct alignas(kVecBytes) Vec {
  static_assert(W * sizeof(S) % kVecBytes == 0, "whole 16-byte accesses");
  S e[W];
};

__device__ __forceinline__ void check_vector_address(const void* p) {
#ifdef FERRY_CUDA_EMULATION
  if (reinterpret_cast<uintptr_t>(p) % kVecBytes != 0) {
    // A GPU stops the kernel (cudaErrorMisalignedAddress). Ended here at once: abort's
    // signal, caught by a test framework inside a fiber, can leave the process hanging.
    std::fprintf(stderr, "cuda emulation: misaligned 16-byte access at %p\n", p);
    std::_Exit(134);
  }
#else
  (void)p;
#endif
}

template <class S, int W>
__device__ __forceinline__ Vec<S, W> vec_load(const S* p) {
  check_vector_address(p);
  return *reinterpret_cast<const Vec<S, W>*>(p);
}

template <class S, int W>
__device__ __forceinline__ void vec_store(S* p, const Vec<S, W>& v) {
  check_vector_address(p);
  *reinterpret_cast<Vec<S, W>*>(p) = v;
}

inline bool aligned16(std::initializer_list<const void*> ps) {
  return std::all_of(ps.begin(), ps.end(), [](const void* p) {
    return reinterpret_cast<uintptr_t>(p) % kVecBytes == 0;
  });
}

// x[i] loads element i widened to A; x.set(i, v) stores v rounded to the storage type;
// x.round(v) is the value set would store, widened back.
// x.load(j, v) / x.store(j, v): elements [j W, j W + W) as one Vec (kWidth: elements per
// 16 bytes; W a multiple of it). Built on the host from an Arr whose dtype matches S
// (by_storage guarantees it).
template <class A, class S>
struct Operand {
  static constexpr bool kTyped = true;
  static constexpr int kWidth = kVecBytes / static_cast<int>(sizeof(S));
  S* p;
  explicit Operand(Arr a) : p(static_cast<S*>(a.p)) {}
  __device__ A operator[](int64_t i) const {
    return static_cast<A>(widen(p[i]));
  }
  __device__ void set(int64_t i, A v) const {
    p[i] = Narrow<S>::to(v);
  }
  template <int W>
  __device__ void load(int64_t j, A (&x)[W]) const {
    const Vec<S, W> v = vec_load<S, W>(p + j * W);
    FERRY_UNROLL
    for (int k = 0; k < W; ++k) x[k] = static_cast<A>(widen(v.e[k]));
  }
  // v rounded to the storage type and widened back: the value set(i, v) would store.
  __device__ static A round(A v) {
    return static_cast<A>(widen(Narrow<S>::to(v)));
  }
  template <int W>
  __device__ void store(int64_t j, const A (&x)[W]) const {
    Vec<S, W> v;
    FERRY_UNROLL
    for (int k = 0; k < W; ++k) v.e[k] = Narrow<S>::to(x[k]);
    vec_store<S, W>(p + j * W, v);
  }
};
// The per-element switch: never given vector chunks (kTyped false); load/store exist so
// that the same kernel bodies compile.
template <class A>
struct Operand<A, Arr> {
  static constexpr bool kTyped = false;
  static constexpr int kWidth = 1;
  Arr a;
  explicit Operand(Arr x) : a(x) {}
  __device__ A operator[](int64_t i) const {
    return ld<A>(a, i);
  }
  __device__ void set(int64_t i, A v) const {
    st<A>(a, i, v);
  }
  __device__ A round(A v) const {
    switch (a.dtype) {
      case DType::f32:
        return static_cast<A>(static_cast<float>(v));
      case DType::bf16:
        return static_cast<A>(__bfloat162float(__float2bfloat16_rn(static_cast<float>(v))));
      case DType::f16:
        return static_cast<A>(__half2float(__float2half_rn(static_cast<float>(v))));
      default:
        return v;
    }
  }
  template <int W>
  __device__ void load(int64_t j, A (&x)[W]) const {
    for (int k = 0; k < W; ++k) x[k] = ld<A>(a, j * W + k);
  }
  template <int W>
  __device__ void store(int64_t j, const A (&x)[W]) const {
    for (int k = 0; k < W; ++k) st<A>(a, j * W + k, x[k]);
  }
};

// Elements per vector chunk of a kernel over these operands: the widest operand's (8 where
// any is 16-bit), so every operand's part of a chunk is whole 16-byte accesses.
template <class... Ops>
inline constexpr int kChunkWidth = std::max({Ops::kWidth...});

// Vector chunks of n elements for operands Ops at these addresses: n / W where every
// operand is typed and 16-byte aligned, else 0 (the scalar loop takes everything).
template <class... Ops>
int64_t vector_chunks(int64_t n, std::initializer_list<const void*> ps) {
  constexpr bool typed = (Ops::kTyped && ...);
  if (!typed || !aligned16(ps)) return 0;
  return n / kChunkWidth<Ops...>;
}

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

// Runs f(Storage<S>{}) for one array's storage: typed for f32, bf16 and f16 with A = float,
// Storage<Arr> otherwise (kernels that mix storage types per operand, such as cast).
template <class A, class F>
void by_type(Arr a, F&& f) {
  if constexpr (std::is_same_v<A, float>) {
    switch (a.dtype) {
      case DType::f32:
        f(Storage<float>{});
        return;
      case DType::bf16:
        f(Storage<__nv_bfloat16>{});
        return;
      case DType::f16:
        f(Storage<__half>{});
        return;
      default:
        break;
    }
  }
  f(Storage<Arr>{});
}

// Grid-stride loop over [0, n).
#define FERRY_FOR_EACH(i, n)                                                \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

// Grid-stride loops of the vectorised kernels: vec(j) for chunk j of W elements, j in
// [0, chunks), then one(i) for each element i in [chunks W, n) (the tail, or everything
// where chunks is 0). Both compute an element the same way, so the bits do not depend on
// which loop took it.
template <int W, class Vec_, class One>
__device__ __forceinline__ void for_each_chunk(int64_t n, int64_t chunks, Vec_ vec, One one) {
  const int64_t start = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t j = start; j < chunks; j += stride) vec(j);
  for (int64_t i = chunks * W + start; i < n; i += stride) one(i);
}

// Blocks for a vectorised loop: one thread per chunk or per tail element.
inline unsigned grid_for_chunks(int64_t n, int64_t chunks, int W) {
  return grid_for(std::max(chunks, n - chunks * W));
}

// Grid-stride loop over the cells of a [rows, cols] array in row-major order, body(i, r, c)
// with i = r cols + c: each cell's row and column are kept incrementally, one division per
// thread at the start instead of a 64-bit division and modulo per cell.
template <class Body>
__device__ __forceinline__ void for_each_cell(int64_t rows, int64_t cols, Body body) {
  const int64_t start = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t total = rows * cols;
  if (start >= total) return;
  int64_t r = start / cols, c = start % cols;
  const int64_t dr = stride / cols, dc = stride % cols;
  for (int64_t i = start; i < total; i += stride) {
    body(i, r, c);
    r += dr;
    c += dc;
    if (c >= cols) {
      c -= cols;
      ++r;
    }
  }
}

// The sum of v over the 32 lanes of a warp, every lane getting it (a butterfly: the same
// order in every lane, so all hold the same bits).
template <class A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

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
