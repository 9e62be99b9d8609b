// Kernels of the CUDA device; the contract is in nn/cuda_kernels.h. Written for clarity
// first: one block per row for the row reductions, two passes over column tiles and row
// chunks for the column reductions, one thread per element elsewhere, and
// attention as FlashAttention-2's tiled kernels (no [B,NH,T,T] tensor anywhere). GEMMs, the bulk of the FLOPs, are cuBLAS's (nn/cuda_device.cpp).
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

namespace {

// Threads per block: multiples of the warp size (block reductions assume it), at most
// kMaxThreads (static shared arrays indexed by thread are sized for it). The CPU emulation
// runs a block's threads as fibers, so it uses fewer by default (two warps still exercise
// the reductions across warps); tests set the GPU's sizes with set_emulated_block_threads.
constexpr int kMaxThreads = 1024;
#ifdef FERRY_CUDA_EMULATION
int emulated_threads = 64;
int emulated_attn_threads = 64;
int block_threads() {
  return emulated_threads;
}
int attn_threads() {
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

cudaStream_t as_stream(Stream s) {
  return static_cast<cudaStream_t>(s);
}

unsigned grid_for(int64_t n) {
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

__device__ void report(int* err, int64_t index, int value) {
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

// ---- elementwise ------------------------------------------------------------------------

template <class A>
__global__ void cast_kernel(Arr dst, Arr src, int64_t n) {
  FERRY_FOR_EACH(i, n) st<A>(dst, i, ld<A>(src, i));
}

template <class A>
__global__ void fill_kernel(Arr dst, A value, int64_t n) {
  FERRY_FOR_EACH(i, n) st<A>(dst, i, value);
}

template <class A>
__global__ void add_kernel(Arr out, Arr a, Arr b, int64_t n) {
  FERRY_FOR_EACH(i, n) st<A>(out, i, ld<A>(a, i) + ld<A>(b, i));
}

template <class A>
__global__ void scale_kernel(Arr x, A f, int64_t n) {
  FERRY_FOR_EACH(i, n) st<A>(x, i, ld<A>(x, i) * f);
}

template <class A>
__global__ void add_bias_kernel(Arr out, Arr bias, int64_t N, int64_t C) {
  FERRY_FOR_EACH(i, N * C) st<A>(out, i, ld<A>(out, i) + ld<A>(bias, i % C));
}

// ---- column reductions: dst[c] += sum over rows n of term(n, c) ------------------------------
// Bias gradients, the norms' weight gradients and dwpe. Two passes, both in a fixed order,
// so the result depends only on the shapes and the block size, never on timing:
// pass 1 (column_partials_kernel): the grid is column tiles x row chunks. A block is 32
//   consecutive columns (lane = column, so each warp loads one coalesced segment per row)
//   by R = blockDim.x / 32 row lanes; row lane r adds rows r, r + R, ... of its chunk in
//   order, then row lane 0 adds the R lane sums in lane order and writes the chunk's
//   partial sum to scratch.
// pass 2 (column_finish_kernel): one thread per column adds its chunks' partials in chunk
//   order and adds the total to the destination (rounded once, as the CPU device does).
// Cost (H100, N = 8192 rows, C = 768, 256 threads): pass 1 is 24 tiles x 32 chunks = 768
// blocks of 32 loads per thread, all coalesced, enough warps in flight to stream at memory
// speed (N C elements read once); pass 2 reads 32 C partials. The one-thread-per-column
// kernel it replaces ran 3 blocks walking all N rows, latency bound.
// A term has K outputs (layernorm: dw and db) and adds row n's contributions to s[0..K-1];
// `at` = n * C + c.

constexpr int kRowsPerLane = 32;                 // rows per row lane per chunk (pass 1)
constexpr int64_t kMaxPartials = int64_t{1} << 20;  // scratch elements: 4 MiB f32, 8 MiB f64
constexpr int64_t kMaxChunks = 65535;              // gridDim.y

template <class A, class X>
struct ColumnSumTerm {  // column_sums; dwpe (dout as [N / T, T C])
  static constexpr int K = 1;
  X src;
  __device__ void add(A* s, int64_t at, int64_t) const {
    s[0] += src[at];
  }
};

template <class A, class X, class Y>
struct LayerNormParamsTerm {  // dw += norm * dout, db += dout
  static constexpr int K = 2;
  X dout, inp;
  Y mean, rstd;
  __device__ void add(A* s, int64_t at, int64_t n) const {
    const A d = dout[at];
    s[0] += (inp[at] - mean[n]) * rstd[n] * d;
    s[1] += d;
  }
};

template <class A, class X, class Y>
struct RmsNormParamsTerm {  // dw += x * rstd * dout
  static constexpr int K = 1;
  X dout, inp;
  Y rstd;
  __device__ void add(A* s, int64_t at, int64_t n) const {
    s[0] += inp[at] * rstd[n] * dout[at];
  }
};

// partial: [K][gridDim.y][C].
template <class A, class Term>
__global__ void column_partials_kernel(Term term, int64_t N, int64_t C, int64_t chunk_rows,
                                       A* partial) {
  constexpr int K = Term::K;
  __shared__ A lane_sums[K][kMaxThreads];
  const int lane = threadIdx.x & 31, r = threadIdx.x >> 5, R = blockDim.x >> 5;
  const int64_t c = blockIdx.x * int64_t{32} + lane;
  const int64_t n0 = blockIdx.y * chunk_rows;
  const int64_t n1 = n0 + chunk_rows < N ? n0 + chunk_rows : N;
  A s[K];
  for (int k = 0; k < K; ++k) s[k] = 0;
  if (c < C) {
    for (int64_t n = n0 + r; n < n1; n += R) term.add(s, n * C + c, n);
  }
  for (int k = 0; k < K; ++k) lane_sums[k][threadIdx.x] = s[k];
  __syncthreads();
  if (r == 0 && c < C) {
    for (int k = 0; k < K; ++k) {
      A t = lane_sums[k][lane];
      for (int q = 1; q < R; ++q) t += lane_sums[k][q * 32 + lane];
      partial[(k * int64_t{gridDim.y} + blockIdx.y) * C + c] = t;
    }
  }
}

// out_k[c] += sum over chunks of partial[k][chunk][c], k < K (out1 unused when K = 1).
template <class A>
__global__ void column_finish_kernel(Arr out0, Arr out1, int K, const A* partial,
                                     int64_t chunks, int64_t C) {
  FERRY_FOR_EACH(i, K * C) {
    const int64_t k = i / C, c = i % C;
    A t = 0;
    for (int64_t q = 0; q < chunks; ++q) t += partial[(k * chunks + q) * C + c];
    const Arr& out = k == 0 ? out0 : out1;
    st<A>(out, c, ld<A>(out, c) + t);
  }
}

template <class A>
__global__ void sum_squares_kernel(Arr x, int64_t n, double* partial) {
  __shared__ double scratch[32];
  double s = 0;
  FERRY_FOR_EACH(i, n) {
    const double v = ld<double>(x, i);
    s += v * v;
  }
  s = block_reduce(s, scratch, Sum{});
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials_kernel(double* partial, int count) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    double total = 0;
    for (int i = 0; i < count; ++i) total += partial[i];  // in block order: deterministic
    partial[count] = total;
  }
}

// ---- embedding ----------------------------------------------------------------------------

template <class A>
__global__ void embedding_forward_kernel(Arr out, const int32_t* tokens, Arr wte, Arr wpe,
                                         int64_t N, int64_t T, int64_t C, int64_t V, int* err) {
  FERRY_FOR_EACH(i, N * C) {
    const int64_t n = i / C, c = i % C;
    const int32_t tok = tokens[n];
    if (tok < 0 || tok >= V) {
      if (c == 0) report(err, n, tok);
      continue;
    }
    st<A>(out, i, ld<A>(wte, int64_t{tok} * C + c) + ld<A>(wpe, (n % T) * C + c));
  }
}

// dwte[tokens[n]] += dout[n] for every n: rows sharing a token add into one dwte row. Each
// block owns the vocabulary rows v with v % gridDim.x == blockIdx.x and scans all tokens in
// order, a tile of blockDim.x at a time: the tile's tokens it owns are compacted, in order,
// by a prefix sum in shared memory, then the block adds their dout rows (threads across
// columns, coalesced) into dwte. Every dwte row is written by one block only and gets its
// rows in token order: no atomics, deterministic, and the CPU kernel's summation order
// (the result does not depend on the grid or block size).
// Cost (N = 8192 tokens, C = 768, 256 threads, 512 blocks): each block reads all N token
// ids (32 tiles, 8 scan steps each; 16 MB of L2 reads in all) and N / 512 dout rows on
// average; dout is read once overall. A token that fills a fraction f of the batch makes
// its block add f N rows one after another (f = 5%: ~400 row additions of 3 loads per
// thread, a few hundred microseconds): the price of owning rows without a sort. The kernel
// it replaces ran C threads each walking all N rows (~5 ms).
template <class A, class X, class Y>
__global__ void embedding_backward_wte_kernel(Y dwte, X dout, const int32_t* tokens, int64_t N,
                                              int64_t C) {
  __shared__ int count[kMaxThreads];  // inclusive prefix sum of "this block owns it"
  __shared__ int owned[kMaxThreads];  // tile positions of the owned tokens, in order
  const int64_t blocks = gridDim.x, me = blockIdx.x;
  const int t = threadIdx.x;
  for (int64_t n0 = 0; n0 < N; n0 += blockDim.x) {
    const int64_t n = n0 + t;
    const bool mine = n < N && int64_t{tokens[n]} % blocks == me;
    count[t] = mine ? 1 : 0;
    __syncthreads();
    for (int o = 1; o < static_cast<int>(blockDim.x); o <<= 1) {  // Hillis-Steele scan
      const int v = t >= o ? count[t - o] : 0;
      __syncthreads();
      count[t] += v;
      __syncthreads();
    }
    if (mine) owned[count[t] - 1] = t;
    const int total = count[blockDim.x - 1];
    __syncthreads();
    for (int k = 0; k < total; ++k) {
      const int64_t m = n0 + owned[k];
      const int64_t row = int64_t{tokens[m]} * C;
      for (int64_t c = t; c < C; c += blockDim.x) dwte.set(row + c, dwte[row + c] + dout[m * C + c]);
    }
    __syncthreads();  // count and owned are rewritten by the next tile
  }
}

// ---- normalisation: one block per row -----------------------------------------------------

template <class A>
__global__ void layernorm_forward_kernel(Arr out, Arr mean, Arr rstd, Arr inp, Arr w, Arr b,
                                         int64_t C) {
  __shared__ A scratch[32];
  const int64_t row = blockIdx.x * C;
  A s = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += ld<A>(inp, row + c);
  const A m = block_reduce(s, scratch, Sum{}) / static_cast<A>(C);
  A v = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const A d = ld<A>(inp, row + c) - m;
    v += d * d;
  }
  v = block_reduce(v, scratch, Sum{}) / static_cast<A>(C);
  const A r = A(1) / sqrt(v + static_cast<A>(1e-5));
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    st<A>(out, row + c, (ld<A>(inp, row + c) - m) * r * ld<A>(w, c) + ld<A>(b, c));
  }
  if (threadIdx.x == 0) {
    st<A>(mean, blockIdx.x, m);
    st<A>(rstd, blockIdx.x, r);
  }
}

template <class A>
__global__ void layernorm_backward_rows_kernel(Arr dinp, Arr dout, Arr inp, Arr w, Arr mean,
                                               Arr rstd, int64_t C) {
  __shared__ A scratch[32];
  const int64_t row = blockIdx.x * C;
  const A m = ld<A>(mean, blockIdx.x), r = ld<A>(rstd, blockIdx.x);
  A dm = 0, dnm = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const A norm = (ld<A>(inp, row + c) - m) * r;
    const A dnorm = ld<A>(w, c) * ld<A>(dout, row + c);
    dm += dnorm;
    dnm += dnorm * norm;
  }
  dm = block_reduce(dm, scratch, Sum{}) / static_cast<A>(C);
  dnm = block_reduce(dnm, scratch, Sum{}) / static_cast<A>(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const A norm = (ld<A>(inp, row + c) - m) * r;
    const A dnorm = ld<A>(w, c) * ld<A>(dout, row + c);
    st<A>(dinp, row + c, ld<A>(dinp, row + c) + (dnorm - dm - norm * dnm) * r);
  }
}


