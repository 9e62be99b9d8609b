// LayerNorm (GPT-2) and RMSNorm (Llama), forward and the input gradient: a warp per row
// (a block for wide rows) with the row in registers and 16-byte accesses for the common
// dtypes, one block per row with per-element loads for the rest (docs/design/cuda.md,
// "Memory-bound kernels"); the weight gradients are column reductions
// (nn/cuda/column_reduce.cuh).
#include "nn/cuda/column_reduce.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

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

// ---- normalisation, typed: a warp (or a block) per row, the row in registers ---------------
// For operands of one storage type S (activations and weights f32, bf16 or f16; statistics
// f32), 16-byte aligned, rows a multiple of W = 16 / sizeof(S) wide. A row is C / W chunks;
// a group of G threads owns it, thread g the chunks g, g + G, ... (at most K = kRowFloats /
// W of them, held as floats in registers), so the row is read from memory once: summed,
// then normalised from the registers. G is a warp (kWarpRows: blockDim / 32 rows per block,
// reductions by shuffles alone) where the row fits in 32 K chunks (C <= 1024), else the
// block (one row per block, as the generic kernels): C <= 256 K W = 8192 on a GPU.
// Wider rows, other mixes and misaligned views take the generic kernels below.
constexpr int kRowFloats = 32;

template <class S>
constexpr int kRowChunks = kRowFloats / Operand<float, S>::kWidth;  // K

template <bool kWarpRows>
struct RowGroup {
  int size;     // G
  int g;        // this thread's place in its row's group
  int64_t row;  // the row it works on
  __device__ RowGroup() {
    size = kWarpRows ? 32 : static_cast<int>(blockDim.x);
    g = kWarpRows ? static_cast<int>(threadIdx.x & 31) : static_cast<int>(threadIdx.x);
    row = kWarpRows ? blockIdx.x * int64_t{blockDim.x / 32} + (threadIdx.x >> 5) : int64_t{blockIdx.x};
  }
  // The sum over the group, in every thread (scratch: 32 floats, block groups only).
  __device__ float sum(float v, float* scratch) const {
    if constexpr (kWarpRows) {
      (void)scratch;
      return warp_sum(v);
    } else {
      return block_reduce(v, scratch, Sum{});
    }
  }
};

template <class S, bool kWarpRows>
__global__ void layernorm_forward_typed_kernel(Operand<float, S> out, Operand<float, float> mean,
                                               Operand<float, float> rstd, Operand<float, S> inp,
                                               Operand<float, S> w, Operand<float, S> b, int64_t N,
                                               int C) {
  constexpr int W = Operand<float, S>::kWidth, K = kRowChunks<S>;
  __shared__ float scratch[32];
  const RowGroup<kWarpRows> grp;
  if (grp.row >= N) return;  // a whole warp (warp rows); never for block rows
  const int chunks = C / W;
  const int64_t base = grp.row * chunks;
  float x[K][W];
  float s = 0;
  FERRY_UNROLL
  for (int k = 0; k < K; ++k) {
    const int c = grp.g + k * grp.size;
    if (c >= chunks) continue;
    inp.load(base + c, x[k]);
    FERRY_UNROLL
    for (int e = 0; e < W; ++e) s += x[k][e];
  }
  const float m = grp.sum(s, scratch) / static_cast<float>(C);
  float v = 0;
  FERRY_UNROLL
  for (int k = 0; k < K; ++k) {
    if (grp.g + k * grp.size >= chunks) continue;
    FERRY_UNROLL
    for (int e = 0; e < W; ++e) {
      const float d = x[k][e] - m;
      v += d * d;
    }
  }
  v = grp.sum(v, scratch) / static_cast<float>(C);
  const float r = 1.0f / sqrt(v + 1e-5f);
  FERRY_UNROLL
  for (int k = 0; k < K; ++k) {
    const int c = grp.g + k * grp.size;
    if (c >= chunks) continue;
    float wv[W], bv[W];
    w.load(c, wv);
    b.load(c, bv);
    FERRY_UNROLL
    for (int e = 0; e < W; ++e) x[k][e] = (x[k][e] - m) * r * wv[e] + bv[e];
    out.store(base + c, x[k]);
  }
  if (grp.g == 0) {
    mean.set(grp.row, m);
    rstd.set(grp.row, r);
  }
}

