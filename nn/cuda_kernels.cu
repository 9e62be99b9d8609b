// Kernels of the CUDA device; the contract is in nn/cuda_kernels.h. Written for clarity
// first: one block per row for the row reductions, one thread per element elsewhere, and
// attention as two row kernels that recompute what they need instead of storing a second
// [B,NH,T,T] tensor. GEMMs, the bulk of the FLOPs, are cuBLAS's (nn/cuda_device.cpp).
#include "nn/cuda_kernels.h"

#include <algorithm>

#include "nn/cuda_check.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
// Every launch goes through this macro so that the emulation can run the same lines; the
// CPU emulation of tests (testing/cuda_emulation.h, through testing/cuda_shim) defines its own.
#ifndef FERRY_LAUNCH
#define FERRY_LAUNCH(kernel, grid, block, smem, stream, ...) \
  kernel<<<grid, block, smem, stream>>>(__VA_ARGS__)
#define FERRY_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#endif

namespace ferry::nn::cuda {

namespace {

// Threads per block: multiples of the warp size (block reductions assume it). The CPU
// emulation runs a block's threads as host threads, so it uses fewer; two warps still
// exercise the reductions across warps.
#ifdef FERRY_CUDA_EMULATION
constexpr int kThreads = 64;
constexpr int kAttnThreads = 64;
#else
constexpr int kThreads = 256;
constexpr int kAttnThreads = 128;  // attention's row kernels: rows of T scores and hs channels
#endif

cudaStream_t as_stream(Stream s) {
  return static_cast<cudaStream_t>(s);
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
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

// dst[c] += sum over rows, in row order, one thread per column (coalesced across threads).
template <class A>
__global__ void column_sums_kernel(Arr dst, Arr src, int64_t N, int64_t C) {
  FERRY_FOR_EACH(c, C) {
    A s = 0;
    for (int64_t n = 0; n < N; ++n) s += ld<A>(src, n * C + c);
    st<A>(dst, c, ld<A>(dst, c) + s);
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

// Rows sharing a token add into one dwte row: each thread owns a column and walks the rows
// in order (the CPU kernel's order), so nothing collides and the sums are deterministic.
template <class A>
__global__ void embedding_backward_wte_kernel(Arr dwte, Arr dout, const int32_t* tokens, int64_t N,
                                              int64_t C) {
  FERRY_FOR_EACH(c, C) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t at = int64_t{tokens[n]} * C + c;
      st<A>(dwte, at, ld<A>(dwte, at) + ld<A>(dout, n * C + c));
    }
  }
}

template <class A>
__global__ void embedding_backward_wpe_kernel(Arr dwpe, Arr dout, int64_t N, int64_t T, int64_t C) {
  FERRY_FOR_EACH(i, T * C) {
    const int64_t t = i / C, c = i % C;
    A s = 0;
    for (int64_t n = t; n < N; n += T) s += ld<A>(dout, n * C + c);
    st<A>(dwpe, i, ld<A>(dwpe, i) + s);
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
__global__ void layernorm_backward_params_kernel(Arr dw, Arr db, Arr dout, Arr inp, Arr mean,
                                                 Arr rstd, int64_t N, int64_t C) {
  FERRY_FOR_EACH(c, C) {
    A sw = 0, sb = 0;
    for (int64_t n = 0; n < N; ++n) {
      const A d = ld<A>(dout, n * C + c);
      sw += (ld<A>(inp, n * C + c) - ld<A>(mean, n)) * ld<A>(rstd, n) * d;
      sb += d;
    }
    st<A>(dw, c, ld<A>(dw, c) + sw);
    st<A>(db, c, ld<A>(db, c) + sb);
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

template <class A>
__global__ void rmsnorm_backward_params_kernel(Arr dw, Arr dout, Arr inp, Arr rstd, int64_t N,
                                               int64_t C) {
  FERRY_FOR_EACH(c, C) {
    A s = 0;
    for (int64_t n = 0; n < N; ++n)
      s += ld<A>(inp, n * C + c) * ld<A>(rstd, n) * ld<A>(dout, n * C + c);
    st<A>(dw, c, ld<A>(dw, c) + s);
  }
}

// ---- attention -----------------------------------------------------------------------------
// qkv rows: q (NH heads) | k (KVH heads) | v (KVH heads), hs channels each; W = (NH+2KVH) hs.

struct AttnShape {
  int64_t T, C, NH, KVH, hs, W, group;
};

AttnShape attn_shape(int64_t T, int64_t C, int64_t NH, int64_t KVH) {
  const int64_t hs = C / NH;
  return {T, C, NH, KVH, hs, (NH + 2 * KVH) * hs, NH / KVH};
}

// One block per query row (i, h, b): scores over the causal prefix, softmax, then the
// weighted sum of values. Dynamic shared memory: T scores and the q row.
template <class A>
__global__ void attention_forward_kernel(Arr out, Arr att, Arr qkv, AttnShape s, const int32_t* doc_start) {
  FERRY_DYNAMIC_SHARED(smem_raw);
  A* score = reinterpret_cast<A*>(smem_raw);
  A* q = score + s.T;
  __shared__ A scratch[32];
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kv = h / s.group;
  const int64_t base = b * s.T * s.W;
  const int64_t j0 = doc_start ? doc_start[b * s.T + i] : 0;  // the first key of this row's document
  const A scale = A(1) / sqrt(static_cast<A>(s.hs));
  for (int64_t d = threadIdx.x; d < s.hs; d += blockDim.x)
    q[d] = ld<A>(qkv, base + i * s.W + h * s.hs + d);
  __syncthreads();
  A mx = -INFINITY;
  for (int64_t j = j0 + threadIdx.x; j <= i; j += blockDim.x) {
    A dot = 0;
    const int64_t krow = base + j * s.W + (s.NH + kv) * s.hs;
    for (int64_t d = 0; d < s.hs; ++d) dot += q[d] * ld<A>(qkv, krow + d);
    score[j] = dot * scale;
    mx = score[j] > mx ? score[j] : mx;
  }
  mx = block_reduce(mx, scratch, Max{});
  A sum = 0;
  for (int64_t j = j0 + threadIdx.x; j <= i; j += blockDim.x) {
    score[j] = exp(score[j] - mx);
    sum += score[j];
  }
  sum = block_reduce(sum, scratch, Sum{});
  const int64_t arow = ((b * s.NH + h) * s.T + i) * s.T;
  for (int64_t j = threadIdx.x; j < s.T; j += blockDim.x) {
    if (j >= j0 && j <= i) score[j] /= sum;
    st<A>(att, arow + j, j >= j0 && j <= i ? score[j] : A(0));
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < s.hs; d += blockDim.x) {
    A o = 0;
    for (int64_t j = j0; j <= i; ++j)
      o += score[j] * ld<A>(qkv, base + j * s.W + (s.NH + s.KVH + kv) * s.hs + d);
    st<A>(out, (b * s.T + i) * s.C + h * s.hs + d, o);
  }
}

// Backward, part 1: one block per query row. dP[j] = dO_i . v_j, dot = sum_j P_ij dP_j,
// dS_ij = P_ij (dP_j - dot) scale; dQ_i += sum_j dS_ij k_j. `dot` is kept for part 2.
template <class A>
__global__ void attention_backward_query_kernel(Arr dqkv, Arr dout, Arr qkv, Arr att, AttnShape s,
                                                A* rowdot) {
  FERRY_DYNAMIC_SHARED(smem_raw);
  A* ds = reinterpret_cast<A*>(smem_raw);
  A* dO = ds + s.T;
  __shared__ A scratch[32];
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kv = h / s.group;
  const int64_t base = b * s.T * s.W;
  const int64_t arow = ((b * s.NH + h) * s.T + i) * s.T;
  const A scale = A(1) / sqrt(static_cast<A>(s.hs));
  for (int64_t d = threadIdx.x; d < s.hs; d += blockDim.x)
    dO[d] = ld<A>(dout, (b * s.T + i) * s.C + h * s.hs + d);
  __syncthreads();
  A dot = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    A dp = 0;
    const int64_t vrow = base + j * s.W + (s.NH + s.KVH + kv) * s.hs;
    for (int64_t d = 0; d < s.hs; ++d) dp += dO[d] * ld<A>(qkv, vrow + d);
    ds[j] = dp;
    dot += ld<A>(att, arow + j) * dp;
  }
  dot = block_reduce(dot, scratch, Sum{});
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x)
    ds[j] = ld<A>(att, arow + j) * (ds[j] - dot) * scale;
  if (threadIdx.x == 0) rowdot[(b * s.NH + h) * s.T + i] = dot;
  __syncthreads();
  for (int64_t d = threadIdx.x; d < s.hs; d += blockDim.x) {
    A g = 0;
    for (int64_t j = 0; j <= i; ++j)
      g += ds[j] * ld<A>(qkv, base + j * s.W + (s.NH + kv) * s.hs + d);
    const int64_t at = base + i * s.W + h * s.hs + d;
    st<A>(dqkv, at, ld<A>(dqkv, at) + g);
  }
}

// Backward, part 2: one block per key row (j, kv head, b), over the query heads of its
// group in order: dK_j += sum_{i>=j} dS_ij q_i, dV_j += sum_{i>=j} P_ij dO_i, with dS
// recomputed from part 1's `dot`. Each key row is written once: no collisions.
template <class A>
__global__ void attention_backward_key_kernel(Arr dqkv, Arr dout, Arr qkv, Arr att, AttnShape s,
                                              const A* rowdot) {
  FERRY_DYNAMIC_SHARED(smem_raw);
  A* ds = reinterpret_cast<A*>(smem_raw);
  A* p = ds + s.T;
  A* vj = p + s.T;
  A* acc_k = vj + s.hs;
  A* acc_v = acc_k + s.hs;
  const int64_t j = blockIdx.x, kv = blockIdx.y, b = blockIdx.z;
  const int64_t base = b * s.T * s.W;
  const A scale = A(1) / sqrt(static_cast<A>(s.hs));
  for (int64_t d = threadIdx.x; d < s.hs; d += blockDim.x) {
    vj[d] = ld<A>(qkv, base + j * s.W + (s.NH + s.KVH + kv) * s.hs + d);
    acc_k[d] = 0;
    acc_v[d] = 0;
  }
  __syncthreads();
  for (int64_t h = kv * s.group; h < (kv + 1) * s.group; ++h) {
    for (int64_t i = j + threadIdx.x; i < s.T; i += blockDim.x) {
      const int64_t orow = (b * s.T + i) * s.C + h * s.hs;
      A dp = 0;
      for (int64_t d = 0; d < s.hs; ++d) dp += ld<A>(dout, orow + d) * vj[d];
      const A pij = ld<A>(att, ((b * s.NH + h) * s.T + i) * s.T + j);
      p[i] = pij;
      ds[i] = pij * (dp - rowdot[(b * s.NH + h) * s.T + i]) * scale;
    }
    __syncthreads();
    for (int64_t d = threadIdx.x; d < s.hs; d += blockDim.x) {
      A gk = 0, gv = 0;
      for (int64_t i = j; i < s.T; ++i) {
        gk += ds[i] * ld<A>(qkv, base + i * s.W + h * s.hs + d);
        gv += p[i] * ld<A>(dout, (b * s.T + i) * s.C + h * s.hs + d);
      }
      acc_k[d] += gk;
      acc_v[d] += gv;
    }
    __syncthreads();
  }
  for (int64_t d = threadIdx.x; d < s.hs; d += blockDim.x) {
    const int64_t k_at = base + j * s.W + (s.NH + kv) * s.hs + d;
    const int64_t v_at = base + j * s.W + (s.NH + s.KVH + kv) * s.hs + d;
    st<A>(dqkv, k_at, ld<A>(dqkv, k_at) + acc_k[d]);
    st<A>(dqkv, v_at, ld<A>(dqkv, v_at) + acc_v[d]);
  }
}

// Attention's row kernels take more than the default 48 KiB of shared memory for long
// sequences; opting in is per kernel.
template <class K>
void allow_shared(K kernel, size_t bytes) {
  if (bytes > 48 * 1024) {
    FERRY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes)));
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

}  // namespace

// ---- launchers --------------------------------------------------------------------------------
FERRY_CUDA_ABI_BEGIN

void cast(Stream s, Arr dst, Arr src, int64_t n) {
  if (n == 0) return;
  // i32 through double too: every i32 and every f32 is exact there.
  by_acc(wide(dst, src) || dst.dtype == DType::i32 || src.dtype == DType::i32, [&](auto a) {
    FERRY_LAUNCH(cast_kernel<decltype(a)>, grid_for(n), kThreads, 0, as_stream(s), dst, src, n);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void fill(Stream s, Arr dst, double value, int64_t n) {
  if (n == 0) return;
  by_acc(wide(dst) || dst.dtype == DType::i32, [&](auto a) {
    using A = decltype(a);
    FERRY_LAUNCH(fill_kernel<A>, grid_for(n), kThreads, 0, as_stream(s), dst, static_cast<A>(value),
                 n);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void add(Stream s, Arr out, Arr a, Arr b, int64_t n) {
  if (n == 0) return;
  by_acc(wide(out, a, b), [&](auto t) {
    FERRY_LAUNCH(add_kernel<decltype(t)>, grid_for(n), kThreads, 0, as_stream(s), out, a, b, n);
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
    FERRY_LAUNCH(scale_kernel<A>, grid_for(n), kThreads, 0, as_stream(s), x, static_cast<A>(factor),
                 n);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void add_bias(Stream s, Arr out, Arr bias, int64_t N, int64_t C) {
  if (N * C == 0) return;
  by_acc(wide(out, bias), [&](auto a) {
    FERRY_LAUNCH(add_bias_kernel<decltype(a)>, grid_for(N * C), kThreads, 0, as_stream(s), out,
                 bias, N, C);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void column_sums(Stream s, Arr dst, Arr src, int64_t N, int64_t C) {
  if (C == 0) return;
  by_acc(wide(dst, src), [&](auto a) {
    FERRY_LAUNCH(column_sums_kernel<decltype(a)>, grid_for(C), kThreads, 0, as_stream(s), dst, src,
                 N, C);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void sum_squares(Stream s, Arr x, int64_t n, double* partial) {
  FERRY_LAUNCH(sum_squares_kernel<double>, kSumSquaresBlocks, kThreads, 0, as_stream(s), x, n,
               partial);
  FERRY_CUDA_CHECK_LAUNCH();
  FERRY_LAUNCH(sum_partials_kernel, 1, 32, 0, as_stream(s), partial, kSumSquaresBlocks);
  FERRY_CUDA_CHECK_LAUNCH();
}

void embedding_forward(Stream s, Arr out, const int32_t* tokens, Arr wte, Arr wpe, int64_t N,
                       int64_t T, int64_t C, int64_t V, int* err) {
  if (N * C == 0) return;
  by_acc(wide(out, wte, wpe), [&](auto a) {
    FERRY_LAUNCH(embedding_forward_kernel<decltype(a)>, grid_for(N * C), kThreads, 0, as_stream(s),
                 out, tokens, wte, wpe, N, T, C, V, err);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void embedding_backward(Stream s, Arr dwte, Arr dwpe, Arr dout, const int32_t* tokens, int64_t N,
                        int64_t T, int64_t C) {
  if (N * C == 0) return;
  by_acc(wide(dwte, dwpe, dout), [&](auto a) {
    using A = decltype(a);
    FERRY_LAUNCH(embedding_backward_wte_kernel<A>, grid_for(C), kThreads, 0, as_stream(s), dwte,
                 dout, tokens, N, C);
    FERRY_CUDA_CHECK_LAUNCH();
    FERRY_LAUNCH(embedding_backward_wpe_kernel<A>, grid_for(T * C), kThreads, 0, as_stream(s), dwpe,
                 dout, N, T, C);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void layernorm_forward(Stream s, Arr out, Arr mean, Arr rstd, Arr inp, Arr w, Arr b, int64_t N,
                       int64_t C) {
  if (N == 0) return;
  by_acc(wide(out, mean, rstd, inp, w, b), [&](auto a) {
    FERRY_LAUNCH(layernorm_forward_kernel<decltype(a)>, static_cast<unsigned>(N), kThreads, 0,
                 as_stream(s), out, mean, rstd, inp, w, b, C);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(Stream s, Arr dinp, Arr dw, Arr db, Arr dout, Arr inp, Arr w, Arr mean,
                        Arr rstd, int64_t N, int64_t C) {
  if (N == 0) return;
  by_acc(wide(dinp, dw, db, dout, inp, w, mean, rstd), [&](auto a) {
    using A = decltype(a);
    FERRY_LAUNCH(layernorm_backward_rows_kernel<A>, static_cast<unsigned>(N), kThreads, 0,
                 as_stream(s), dinp, dout, inp, w, mean, rstd, C);
    FERRY_CUDA_CHECK_LAUNCH();
    FERRY_LAUNCH(layernorm_backward_params_kernel<A>, grid_for(C), kThreads, 0, as_stream(s), dw,
                 db, dout, inp, mean, rstd, N, C);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void rmsnorm_forward(Stream s, Arr out, Arr rstd, Arr inp, Arr w, int64_t N, int64_t C,
                     double eps) {
  if (N == 0) return;
  by_acc(wide(out, rstd, inp, w), [&](auto a) {
    FERRY_LAUNCH(rmsnorm_forward_kernel<decltype(a)>, static_cast<unsigned>(N), kThreads, 0,
                 as_stream(s), out, rstd, inp, w, C, eps);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(Stream s, Arr dinp, Arr dw, Arr dout, Arr inp, Arr w, Arr rstd, int64_t N,
                      int64_t C) {
  if (N == 0) return;
  by_acc(wide(dinp, dw, dout, inp, w, rstd), [&](auto a) {
    using A = decltype(a);
    FERRY_LAUNCH(rmsnorm_backward_rows_kernel<A>, static_cast<unsigned>(N), kThreads, 0,
                 as_stream(s), dinp, dout, inp, w, rstd, C);
    FERRY_CUDA_CHECK_LAUNCH();
    FERRY_LAUNCH(rmsnorm_backward_params_kernel<A>, grid_for(C), kThreads, 0, as_stream(s), dw,
                 dout, inp, rstd, N, C);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void attention_forward(Stream s, Arr out, Arr att, Arr qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, int64_t KVH, const int32_t* doc_start) {
  if (B * T == 0) return;
  const AttnShape sh = attn_shape(T, C, NH, KVH);
  by_acc(wide(out, att, qkv), [&](auto a) {
    using A = decltype(a);
    const size_t smem = static_cast<size_t>(T + sh.hs) * sizeof(A);
    allow_shared(attention_forward_kernel<A>, smem);
    const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(NH), static_cast<unsigned>(B));
    FERRY_LAUNCH(attention_forward_kernel<A>, grid, kAttnThreads, smem, as_stream(s), out, att, qkv,
                 sh, doc_start);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void attention_backward(Stream s, Arr dqkv, Arr dout, Arr qkv, Arr att, int64_t B, int64_t T,
                        int64_t C, int64_t NH, int64_t KVH, void* rowdot) {
  if (B * T == 0) return;
  const AttnShape sh = attn_shape(T, C, NH, KVH);
  by_acc(wide(dqkv, dout, qkv, att), [&](auto a) {
    using A = decltype(a);
    A* dot = static_cast<A*>(rowdot);
    const size_t smem_q = static_cast<size_t>(T + sh.hs) * sizeof(A);
    allow_shared(attention_backward_query_kernel<A>, smem_q);
    FERRY_LAUNCH(
        attention_backward_query_kernel<A>,
        dim3(static_cast<unsigned>(T), static_cast<unsigned>(NH), static_cast<unsigned>(B)),
        kAttnThreads, smem_q, as_stream(s), dqkv, dout, qkv, att, sh, dot);
    FERRY_CUDA_CHECK_LAUNCH();
    const size_t smem_k = static_cast<size_t>(2 * T + 3 * sh.hs) * sizeof(A);
    allow_shared(attention_backward_key_kernel<A>, smem_k);
    FERRY_LAUNCH(
        attention_backward_key_kernel<A>,
        dim3(static_cast<unsigned>(T), static_cast<unsigned>(KVH), static_cast<unsigned>(B)),
        kAttnThreads, smem_k, as_stream(s), dqkv, dout, qkv, att, sh, dot);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void swiglu_forward(Stream s, Arr out, Arr gate_up, int64_t N, int64_t H) {
  if (N * H == 0) return;
  by_acc(wide(out, gate_up), [&](auto a) {
    FERRY_LAUNCH(swiglu_forward_kernel<decltype(a)>, grid_for(N * H), kThreads, 0, as_stream(s),
                 out, gate_up, N, H);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(Stream s, Arr dgate_up, Arr gate_up, Arr dout, int64_t N, int64_t H) {
  if (N * H == 0) return;
  by_acc(wide(dgate_up, gate_up, dout), [&](auto a) {
    FERRY_LAUNCH(swiglu_backward_kernel<decltype(a)>, grid_for(N * H), kThreads, 0, as_stream(s),
                 dgate_up, gate_up, dout, N, H);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void rope(Stream s, Arr out, Arr inp, int64_t N, int64_t T, int64_t heads, int64_t hd,
          int64_t width, const Rope& rope, bool inverse, bool accumulate) {
  if (N * width == 0) return;
  by_acc(wide(out, inp), [&](auto a) {
    FERRY_LAUNCH(rope_kernel<decltype(a)>, grid_for(N * width), kThreads, 0, as_stream(s), out, inp,
                 N, T, heads, hd, width, rope, inverse, accumulate);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void gelu_forward(Stream s, Arr out, Arr inp, int64_t n) {
  if (n == 0) return;
  by_acc(wide(out, inp), [&](auto a) {
    FERRY_LAUNCH(gelu_forward_kernel<decltype(a)>, grid_for(n), kThreads, 0, as_stream(s), out, inp,
                 n);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void gelu_backward(Stream s, Arr dinp, Arr inp, Arr dout, int64_t n) {
  if (n == 0) return;
  by_acc(wide(dinp, inp, dout), [&](auto a) {
    FERRY_LAUNCH(gelu_backward_kernel<decltype(a)>, grid_for(n), kThreads, 0, as_stream(s), dinp,
                 inp, dout, n);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void softmax_cross_entropy_forward(Stream s, Arr losses, Arr probs, Arr logits,
                                   const int32_t* targets, int64_t N, int64_t V, int* err) {
  if (N == 0) return;
  by_acc(wide(losses, probs, logits), [&](auto a) {
    FERRY_LAUNCH(softmax_xent_forward_kernel<decltype(a)>, static_cast<unsigned>(N), kThreads, 0,
                 as_stream(s), losses, probs, logits, targets, V, err);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void softmax_cross_entropy_backward(Stream s, Arr dlogits, Arr probs, const int32_t* targets,
                                    int64_t N, int64_t V, double dloss) {
  if (N * V == 0) return;
  by_acc(wide(dlogits, probs), [&](auto a) {
    using A = decltype(a);
    FERRY_LAUNCH(softmax_xent_backward_kernel<A>, grid_for(N * V), kThreads, 0, as_stream(s),
                 dlogits, probs, targets, N, V, static_cast<A>(dloss));
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void adamw(Stream s, float* p, const float* g, float* m, float* v, int64_t n,
           const AdamWConstants& k) {
  if (n == 0) return;
  FERRY_LAUNCH(adamw_kernel, grid_for(n), kThreads, 0, as_stream(s), p, g, m, v, n, k);
  FERRY_CUDA_CHECK_LAUNCH();
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