template <class A>
__global__ void rmsnorm_forward_kernel(Arr out, Arr rstd, Arr inp, Arr w, int64_t C, double eps) {
  __shared__ A scratch[32];
  const int64_t row = blockIdx.x * C;
  A ss = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const A x = ld<A>(inp, row + c);
    ss += x * x;
  }
  ss = block_reduce(ss, scratch, Sum{});
  const A r = A(1) / sqrt(ss / static_cast<A>(C) + static_cast<A>(eps));
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    st<A>(out, row + c, ld<A>(inp, row + c) * r * ld<A>(w, c));
  if (threadIdx.x == 0) st<A>(rstd, blockIdx.x, r);
}

template <class A>
__global__ void rmsnorm_backward_rows_kernel(Arr dinp, Arr dout, Arr inp, Arr w, Arr rstd,
                                             int64_t C) {
  __shared__ A scratch[32];
  const int64_t row = blockIdx.x * C;
  const A r = ld<A>(rstd, blockIdx.x);
  A wdx = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    wdx += ld<A>(w, c) * ld<A>(dout, row + c) * ld<A>(inp, row + c);
  }
  wdx = block_reduce(wdx, scratch, Sum{});
  const A k = r * r * r * wdx / static_cast<A>(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const A di = r * ld<A>(w, c) * ld<A>(dout, row + c) - ld<A>(inp, row + c) * k;
    st<A>(dinp, row + c, ld<A>(dinp, row + c) + di);
  }
}


// ---- attention -----------------------------------------------------------------------------
// FlashAttention-2's algorithm in SIMT form (no tensor-core instructions, so the CPU
// emulation runs it as written): scores are made tile by tile and never stored.
// qkv rows: q (NH heads) | k (KVH heads) | v (KVH heads), hs channels each; W = (NH+2KVH) hs.
// Every kernel runs warps of 32 lanes, each warp owning kRowsPerWarp rows (query rows in
// forward and in the dQ pass, key rows in the dK/dV pass) and each lane one position of the
// other side's tile of 32 (a key, or a query): a lane's dot products read its row of the
// tile from shared memory (rows padded to hs + 1 words, so the 32 lanes hit 32 banks) and
// the warp's rows as broadcasts. Accumulators of the warp's rows live in registers, a lane
// owning channels lane, lane + 32, ... (hs <= kMaxHeadSize). The probabilities a warp
// shares between its lanes pass through a per-warp slice of shared memory (__syncwarp).
// Shared memory does not grow with T: long contexts need nothing more than more blocks.

constexpr int kRowsPerWarp = 4;
constexpr int kTile = 32;  // keys (forward, dQ) or queries (dK/dV) per tile: one per lane
constexpr int kMaxHeadSize = 256;

// Runs f(std::integral_constant<int, P>{}) with P = the channels per lane a head of hs
// needs (2, 4 or 8: heads up to 64, 128, 256): the accumulators are register arrays of P,
// and sizing them to the head keeps registers, and so occupancy, where small heads want them.
template <class F>
void by_lanes(int64_t hs, F&& f) {
  if (hs <= 64) {
    f(std::integral_constant<int, 2>{});
  } else if (hs <= 128) {
    f(std::integral_constant<int, 4>{});
  } else {
    f(std::integral_constant<int, 8>{});
  }
}

struct AttnShape {
  int64_t T, C, NH, KVH, hs, W, group;
};

AttnShape attn_shape(int64_t T, int64_t C, int64_t NH, int64_t KVH) {
  const int64_t hs = C / NH;
  return {T, C, NH, KVH, hs, (NH + 2 * KVH) * hs, NH / KVH};
}

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) {
  return a < b ? a : b;
}

__device__ __forceinline__ int64_t first_key(const int32_t* doc_start, int64_t b, int64_t T, int64_t i) {
  return doc_start ? doc_start[b * T + i] : 0;
}