template <class S, bool kWarpRows>
__global__ void layernorm_backward_typed_kernel(Operand<float, S> dinp, Operand<float, S> dout,
                                                Operand<float, S> inp, Operand<float, S> w,
                                                Operand<float, float> mean,
                                                Operand<float, float> rstd, int64_t N, int C) {
  constexpr int W = Operand<float, S>::kWidth, K = kRowChunks<S>;
  __shared__ float scratch[32];
  const RowGroup<kWarpRows> grp;
  if (grp.row >= N) return;
  const int chunks = C / W;
  const int64_t base = grp.row * chunks;
  const float m = mean[grp.row], r = rstd[grp.row];
  float norm[K][W], dnorm[K][W];
  float dm = 0, dnm = 0;
  FERRY_UNROLL
  for (int k = 0; k < K; ++k) {
    const int c = grp.g + k * grp.size;
    if (c >= chunks) continue;
    float d[W], wv[W];
    inp.load(base + c, norm[k]);
    dout.load(base + c, d);
    w.load(c, wv);
    FERRY_UNROLL
    for (int e = 0; e < W; ++e) {
      norm[k][e] = (norm[k][e] - m) * r;
      dnorm[k][e] = wv[e] * d[e];
      dm += dnorm[k][e];
      dnm += dnorm[k][e] * norm[k][e];
    }
  }
  dm = grp.sum(dm, scratch) / static_cast<float>(C);
  dnm = grp.sum(dnm, scratch) / static_cast<float>(C);
  FERRY_UNROLL
  for (int k = 0; k < K; ++k) {
    const int c = grp.g + k * grp.size;
    if (c >= chunks) continue;
    float di[W];
    dinp.load(base + c, di);
    FERRY_UNROLL
    for (int e = 0; e < W; ++e) di[e] = di[e] + (dnorm[k][e] - dm - norm[k][e] * dnm) * r;
    dinp.store(base + c, di);
  }
}

template <class S, bool kWarpRows>
__global__ void rmsnorm_forward_typed_kernel(Operand<float, S> out, Operand<float, float> rstd,
                                             Operand<float, S> inp, Operand<float, S> w, int64_t N,
                                             int C, float eps) {
  constexpr int W = Operand<float, S>::kWidth, K = kRowChunks<S>;
  __shared__ float scratch[32];
  const RowGroup<kWarpRows> grp;
  if (grp.row >= N) return;
  const int chunks = C / W;
  const int64_t base = grp.row * chunks;
  float x[K][W];
  float ss = 0;
  FERRY_UNROLL
  for (int k = 0; k < K; ++k) {
    const int c = grp.g + k * grp.size;
    if (c >= chunks) continue;
    inp.load(base + c, x[k]);
    FERRY_UNROLL
    for (int e = 0; e < W; ++e) ss += x[k][e] * x[k][e];
  }
  ss = grp.sum(ss, scratch);
  const float r = 1.0f / sqrt(ss / static_cast<float>(C) + eps);
  FERRY_UNROLL
  for (int k = 0; k < K; ++k) {
    const int c = grp.g + k * grp.size;
    if (c >= chunks) continue;
    float wv[W];
    w.load(c, wv);
    FERRY_UNROLL
    for (int e = 0; e < W; ++e) x[k][e] = x[k][e] * r * wv[e];
    out.store(base + c, x[k]);
  }
  if (grp.g == 0) rstd.set(grp.row, r);
}