// Loads rows [r0, r0 + n) of one head's columns of `src` (row stride `stride`, column
// offset `col`) into tile[n][pitch] as A; rows at or past T are zero. A warp per row, lanes
// over its channels: coalesced reads and no integer division (the index arithmetic of an
// idx / hs split cost more than the tile's dot products).
template <class A, class X>
__device__ void load_tile(A* tile, int pitch, X src, int64_t row_base, int64_t r0, int n, int64_t T,
                          int64_t stride, int64_t col, int64_t hs) {
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = static_cast<int>(hs);
  for (int r = warp; r < n; r += warps) {
    const int64_t row = r0 + r;
    const int64_t at = (row_base + row) * stride + col;
    A* dst = tile + r * pitch;
    if (row < T) {
      for (int d = lane; d < h; d += 32) dst[d] = src[at + d];
    } else {
      for (int d = lane; d < h; d += 32) dst[d] = A(0);
    }
  }
}

template <class A>
__device__ __forceinline__ A warp_max(A v) {
  for (int o = 16; o > 0; o >>= 1) {
    const A w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

// Forward: one block per (query tile, head, batch), largest tiles first. Per key tile the
// warp's rows take the tile's max (shuffles), rescale their running sums and outputs, and
// add p v with p from the warp's slice of shared memory.
template <class A, class X, class Y, int P>
__global__ void flash_forward_kernel(Arr out, Y lse, X qkv, AttnShape s, const int32_t* doc_start) {
  FERRY_DYNAMIC_SHARED(smem_raw);
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows = warps * kRowsPerWarp;
  const int kld = static_cast<int>(s.hs) + 1, hs = static_cast<int>(s.hs);
  A* qs = reinterpret_cast<A*>(smem_raw);  // [rows][hs]
  A* ks = qs + rows * s.hs;                // [kTile][hs + 1]
  A* vs = ks + kTile * kld;                // [kTile][hs]
  A* ps = vs + kTile * s.hs;               // [warps][kRowsPerWarp][kTile]
  const int64_t tiles = gridDim.x;
  const int64_t i0 = (tiles - 1 - blockIdx.x) * rows, h = blockIdx.y, b = blockIdx.z, kv = h / s.group;
  const A scale = A(1) / sqrt(static_cast<A>(s.hs));
  load_tile<A>(qs, static_cast<int>(s.hs), qkv, b * s.T, i0, rows, s.T, s.W, h * s.hs, s.hs);
  int64_t lo = i0;
  for (int r = 0; r < rows && i0 + r < s.T; ++r) lo = imin(lo, first_key(doc_start, b, s.T, i0 + r));
  const int64_t hi = imin(i0 + rows, s.T);
  A m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][P];
  int64_t start[kRowsPerWarp];
FERRY_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    m[rr] = -INFINITY;
    l[rr] = 0;
    start[rr] = i < s.T ? first_key(doc_start, b, s.T, i) : s.T;
FERRY_UNROLL
    for (int k = 0; k < P; ++k) o[rr][k] = 0;
  }
  A* wp = ps + warp * kRowsPerWarp * kTile;
  for (int64_t j0 = lo; j0 < hi; j0 += kTile) {
    __syncthreads();  // the previous tile has been read by every warp
    load_tile<A>(ks, kld, qkv, b * s.T, j0, kTile, s.T, s.W, (s.NH + kv) * s.hs, s.hs);
    load_tile<A>(vs, static_cast<int>(s.hs), qkv, b * s.T, j0, kTile, s.T, s.W, (s.NH + s.KVH + kv) * s.hs, s.hs);
    __syncthreads();
    A sc[kRowsPerWarp];
FERRY_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) sc[rr] = 0;
    const A* krow = ks + lane * kld;
    const A* q0 = qs + warp * kRowsPerWarp * s.hs;
    for (int d = 0; d < hs; ++d) {
      const A kd = krow[d];
FERRY_UNROLL
      for (int rr = 0; rr < kRowsPerWarp; ++rr) sc[rr] += q0[rr * hs + d] * kd;
    }
    const int64_t j = j0 + lane;
FERRY_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t i = i0 + warp * kRowsPerWarp + rr;
      const bool visible = i < s.T && j >= start[rr] && j <= i;
      const A sv = visible ? sc[rr] * scale : A(-INFINITY);
      const A tmax = warp_max(sv);
      // Warp-uniform: a row with no visible key in this tile keeps its state.
      const A mnew = tmax > m[rr] ? tmax : m[rr];
      const A alpha = mnew == A(-INFINITY) ? A(1) : exp(m[rr] - mnew);
      wp[rr * kTile + lane] = visible ? exp(sv - mnew) : A(0);
      m[rr] = mnew;
      l[rr] *= alpha;
FERRY_UNROLL
      for (int k = 0; k < P; ++k) o[rr][k] *= alpha;
    }
    __syncwarp();
    for (int c = 0; c < kTile; ++c) {
      A p[kRowsPerWarp];
FERRY_UNROLL
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        p[rr] = wp[rr * kTile + c];
        l[rr] += p[rr];
      }
      const A* vrow = vs + c * hs;
FERRY_UNROLL
      for (int k = 0; k < P; ++k) {
        const int d = lane + 32 * k;
        if (d < hs) {
          const A v = vrow[d];
FERRY_UNROLL
          for (int rr = 0; rr < kRowsPerWarp; ++rr) o[rr][k] += p[rr] * v;
        }
      }
    }
    __syncwarp();  // every lane has read the slice before the next tile writes it
  }
FERRY_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    if (i >= s.T) continue;
FERRY_UNROLL
    for (int k = 0; k < P; ++k) {
      const int d = lane + 32 * k;
      if (d < hs) st<A>(out, (b * s.T + i) * s.C + h * s.hs + d, o[rr][k] / l[rr]);
    }
    if (lane == 0) lse.set((b * s.NH + h) * s.T + i, m[rr] + log(l[rr]));
  }
}

// Backward, D = rowsum(dO * O) per (batch, head, position): one thread each.
template <class A, class X>
__global__ void flash_rowdot_kernel(A* D, X dout, X out, AttnShape s, int64_t B) {
  FERRY_FOR_EACH(n, B * s.T * s.NH) {
    const int64_t h = n % s.NH, bt = n / s.NH, b = bt / s.T, t = bt % s.T;
    A acc = 0;
    for (int64_t d = 0; d < s.hs; ++d) acc += dout[bt * s.C + h * s.hs + d] * out[bt * s.C + h * s.hs + d];
    D[(b * s.NH + h) * s.T + t] = acc;
  }
}

// Backward, dK and dV: one block per (key tile, key/value head, batch); each warp owns
// kRowsPerWarp keys and each lane a query of the current query tile. Over the group's query
// heads in order and the query tiles from the block's first key on: p = exp(scale q k - lse),
// ds = p (dO v - D) scale; dV += p dO, dK += ds q. Each key row is written once.
template <class A, class X, class Y, int P>
__global__ void flash_backward_kv_kernel(Arr dqkv, X dout, X qkv, Y lse, const A* D, AttnShape s,
                                         const int32_t* doc_start) {
  FERRY_DYNAMIC_SHARED(smem_raw);
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows = warps * kRowsPerWarp;  // keys per block
  const int pitch = static_cast<int>(s.hs) + 1, hs = static_cast<int>(s.hs);
  A* kt = reinterpret_cast<A*>(smem_raw);  // [rows][hs]   this block's keys
  A* vt = kt + rows * s.hs;                // [rows][hs]
  A* qs = vt + rows * s.hs;                // [kTile][hs + 1] the query tile
  A* gs = qs + kTile * pitch;                 // [kTile][hs + 1] its dO
  A* ps = gs + kTile * pitch;                 // [warps][kRowsPerWarp][kTile] p, then ds
  A* dss = ps + warps * kRowsPerWarp * kTile;
  const int64_t j0 = blockIdx.x * int64_t{rows}, kv = blockIdx.y, b = blockIdx.z;
  const A scale = A(1) / sqrt(static_cast<A>(s.hs));
  load_tile<A>(kt, static_cast<int>(s.hs), qkv, b * s.T, j0, rows, s.T, s.W, (s.NH + kv) * s.hs, s.hs);
  load_tile<A>(vt, static_cast<int>(s.hs), qkv, b * s.T, j0, rows, s.T, s.W, (s.NH + s.KVH + kv) * s.hs, s.hs);
  A gk[kRowsPerWarp][P], gv[kRowsPerWarp][P];
FERRY_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr)
FERRY_UNROLL
    for (int k = 0; k < P; ++k) gk[rr][k] = gv[rr][k] = 0;
  A* wp = ps + warp * kRowsPerWarp * kTile;
  A* wd = dss + warp * kRowsPerWarp * kTile;
  const A* k0 = kt + warp * kRowsPerWarp * s.hs;
  const A* v0 = vt + warp * kRowsPerWarp * s.hs;
  const int64_t jlast = imin(j0 + rows, s.T) - 1;
  for (int64_t h = kv * s.group; h < (kv + 1) * s.group; ++h) {
    for (int64_t i0 = j0 / kTile * kTile; i0 < s.T; i0 += kTile) {
      __syncthreads();  // the previous query tile has been read by every warp
      load_tile<A>(qs, pitch, qkv, b * s.T, i0, kTile, s.T, s.W, h * s.hs, s.hs);
      load_tile<A>(gs, pitch, dout, b * s.T, i0, kTile, s.T, s.C, h * s.hs, s.hs);
      __syncthreads();
      const int64_t i = i0 + lane;
      const bool in = i < s.T;
      const int64_t start = in ? first_key(doc_start, b, s.T, i) : s.T;
      const A L = in ? lse[(b * s.NH + h) * s.T + i] : A(0);
      const A Di = in ? D[(b * s.NH + h) * s.T + i] : A(0);
      A sc[kRowsPerWarp], dp[kRowsPerWarp];
FERRY_UNROLL
      for (int rr = 0; rr < kRowsPerWarp; ++rr) sc[rr] = dp[rr] = 0;
      const A* qrow = qs + lane * pitch;
      const A* grow = gs + lane * pitch;
      for (int d = 0; d < hs; ++d) {
        const A qd = qrow[d], gd = grow[d];
FERRY_UNROLL
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
          sc[rr] += qd * k0[rr * hs + d];
          dp[rr] += gd * v0[rr * hs + d];
        }
      }
FERRY_UNROLL
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const int64_t j = j0 + warp * kRowsPerWarp + rr;
        const bool visible = in && j <= jlast && j >= start && j <= i;
        const A p = visible ? exp(sc[rr] * scale - L) : A(0);
        wp[rr * kTile + lane] = p;
        wd[rr * kTile + lane] = p * (dp[rr] - Di) * scale;
      }
      __syncwarp();
      for (int c = 0; c < kTile; ++c) {
        A p[kRowsPerWarp], ds[kRowsPerWarp];
FERRY_UNROLL
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
          p[rr] = wp[rr * kTile + c];
          ds[rr] = wd[rr * kTile + c];
        }
FERRY_UNROLL
        for (int k = 0; k < P; ++k) {
          const int d = lane + 32 * k;
          if (d < hs) {
            const A qd = qs[c * pitch + d], gd = gs[c * pitch + d];
FERRY_UNROLL
            for (int rr = 0; rr < kRowsPerWarp; ++rr) {
              gv[rr][k] += p[rr] * gd;
              gk[rr][k] += ds[rr] * qd;
            }
          }
        }
      }
      __syncwarp();
    }
  }
FERRY_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t j = j0 + warp * kRowsPerWarp + rr;
    if (j >= s.T) continue;
FERRY_UNROLL
    for (int k = 0; k < P; ++k) {
      const int d = lane + 32 * k;
      if (d >= hs) continue;
      const int64_t k_at = (b * s.T + j) * s.W + (s.NH + kv) * s.hs + d;
      const int64_t v_at = (b * s.T + j) * s.W + (s.NH + s.KVH + kv) * s.hs + d;
      st<A>(dqkv, k_at, ld<A>(dqkv, k_at) + gk[rr][k]);
      st<A>(dqkv, v_at, ld<A>(dqkv, v_at) + gv[rr][k]);
    }
  }
}

// Backward, dQ: one block per (query tile, head, batch), largest first; each warp owns
// kRowsPerWarp queries and each lane a key of the current key tile: dQ += ds k.
template <class A, class X, class Y, int P>
__global__ void flash_backward_q_kernel(Arr dqkv, X dout, X qkv, Y lse, const A* D, AttnShape s,
                                        const int32_t* doc_start) {
  FERRY_DYNAMIC_SHARED(smem_raw);
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows = warps * kRowsPerWarp;
  const int pitch = static_cast<int>(s.hs) + 1, hs = static_cast<int>(s.hs);
  A* qt = reinterpret_cast<A*>(smem_raw);  // [rows][hs]
  A* gt = qt + rows * s.hs;                // [rows][hs]  dO
  A* ks = gt + rows * s.hs;                // [kTile][hs + 1]
  A* vs = ks + kTile * pitch;                 // [kTile][hs + 1]
  A* dss = vs + kTile * pitch;                // [warps][kRowsPerWarp][kTile]
  const int64_t tiles = gridDim.x;
  const int64_t i0 = (tiles - 1 - blockIdx.x) * rows, h = blockIdx.y, b = blockIdx.z, kv = h / s.group;
  const A scale = A(1) / sqrt(static_cast<A>(s.hs));
  load_tile<A>(qt, static_cast<int>(s.hs), qkv, b * s.T, i0, rows, s.T, s.W, h * s.hs, s.hs);
  load_tile<A>(gt, static_cast<int>(s.hs), dout, b * s.T, i0, rows, s.T, s.C, h * s.hs, s.hs);
  int64_t lo = i0;
  for (int r = 0; r < rows && i0 + r < s.T; ++r) lo = imin(lo, first_key(doc_start, b, s.T, i0 + r));
  const int64_t hi = imin(i0 + rows, s.T);
  A g[kRowsPerWarp][P], L[kRowsPerWarp], Di[kRowsPerWarp];
  int64_t start[kRowsPerWarp];
FERRY_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    const bool in = i < s.T;
    start[rr] = in ? first_key(doc_start, b, s.T, i) : s.T;
    L[rr] = in ? lse[(b * s.NH + h) * s.T + i] : A(0);
    Di[rr] = in ? D[(b * s.NH + h) * s.T + i] : A(0);
FERRY_UNROLL
    for (int k = 0; k < P; ++k) g[rr][k] = 0;
  }
  A* wd = dss + warp * kRowsPerWarp * kTile;
  const A* q0 = qt + warp * kRowsPerWarp * s.hs;
  const A* g0 = gt + warp * kRowsPerWarp * s.hs;
  for (int64_t j0 = lo / kTile * kTile; j0 < hi; j0 += kTile) {
    __syncthreads();
    load_tile<A>(ks, pitch, qkv, b * s.T, j0, kTile, s.T, s.W, (s.NH + kv) * s.hs, s.hs);
    load_tile<A>(vs, pitch, qkv, b * s.T, j0, kTile, s.T, s.W, (s.NH + s.KVH + kv) * s.hs, s.hs);
    __syncthreads();
    A sc[kRowsPerWarp], dp[kRowsPerWarp];
FERRY_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) sc[rr] = dp[rr] = 0;
    const A* krow = ks + lane * pitch;
    const A* vrow = vs + lane * pitch;
    for (int d = 0; d < hs; ++d) {
      const A kd = krow[d], vd = vrow[d];
FERRY_UNROLL
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        sc[rr] += q0[rr * hs + d] * kd;
        dp[rr] += g0[rr * hs + d] * vd;
      }
    }
    const int64_t j = j0 + lane;
FERRY_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t i = i0 + warp * kRowsPerWarp + rr;
      const bool visible = i < s.T && j >= start[rr] && j <= i;
      const A p = visible ? exp(sc[rr] * scale - L[rr]) : A(0);
      wd[rr * kTile + lane] = p * (dp[rr] - Di[rr]) * scale;
    }
    __syncwarp();
    for (int c = 0; c < kTile; ++c) {
      A ds[kRowsPerWarp];
FERRY_UNROLL
      for (int rr = 0; rr < kRowsPerWarp; ++rr) ds[rr] = wd[rr * kTile + c];
FERRY_UNROLL
      for (int k = 0; k < P; ++k) {
        const int d = lane + 32 * k;
        if (d < hs) {
          const A kd = ks[c * pitch + d];
FERRY_UNROLL
          for (int rr = 0; rr < kRowsPerWarp; ++rr) g[rr][k] += ds[rr] * kd;
        }
      }
    }
    __syncwarp();
  }
FERRY_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    if (i >= s.T) continue;
FERRY_UNROLL
    for (int k = 0; k < P; ++k) {
      const int d = lane + 32 * k;
      if (d >= hs) continue;
      const int64_t at = (b * s.T + i) * s.W + h * s.hs + d;
      st<A>(dqkv, at, ld<A>(dqkv, at) + g[rr][k]);
    }
  }
}