template <class S, bool kWarpRows>
__global__ void rmsnorm_backward_typed_kernel(Operand<float, S> dinp, Operand<float, S> dout,
                                              Operand<float, S> inp, Operand<float, S> w,
                                              Operand<float, float> rstd, int64_t N, int C) {
  constexpr int W = Operand<float, S>::kWidth, K = kRowChunks<S>;
  __shared__ float scratch[32];
  const RowGroup<kWarpRows> grp;
  if (grp.row >= N) return;
  const int chunks = C / W;
  const int64_t base = grp.row * chunks;
  const float r = rstd[grp.row];
  float x[K][W], wd[K][W];  // the input and w * dout
  float wdx = 0;
  FERRY_UNROLL
  for (int k = 0; k < K; ++k) {
    const int c = grp.g + k * grp.size;
    if (c >= chunks) continue;
    float d[W];
    inp.load(base + c, x[k]);
    dout.load(base + c, d);
    w.load(c, wd[k]);
    FERRY_UNROLL
    for (int e = 0; e < W; ++e) {
      wd[k][e] = wd[k][e] * d[e];
      wdx += wd[k][e] * x[k][e];
    }
  }
  wdx = grp.sum(wdx, scratch);
  const float q = r * r * r * wdx / static_cast<float>(C);
  FERRY_UNROLL
  for (int k = 0; k < K; ++k) {
    const int c = grp.g + k * grp.size;
    if (c >= chunks) continue;
    float di[W];
    dinp.load(base + c, di);
    FERRY_UNROLL
    for (int e = 0; e < W; ++e) di[e] = di[e] + (r * wd[k][e] - x[k][e] * q);
    dinp.store(base + c, di);
  }
}

// Which typed kernel suits rows of C for storage S at these addresses: 1 warp rows, 2 block
// rows, 0 none (the generic kernels).
template <class S>
int row_mode(int64_t C, std::initializer_list<const void*> ps) {
  constexpr int W = Operand<float, S>::kWidth, K = kRowChunks<S>;
  if (C % W != 0 || !aligned16(ps)) return 0;
  const int64_t chunks = C / W;
  if (chunks <= 32 * K) return 1;
  return chunks <= int64_t{block_threads()} * K ? 2 : 0;
}

// Blocks for a typed row kernel over N rows.
inline unsigned row_blocks(int mode, int64_t N) {
  const int64_t rows_per_block = mode == 1 ? block_threads() / 32 : 1;
  return static_cast<unsigned>((N + rows_per_block - 1) / rows_per_block);
}

// ---- normalisation, generic: one block per row ------------------------------------------

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

}  // namespace

// Each launcher runs one row kernel (typed where row_mode allows, generic otherwise) and,
// for the backward passes, the weight gradients' column reduction: the same launches as
// before the typed kernels.