// Shared memory per block, in elements of A, for `warps` warps at head size hs.
int64_t forward_shared(int64_t warps, int64_t hs) {
  const int64_t rows = warps * kRowsPerWarp;
  return rows * hs + kTile * (hs + 1) + kTile * hs + rows * kTile;
}
int64_t backward_kv_shared(int64_t warps, int64_t hs) {
  const int64_t rows = warps * kRowsPerWarp;
  return 2 * rows * hs + 2 * kTile * (hs + 1) + 2 * rows * kTile;
}
int64_t backward_q_shared(int64_t warps, int64_t hs) {
  const int64_t rows = warps * kRowsPerWarp;
  return 2 * rows * hs + 2 * kTile * (hs + 1) + rows * kTile;
}

// Past 48 KiB per block (static + dynamic) a kernel must opt in; the flash kernels' shared
// memory depends on the head size alone (about 42 KB at hs = 128 with f32, 4 warps).
constexpr size_t kDefaultSharedBytes = 48 * 1024;

// The current device's cudaDevAttrMaxSharedMemoryPerBlockOptin, queried once per device.
size_t shared_optin_limit() {
#ifdef FERRY_CUDA_EMULATION  // tests change the emulated GPU's limit between launches
  int current = 0, limit = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&current));
  FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, current));
  return static_cast<size_t>(limit);
#else
  constexpr int kDevices = 64;
  static std::atomic<int> limits[kDevices];  // 0: not queried yet
  int device = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&device));
  std::atomic<int>* slot = device >= 0 && device < kDevices ? &limits[device] : nullptr;
  int v = slot != nullptr ? slot->load(std::memory_order_relaxed) : 0;
  if (v == 0) {
    FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (slot != nullptr) slot->store(v, std::memory_order_relaxed);
  }
  return static_cast<size_t>(v);
#endif
}

struct SharedFit {
  size_t dynamic, total;  // bytes: dynamic, and static + dynamic
};

// Checks one launch's shared memory against the device; throws std::invalid_argument
// naming the op, the head size, the bytes and the limit when it cannot fit.
template <class K>
SharedFit fit_shared(K kernel, size_t dynamic, const char* op, const AttnShape& s) {
  if (s.hs > kMaxHeadSize) {
    throw std::invalid_argument(std::string(op) + ": head size " + std::to_string(s.hs) +
                                " is above the attention kernels' limit of " +
                                std::to_string(kMaxHeadSize));
  }
  cudaFuncAttributes attr{};
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  const SharedFit fit{dynamic, attr.sharedSizeBytes + dynamic};
  const size_t limit = shared_optin_limit();
  if (fit.total > limit) {
    throw std::invalid_argument(
        std::string(op) + ": head size " + std::to_string(s.hs) + " needs " + std::to_string(fit.total) +
        " bytes of shared memory per block (static + dynamic), more than this GPU's limit of " +
        std::to_string(limit) + " bytes (cudaDevAttrMaxSharedMemoryPerBlockOptin)");
  }
  return fit;
}

// Opts the kernel in to its dynamic size when static + dynamic passes the default 48 KiB.
template <class K>
void opt_in_shared(K kernel, const SharedFit& fit) {
  if (fit.total > kDefaultSharedBytes) {
    FERRY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(fit.dynamic)));
  }
}

#include "nn/cuda_flash_wmma.cuh"

// The current device's compute capability major number (an attribute read: no
// synchronisation, cheap beside the launches it decides).
int compute_major() {
  int device = 0, v = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&device));
  FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, device));
  return v;
}

// Whether this launch runs the tensor-core kernels: `kernel` resolved against the operands
// (the activations `acts`, the statistics `lse`) and the GPU; tensor_cores asked where they
// cannot run is std::invalid_argument naming the op.
bool use_tensor_cores(AttentionKernel kernel, std::initializer_list<Arr> acts, Arr lse, int64_t hs, const char* op) {
  if (kernel == AttentionKernel::simt) return false;
  const DType t = acts.begin()->dtype;
  const bool same = std::all_of(acts.begin(), acts.end(), [t](const Arr& a) { return a.dtype == t; });
  const char* why = same ? tensor_core_attention_obstacle(t, lse.dtype, hs) : "activations of one dtype, bf16 or f16";
  if (why == nullptr) return true;
  if (kernel == AttentionKernel::tensor_cores) {
    throw std::invalid_argument(std::string(op) + ": device.attention_kernel is tensor_cores, which needs " + why +
                                " (here: activations " + std::string(dtype_name(t)) + ", statistics " + std::string(dtype_name(lse.dtype)) +
                                ", head size " + std::to_string(hs) + ")");
  }
  return false;
}

// Runs f(S{}) with S the 16-bit storage type of dtype t (bf16 or f16).
template <class F>
void by_half(DType t, F&& f) {
  if (t == DType::bf16) {
    f(__nv_bfloat16{});
  } else {
    f(__half{});
  }
}

// ---- Llama pieces, GELU, softmax, AdamW ------------------------------------------------------

template <class A>
__global__ void swiglu_forward_kernel(Arr out, Arr gate_up, int64_t N, int64_t H) {
  FERRY_FOR_EACH(i, N * H) {
    const int64_t n = i / H, h = i % H;
    const A g = ld<A>(gate_up, n * 2 * H + h), u = ld<A>(gate_up, n * 2 * H + H + h);
    st<A>(out, i, g / (A(1) + exp(-g)) * u);
  }
}

template <class A>
__global__ void swiglu_backward_kernel(Arr dgate_up, Arr gate_up, Arr dout, int64_t N, int64_t H) {
  FERRY_FOR_EACH(i, N * H) {
    const int64_t n = i / H, h = i % H;
    const int64_t gi = n * 2 * H + h, ui = gi + H;
    const A g = ld<A>(gate_up, gi), u = ld<A>(gate_up, ui), d = ld<A>(dout, i);
    const A sg = A(1) / (A(1) + exp(-g));
    st<A>(dgate_up, gi, ld<A>(dgate_up, gi) + d * u * sg * (A(1) + g * (A(1) - sg)));
    st<A>(dgate_up, ui, ld<A>(dgate_up, ui) + d * g * sg);
  }
}

// One thread per element of a row; the thread of the first half of a rotated pair computes
// both (in place is safe: it reads both before writing), the second half's does nothing.
template <class A>
__global__ void rope_kernel(Arr out, Arr inp, int64_t N, int64_t T, int64_t heads, int64_t hd,
                            int64_t width, Rope rope, bool inverse, bool accumulate) {
  const int64_t half = hd / 2;
  FERRY_FOR_EACH(e, N * width) {
    const int64_t n = e / width, c = e % width;
    if (c >= heads * hd) {
      if (accumulate) {
        st<A>(out, e, ld<A>(out, e) + ld<A>(inp, e));
      } else if (out.p != inp.p) {
        st<A>(out, e, ld<A>(inp, e));
      }
      continue;
    }
    const int64_t i = c % hd;
    if (i >= half) continue;
    // The angle in double, cos/sin rounded to A: the CPU kernel's table, entry by entry.
    const double a = static_cast<double>(n % T) *
                     rope.inv_freq(i, hd);
    const A cs = static_cast<A>(cos(a));
    const A sn = static_cast<A>(inverse ? -sin(a) : sin(a));
    const A x1 = ld<A>(inp, e), x2 = ld<A>(inp, e + half);
    const A y1 = x1 * cs - x2 * sn, y2 = x2 * cs + x1 * sn;
    if (accumulate) {
      st<A>(out, e, ld<A>(out, e) + y1);
      st<A>(out, e + half, ld<A>(out, e + half) + y2);
    } else {
      st<A>(out, e, y1);
      st<A>(out, e + half, y2);
    }
  }
}

constexpr double kGeluK = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluC = 0.044715;

template <class A>
__global__ void gelu_forward_kernel(Arr out, Arr inp, int64_t n) {
  FERRY_FOR_EACH(i, n) {
    const A x = ld<A>(inp, i);
    st<A>(out, i, A(0.5) * x * (A(1) + tanh(A(kGeluK) * (x + A(kGeluC) * x * x * x))));
  }
}

template <class A>
__global__ void gelu_backward_kernel(Arr dinp, Arr inp, Arr dout, int64_t n) {
  FERRY_FOR_EACH(i, n) {
    const A x = ld<A>(inp, i), d = ld<A>(dout, i);
    const A th = tanh(A(kGeluK) * (x + A(kGeluC) * x * x * x));
    const A g = A(0.5) * (A(1) + th) +
                A(0.5) * x * (A(1) - th * th) * A(kGeluK) * (A(1) + A(3 * kGeluC) * x * x);
    st<A>(dinp, i, ld<A>(dinp, i) + d * g);
  }
}

template <class A>
__global__ void softmax_xent_forward_kernel(Arr losses, Arr probs, Arr logits,
                                            const int32_t* targets, int64_t V, int* err) {
  __shared__ A scratch[32];
  const int64_t n = blockIdx.x, row = n * V;
  A mx = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const A l = ld<A>(logits, row + v);
    mx = l > mx ? l : mx;
  }
  mx = block_reduce(mx, scratch, Max{});
  A sum = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += exp(ld<A>(logits, row + v) - mx);
  sum = block_reduce(sum, scratch, Sum{});
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    st<A>(probs, row + v, exp(ld<A>(logits, row + v) - mx) / sum);
  if (threadIdx.x == 0) {
    const int32_t t = targets[n];
    if (t == kIgnoreTarget) {
      st<A>(losses, n, A(0));
    } else if (t < 0 || t >= V) {
      report(err, n, t);
    } else {
      st<A>(losses, n,
            log(sum) - (ld<A>(logits, row + t) - mx));  // log-sum-exp: exact where p underflows
    }
  }
}

template <class A>
__global__ void softmax_xent_backward_kernel(Arr dlogits, Arr probs, const int32_t* targets,
                                             int64_t N, int64_t V, A dloss) {
  FERRY_FOR_EACH(i, N * V) {
    const int64_t n = i / V, v = i % V;
    if (targets[n] == kIgnoreTarget) continue;
    const A onehot = v == targets[n] ? A(1) : A(0);
    st<A>(dlogits, i, ld<A>(dlogits, i) + dloss * (ld<A>(probs, i) - onehot));
  }
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n,
                             AdamWConstants k) {
  FERRY_FOR_EACH(i, n) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_element(k, pi, g[i], mi, vi);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

// Device scratch for one launcher's kernels, allocated and freed in stream order
// (cudaMallocAsync / cudaFreeAsync on the launch stream): no host synchronisation, and the
// memory is reused by the stream's pool as soon as the kernels that read it are done.
// (Whether the pool keeps it across synchronisations is the device's release threshold:
// GPU-REVIEW F14, set in nn/cuda_device.cpp.)
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

// The two passes of a column reduction of N rows of C columns into out0 (and out1 when
// Term::K = 2). Row chunks of kRowsPerLane rows per row lane, fewer and longer when the
// partials would pass kMaxPartials elements (C > 1M columns still gets one chunk).
template <class A, class Term>
void reduce_columns(cudaStream_t st, const Term& term, int64_t N, int64_t C, Arr out0, Arr out1) {
  constexpr int K = Term::K;
  if (N * C == 0) return;
  const int threads = block_threads();
  const int64_t rows_per_chunk = int64_t{threads / 32} * kRowsPerLane;
  const int64_t cap = std::clamp<int64_t>(kMaxPartials / (K * C), 1, kMaxChunks);
  int64_t chunks = std::min((N + rows_per_chunk - 1) / rows_per_chunk, cap);
  const int64_t chunk_rows = (N + chunks - 1) / chunks;
  chunks = (N + chunk_rows - 1) / chunk_rows;  // no empty chunk
  StreamScratch partial(st, static_cast<size_t>(K * chunks * C) * sizeof(A));
  const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks));
  A* const part = partial.get<A>();
  auto& pass1 = column_partials_kernel<A, Term>;  // a reference: FERRY_LAUNCH takes its address
  FERRY_LAUNCH(pass1, grid, threads, 0, st, term, N, C, chunk_rows, part);
  FERRY_CUDA_CHECK_LAUNCH();
  FERRY_LAUNCH(column_finish_kernel<A>, grid_for(K * C), threads, 0, st, out0, out1, K, part,
               chunks, C);
  FERRY_CUDA_CHECK_LAUNCH();
  partial.release();
}

}  // namespace

// ---- launchers --------------------------------------------------------------------------------
FERRY_CUDA_ABI_BEGIN