void layernorm_forward(Stream s, Arr out, Arr mean, Arr rstd, Arr inp, Arr w, Arr b, int64_t N,
                       int64_t C) {
  if (N == 0) return;
  by_acc(wide(out, mean, rstd, inp, w, b), [&](auto a) {
    using A = decltype(a);
    int mode = 0;
    by_storage<A>({out, inp, w, b}, {mean, rstd}, [&](auto x, auto) {
      using S = typename decltype(x)::type;
      if constexpr (!std::is_same_v<S, Arr>) {
        mode = row_mode<S>(C, {out.p, inp.p, w.p, b.p});
        if (mode == 0) return;
        using X = Operand<float, S>;
        using Y = Operand<float, float>;
        auto launch = [&](auto& kernel) {  // a reference: FERRY_LAUNCH takes its address
          FERRY_LAUNCH(kernel, row_blocks(mode, N), block_threads(), 0, as_stream(s), X(out),
                       Y(mean), Y(rstd), X(inp), X(w), X(b), N, static_cast<int>(C));
        };
        if (mode == 1) {
          launch(layernorm_forward_typed_kernel<S, true>);
        } else {
          launch(layernorm_forward_typed_kernel<S, false>);
        }
      }
    });
    if (mode != 0) return;
    FERRY_LAUNCH(layernorm_forward_kernel<A>, static_cast<unsigned>(N), block_threads(), 0,
                 as_stream(s), out, mean, rstd, inp, w, b, C);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(Stream s, Arr dinp, Arr dw, Arr db, Arr dout, Arr inp, Arr w, Arr mean,
                        Arr rstd, int64_t N, int64_t C) {
  if (N == 0) return;
  by_acc(wide(dinp, dw, db, dout, inp, w, mean, rstd), [&](auto a) {
    using A = decltype(a);
    int mode = 0;
    by_storage<A>({dinp, dout, inp, w}, {mean, rstd}, [&](auto x, auto) {
      using S = typename decltype(x)::type;
      if constexpr (!std::is_same_v<S, Arr>) {
        mode = row_mode<S>(C, {dinp.p, dout.p, inp.p, w.p});
        if (mode == 0) return;
        using X = Operand<float, S>;
        using Y = Operand<float, float>;
        auto launch = [&](auto& kernel) {  // a reference: FERRY_LAUNCH takes its address
          FERRY_LAUNCH(kernel, row_blocks(mode, N), block_threads(), 0, as_stream(s), X(dinp),
                       X(dout), X(inp), X(w), Y(mean), Y(rstd), N, static_cast<int>(C));
        };
        if (mode == 1) {
          launch(layernorm_backward_typed_kernel<S, true>);
        } else {
          launch(layernorm_backward_typed_kernel<S, false>);
        }
      }
    });
    if (mode == 0) {
      FERRY_LAUNCH(layernorm_backward_rows_kernel<A>, static_cast<unsigned>(N), block_threads(), 0,
                   as_stream(s), dinp, dout, inp, w, mean, rstd, C);
    }
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
    using A = decltype(a);
    int mode = 0;
    by_storage<A>({out, inp, w}, {rstd}, [&](auto x, auto) {
      using S = typename decltype(x)::type;
      if constexpr (!std::is_same_v<S, Arr>) {
        mode = row_mode<S>(C, {out.p, inp.p, w.p});
        if (mode == 0) return;
        using X = Operand<float, S>;
        using Y = Operand<float, float>;
        auto launch = [&](auto& kernel) {  // a reference: FERRY_LAUNCH takes its address
          FERRY_LAUNCH(kernel, row_blocks(mode, N), block_threads(), 0, as_stream(s), X(out),
                       Y(rstd), X(inp), X(w), N, static_cast<int>(C), static_cast<float>(eps));
        };
        if (mode == 1) {
          launch(rmsnorm_forward_typed_kernel<S, true>);
        } else {
          launch(rmsnorm_forward_typed_kernel<S, false>);
        }
      }
    });
    if (mode != 0) return;
    FERRY_LAUNCH(rmsnorm_forward_kernel<A>, static_cast<unsigned>(N), block_threads(), 0,
                 as_stream(s), out, rstd, inp, w, C, eps);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(Stream s, Arr dinp, Arr dw, Arr dout, Arr inp, Arr w, Arr rstd, int64_t N,
                      int64_t C) {
  if (N == 0) return;
  by_acc(wide(dinp, dw, dout, inp, w, rstd), [&](auto a) {
    using A = decltype(a);
    int mode = 0;
    by_storage<A>({dinp, dout, inp, w}, {rstd}, [&](auto x, auto) {
      using S = typename decltype(x)::type;
      if constexpr (!std::is_same_v<S, Arr>) {
        mode = row_mode<S>(C, {dinp.p, dout.p, inp.p, w.p});
        if (mode == 0) return;
        using X = Operand<float, S>;
        using Y = Operand<float, float>;
        auto launch = [&](auto& kernel) {  // a reference: FERRY_LAUNCH takes its address
          FERRY_LAUNCH(kernel, row_blocks(mode, N), block_threads(), 0, as_stream(s), X(dinp),
                       X(dout), X(inp), X(w), Y(rstd), N, static_cast<int>(C));
        };
        if (mode == 1) {
          launch(rmsnorm_backward_typed_kernel<S, true>);
        } else {
          launch(rmsnorm_backward_typed_kernel<S, false>);
        }
      }
    });
    if (mode == 0) {
      FERRY_LAUNCH(rmsnorm_backward_rows_kernel<A>, static_cast<unsigned>(N), block_threads(), 0,
                   as_stream(s), dinp, dout, inp, w, rstd, C);
    }
    FERRY_CUDA_CHECK_LAUNCH();
    by_storage<A>({dout, inp}, {rstd}, [&](auto x, auto y) {
      using X = Operand<A, typename decltype(x)::type>;
      using Y = Operand<A, typename decltype(y)::type>;
      reduce_columns<A>(as_stream(s), RmsNormParamsTerm<A, X, Y>{X(dout), X(inp), Y(rstd)}, N, C,
                        dw, Arr{});
    });
  });
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