void cast(Stream s, Arr dst, Arr src, int64_t n) {
  if (n == 0) return;
  // i32 through double too: every i32 and every f32 is exact there.
  by_acc(wide(dst, src) || dst.dtype == DType::i32 || src.dtype == DType::i32, [&](auto a) {
    FERRY_LAUNCH(cast_kernel<decltype(a)>, grid_for(n), block_threads(), 0, as_stream(s), dst, src, n);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void fill(Stream s, Arr dst, double value, int64_t n) {
  if (n == 0) return;
  by_acc(wide(dst) || dst.dtype == DType::i32, [&](auto a) {
    using A = decltype(a);
    FERRY_LAUNCH(fill_kernel<A>, grid_for(n), block_threads(), 0, as_stream(s), dst, static_cast<A>(value),
                 n);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void add(Stream s, Arr out, Arr a, Arr b, int64_t n) {
  if (n == 0) return;
  by_acc(wide(out, a, b), [&](auto t) {
    FERRY_LAUNCH(add_kernel<decltype(t)>, grid_for(n), block_threads(), 0, as_stream(s), out, a, b, n);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void accumulate(Stream s, Arr dst, Arr src, int64_t n) {
  add(s, dst, dst, src, n);
}

void scale(Stream s, Arr x, double factor, int64_t n) {
  if (n == 0) return;
  by_acc(wide(x), [&](auto a) {
    using A = decltype(a);
    FERRY_LAUNCH(scale_kernel<A>, grid_for(n), block_threads(), 0, as_stream(s), x, static_cast<A>(factor),
                 n);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void add_bias(Stream s, Arr out, Arr bias, int64_t N, int64_t C) {
  if (N * C == 0) return;
  by_acc(wide(out, bias), [&](auto a) {
    FERRY_LAUNCH(add_bias_kernel<decltype(a)>, grid_for(N * C), block_threads(), 0, as_stream(s), out,
                 bias, N, C);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void column_sums(Stream s, Arr dst, Arr src, int64_t N, int64_t C) {
  by_acc(wide(dst, src), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({src}, {}, [&](auto x, auto) {
      using X = Operand<A, typename decltype(x)::type>;
      reduce_columns<A>(as_stream(s), ColumnSumTerm<A, X>{X(src)}, N, C, dst, Arr{});
    });
  });
}

void sum_squares(Stream s, Arr x, int64_t n, double* partial) {
  FERRY_LAUNCH(sum_squares_kernel<double>, kSumSquaresBlocks, block_threads(), 0, as_stream(s), x, n,
               partial);
  FERRY_CUDA_CHECK_LAUNCH();
  FERRY_LAUNCH(sum_partials_kernel, 1, 32, 0, as_stream(s), partial, kSumSquaresBlocks);
  FERRY_CUDA_CHECK_LAUNCH();
}

void embedding_forward(Stream s, Arr out, const int32_t* tokens, Arr wte, Arr wpe, int64_t N,
                       int64_t T, int64_t C, int64_t V, int* err) {
  if (N * C == 0) return;
  by_acc(wide(out, wte, wpe), [&](auto a) {
    FERRY_LAUNCH(embedding_forward_kernel<decltype(a)>, grid_for(N * C), block_threads(), 0, as_stream(s),
                 out, tokens, wte, wpe, N, T, C, V, err);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void embedding_backward(Stream s, Arr dwte, Arr dwpe, Arr dout, const int32_t* tokens, int64_t N,
                        int64_t T, int64_t C) {
  if (N * C == 0) return;
  by_acc(wide(dwte, dwpe, dout), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({dout}, {dwte}, [&](auto x, auto y) {
      using X = Operand<A, typename decltype(x)::type>;
      using Y = Operand<A, typename decltype(y)::type>;
      // Enough blocks to fill a GPU, not so many that the N-token scans add up (see the kernel).
      const auto blocks = static_cast<unsigned>(std::clamp<int64_t>((N + 15) / 16, 1, 512));
      auto& wte_kernel = embedding_backward_wte_kernel<A, X, Y>;
      const Y wte(dwte);
      const X grad(dout);
      FERRY_LAUNCH(wte_kernel, blocks, block_threads(), 0, as_stream(s), wte, grad, tokens, N, C);
      FERRY_CUDA_CHECK_LAUNCH();
      // dwpe[t, c] += sum over b of dout[b T + t, c]: the column sums of dout as [N / T, T C].
      reduce_columns<A>(as_stream(s), ColumnSumTerm<A, X>{X(dout)}, N / T, T * C, dwpe, Arr{});
    });
  });
}

void layernorm_forward(Stream s, Arr out, Arr mean, Arr rstd, Arr inp, Arr w, Arr b, int64_t N,
                       int64_t C) {
  if (N == 0) return;
  by_acc(wide(out, mean, rstd, inp, w, b), [&](auto a) {
    FERRY_LAUNCH(layernorm_forward_kernel<decltype(a)>, static_cast<unsigned>(N), block_threads(), 0,
                 as_stream(s), out, mean, rstd, inp, w, b, C);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(Stream s, Arr dinp, Arr dw, Arr db, Arr dout, Arr inp, Arr w, Arr mean,
                        Arr rstd, int64_t N, int64_t C) {
  if (N == 0) return;
  by_acc(wide(dinp, dw, db, dout, inp, w, mean, rstd), [&](auto a) {
    using A = decltype(a);
    FERRY_LAUNCH(layernorm_backward_rows_kernel<A>, static_cast<unsigned>(N), block_threads(), 0,
                 as_stream(s), dinp, dout, inp, w, mean, rstd, C);
    FERRY_CUDA_CHECK_LAUNCH();
    by_storage<A>({dout, inp}, {mean, rstd}, [&](auto x, auto y) {
      using X = Operand<A, typename decltype(x)::type>;
      using Y = Operand<A, typename decltype(y)::type>;
      reduce_columns<A>(as_stream(s),
                        LayerNormParamsTerm<A, X, Y>{X(dout), X(inp), Y(mean), Y(rstd)}, N, C, dw,
                        db);
    });
  });
}

void rmsnorm_forward(Stream s, Arr out, Arr rstd, Arr inp, Arr w, int64_t N, int64_t C,
                     double eps) {
  if (N == 0) return;
  by_acc(wide(out, rstd, inp, w), [&](auto a) {
    FERRY_LAUNCH(rmsnorm_forward_kernel<decltype(a)>, static_cast<unsigned>(N), block_threads(), 0,
                 as_stream(s), out, rstd, inp, w, C, eps);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(Stream s, Arr dinp, Arr dw, Arr dout, Arr inp, Arr w, Arr rstd, int64_t N,
                      int64_t C) {
  if (N == 0) return;
  by_acc(wide(dinp, dw, dout, inp, w, rstd), [&](auto a) {
    using A = decltype(a);
    FERRY_LAUNCH(rmsnorm_backward_rows_kernel<A>, static_cast<unsigned>(N), block_threads(), 0,
                 as_stream(s), dinp, dout, inp, w, rstd, C);
    FERRY_CUDA_CHECK_LAUNCH();
    by_storage<A>({dout, inp}, {rstd}, [&](auto x, auto y) {
      using X = Operand<A, typename decltype(x)::type>;
      using Y = Operand<A, typename decltype(y)::type>;
      reduce_columns<A>(as_stream(s), RmsNormParamsTerm<A, X, Y>{X(dout), X(inp), Y(rstd)}, N, C,
                        dw, Arr{});
    });
  });
}

namespace {

enum class TcPass { forward, kv, q };

int64_t tc_shared_bytes(TcPass pass, int warps, int64_t hs) {
  const int64_t hp = tc_pad(hs), elem = 2;  // bf16 and f16 alike
  return pass == TcPass::forward ? tc_forward_layout(warps, hp, elem).bytes
                                 : tc_backward_layout(pass == TcPass::kv, warps, hp, elem).bytes;
}

// Warps per block of a tensor-core pass: the attention kernels' block size, halved until
// its shared memory fits the GPU (an A100's 163 KB takes the dK/dV pass at head size 128
// with 2 warps); 0 when not even one warp fits.
int tc_warps(TcPass pass, int64_t hs) {
  const size_t limit = shared_optin_limit();
  for (int w = attn_threads() / 32; w >= 1; w /= 2) {
    if (static_cast<size_t>(tc_shared_bytes(pass, w, hs)) <= limit) return w;
  }
  return 0;
}

}  // namespace

const char* tensor_core_attention_obstacle(DType act, DType stats, int64_t hs) {
  if (act != DType::bf16 && act != DType::f16) return "bf16 or f16 activations";
  if (stats != DType::f32) return "f32 statistics";
  if (tc_pad(hs) > kTcMaxHead) return "a head size of at most 128";
  if (compute_major() < 8) return "a GPU of compute capability 8.0 or above";
  // A build for older GPUs (CMAKE_CUDA_ARCHITECTURES below 80) compiles the kernels' bodies
  // out; run through the PTX JIT on a newer GPU they would trap: what runs here must be 8.0 code.
  cudaFuncAttributes attr{};
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&attr, flash_forward_tc_kernel<__nv_bfloat16>));
  if (attr.ptxVersion < 80) return "a build with kernels for compute capability 8.0 or above (CMAKE_CUDA_ARCHITECTURES)";
  for (TcPass p : {TcPass::forward, TcPass::kv, TcPass::q}) {
    if (tc_warps(p, hs) == 0) return "more shared memory per block than this GPU has";
  }
  return nullptr;
}

void attention_forward(Stream s, Arr out, Arr lse, Arr qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, int64_t KVH, const int32_t* doc_start, AttentionKernel kernel) {
  if (B * T == 0) return;
  const AttnShape sh = attn_shape(T, C, NH, KVH);
  const int threads = attn_threads(), warps = threads / 32, rows = warps * kRowsPerWarp;
  if (use_tensor_cores(kernel, {qkv, out}, lse, sh.hs, "attention_forward")) {
    by_half(qkv.dtype, [&](auto tag) {
      using S = decltype(tag);
      auto& k = flash_forward_tc_kernel<S>;
      const int w = tc_warps(TcPass::forward, sh.hs), tc_rows = w * kTcRowsPerWarp;
      const SharedFit fit =
          fit_shared(k, static_cast<size_t>(tc_shared_bytes(TcPass::forward, w, sh.hs)), "attention_forward", sh);
      opt_in_shared(k, fit);
      const dim3 grid(static_cast<unsigned>((T + tc_rows - 1) / tc_rows), static_cast<unsigned>(NH),
                      static_cast<unsigned>(B));
      FERRY_LAUNCH(k, grid, w * 32, fit.dynamic, as_stream(s), out, Operand<float, float>(lse),
                   static_cast<const S*>(qkv.p), sh, doc_start);
    });
    FERRY_CUDA_CHECK_LAUNCH();
    return;
  }
  by_acc(wide(out, lse, qkv), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({qkv}, {lse}, [&](auto x, auto y) {
      using X = Operand<A, typename decltype(x)::type>;
      using Y = Operand<A, typename decltype(y)::type>;
      by_lanes(sh.hs, [&](auto lanes) {
        // A reference: the opt-in's key is the kernel's address.
        auto& kernel = flash_forward_kernel<A, X, Y, decltype(lanes)::value>;
        const SharedFit fit = fit_shared(kernel, static_cast<size_t>(forward_shared(warps, sh.hs)) * sizeof(A),
                                         "attention_forward", sh);
        opt_in_shared(kernel, fit);
        const dim3 grid(static_cast<unsigned>((T + rows - 1) / rows), static_cast<unsigned>(NH),
                        static_cast<unsigned>(B));
        FERRY_LAUNCH(kernel, grid, threads, fit.dynamic, as_stream(s), out, Y(lse), X(qkv), sh, doc_start);
      });
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void attention_backward(Stream s, Arr dqkv, Arr dout, Arr qkv, Arr out, Arr lse, int64_t B, int64_t T,
                        int64_t C, int64_t NH, int64_t KVH, const int32_t* doc_start, void* rowdot,
                        AttentionKernel kernel) {
  if (B * T == 0) return;
  const AttnShape sh = attn_shape(T, C, NH, KVH);
  const int threads = attn_threads(), warps = threads / 32, rows = warps * kRowsPerWarp;
  if (use_tensor_cores(kernel, {qkv, dout, out}, lse, sh.hs, "attention_backward")) {
    by_half(qkv.dtype, [&](auto tag) {
      using S = decltype(tag);
      using X = Operand<float, S>;
      auto& kv_kernel = flash_backward_kv_tc_kernel<S>;
      auto& q_kernel = flash_backward_q_tc_kernel<S>;
      const int w_kv = tc_warps(TcPass::kv, sh.hs), w_q = tc_warps(TcPass::q, sh.hs);
      // Both checked before the first launch: a failure leaves dqkv untouched.
      const SharedFit fit_kv = fit_shared(kv_kernel, static_cast<size_t>(tc_shared_bytes(TcPass::kv, w_kv, sh.hs)),
                                          "attention_backward", sh);
      const SharedFit fit_q = fit_shared(q_kernel, static_cast<size_t>(tc_shared_bytes(TcPass::q, w_q, sh.hs)),
                                         "attention_backward", sh);
      opt_in_shared(kv_kernel, fit_kv);
      opt_in_shared(q_kernel, fit_q);
      float* D = static_cast<float*>(rowdot);
      auto& rowdot_kernel = flash_rowdot_kernel<float, X>;
      FERRY_LAUNCH(rowdot_kernel, grid_for(B * T * NH), block_threads(), 0, as_stream(s), D, X(dout), X(out), sh, B);
      FERRY_CUDA_CHECK_LAUNCH();
      auto tiles = [T](int w) { return static_cast<unsigned>((T + w * kTcRowsPerWarp - 1) / (w * kTcRowsPerWarp)); };
      const S* q = static_cast<const S*>(qkv.p);
      const S* g = static_cast<const S*>(dout.p);
      const float* L = static_cast<const float*>(lse.p);
      FERRY_LAUNCH(kv_kernel, dim3(tiles(w_kv), static_cast<unsigned>(KVH), static_cast<unsigned>(B)), w_kv * 32,
                   fit_kv.dynamic, as_stream(s), dqkv, g, q, L, static_cast<const float*>(D), sh, doc_start);
      FERRY_CUDA_CHECK_LAUNCH();
      FERRY_LAUNCH(q_kernel, dim3(tiles(w_q), static_cast<unsigned>(NH), static_cast<unsigned>(B)), w_q * 32,
                   fit_q.dynamic, as_stream(s), dqkv, g, q, L, static_cast<const float*>(D), sh, doc_start);
    });
    FERRY_CUDA_CHECK_LAUNCH();
    return;
  }
  by_acc(wide(dqkv, dout, qkv, out, lse), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({qkv, dout, out}, {lse}, [&](auto x, auto y) {
      using X = Operand<A, typename decltype(x)::type>;
      using Y = Operand<A, typename decltype(y)::type>;
      A* D = static_cast<A*>(rowdot);
      by_lanes(sh.hs, [&](auto lanes) {
        constexpr int P = decltype(lanes)::value;
        auto& kv_kernel = flash_backward_kv_kernel<A, X, Y, P>;
        auto& q_kernel = flash_backward_q_kernel<A, X, Y, P>;
        // Both checked before the first launch: a failure leaves dqkv untouched.
        const SharedFit fit_kv = fit_shared(
            kv_kernel, static_cast<size_t>(backward_kv_shared(warps, sh.hs)) * sizeof(A), "attention_backward", sh);
        const SharedFit fit_q = fit_shared(
            q_kernel, static_cast<size_t>(backward_q_shared(warps, sh.hs)) * sizeof(A), "attention_backward", sh);
        opt_in_shared(kv_kernel, fit_kv);
        opt_in_shared(q_kernel, fit_q);
        auto& rowdot_kernel = flash_rowdot_kernel<A, X>;
        FERRY_LAUNCH(rowdot_kernel, grid_for(B * T * NH), block_threads(), 0, as_stream(s), D, X(dout), X(out), sh, B);
        FERRY_CUDA_CHECK_LAUNCH();
        const unsigned tiles = static_cast<unsigned>((T + rows - 1) / rows);
        FERRY_LAUNCH(kv_kernel, dim3(tiles, static_cast<unsigned>(KVH), static_cast<unsigned>(B)), threads,
                     fit_kv.dynamic, as_stream(s), dqkv, X(dout), X(qkv), Y(lse), D, sh, doc_start);
        FERRY_CUDA_CHECK_LAUNCH();
        FERRY_LAUNCH(q_kernel, dim3(tiles, static_cast<unsigned>(NH), static_cast<unsigned>(B)), threads,
                     fit_q.dynamic, as_stream(s), dqkv, X(dout), X(qkv), Y(lse), D, sh, doc_start);
      });
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void swiglu_forward(Stream s, Arr out, Arr gate_up, int64_t N, int64_t H) {
  if (N * H == 0) return;
  by_acc(wide(out, gate_up), [&](auto a) {
    FERRY_LAUNCH(swiglu_forward_kernel<decltype(a)>, grid_for(N * H), block_threads(), 0, as_stream(s),
                 out, gate_up, N, H);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(Stream s, Arr dgate_up, Arr gate_up, Arr dout, int64_t N, int64_t H) {
  if (N * H == 0) return;
  by_acc(wide(dgate_up, gate_up, dout), [&](auto a) {
    FERRY_LAUNCH(swiglu_backward_kernel<decltype(a)>, grid_for(N * H), block_threads(), 0, as_stream(s),
                 dgate_up, gate_up, dout, N, H);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void rope(Stream s, Arr out, Arr inp, int64_t N, int64_t T, int64_t heads, int64_t hd,
          int64_t width, const Rope& rope, bool inverse, bool accumulate) {
  if (N * width == 0) return;
  by_acc(wide(out, inp), [&](auto a) {
    FERRY_LAUNCH(rope_kernel<decltype(a)>, grid_for(N * width), block_threads(), 0, as_stream(s), out, inp,
                 N, T, heads, hd, width, rope, inverse, accumulate);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void gelu_forward(Stream s, Arr out, Arr inp, int64_t n) {
  if (n == 0) return;
  by_acc(wide(out, inp), [&](auto a) {
    FERRY_LAUNCH(gelu_forward_kernel<decltype(a)>, grid_for(n), block_threads(), 0, as_stream(s), out, inp,
                 n);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void gelu_backward(Stream s, Arr dinp, Arr inp, Arr dout, int64_t n) {
  if (n == 0) return;
  by_acc(wide(dinp, inp, dout), [&](auto a) {
    FERRY_LAUNCH(gelu_backward_kernel<decltype(a)>, grid_for(n), block_threads(), 0, as_stream(s), dinp,
                 inp, dout, n);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void softmax_cross_entropy_forward(Stream s, Arr losses, Arr probs, Arr logits,
                                   const int32_t* targets, int64_t N, int64_t V, int* err) {
  if (N == 0) return;
  by_acc(wide(losses, probs, logits), [&](auto a) {
    FERRY_LAUNCH(softmax_xent_forward_kernel<decltype(a)>, static_cast<unsigned>(N), block_threads(), 0,
                 as_stream(s), losses, probs, logits, targets, V, err);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void softmax_cross_entropy_backward(Stream s, Arr dlogits, Arr probs, const int32_t* targets,
                                    int64_t N, int64_t V, double dloss) {
  if (N * V == 0) return;
  by_acc(wide(dlogits, probs), [&](auto a) {
    using A = decltype(a);
    FERRY_LAUNCH(softmax_xent_backward_kernel<A>, grid_for(N * V), block_threads(), 0, as_stream(s),
                 dlogits, probs, targets, N, V, static_cast<A>(dloss));
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void adamw(Stream s, float* p, const float* g, float* m, float* v, int64_t n,
           const AdamWConstants& k) {
  if (n == 0) return;
  FERRY_LAUNCH(adamw_kernel, grid_for(n), block_threads(), 0, as_stream(s), p, g, m, v, n, k);
  FERRY_CUDA_CHECK_LAUNCH();
}

#ifdef FERRY_CUDA_EMULATION
void set_emulated_block_threads(int generic, int attention) {
  for (int t : {generic, attention}) {
    if (t < 32 || t > kMaxThreads || t % 32 != 0) {
      throw std::invalid_argument("set_emulated_block_threads: " + std::to_string(t) +
                                  " threads per block; multiples of 32 in [32, " +
                                  std::to_string(kMaxThreads) + "] only");
    }
  }
  emulated_threads = generic;
  emulated_attn_threads = attention;
}
#endif

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
