// LayerNorm (GPT-2) and RMSNorm (Llama), forward and the input gradient: 8 lanes or a warp
// per row (a block for wide rows) with the row in registers and 16-byte accesses for the common
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

// ---- normalisation, typed: a few lanes, a warp or a block per row, the row in registers ----
// For operands of one storage type S (activations and weights f32, bf16 or f16; statistics
// f32), 16-byte aligned, rows a multiple of W = 16 / sizeof(S) wide. A row is C / W chunks;
// a group of G threads owns it, thread g the chunks g, g + G, ... (at most K = kRowFloats /
// W of them, held as floats in registers), so the row is read from memory once: summed,
// then normalised from the registers. G is the narrowest that holds the row: 8 lanes
// (C <= 256: a warp does 4 rows, as for q/k norms over heads of 64 or 128), a warp
// (C <= 1024), both reducing by shuffles alone, else the block (one row per block, block
// reductions: C <= 256 K W = 8192 on a GPU). Wider rows, other mixes and misaligned views
// take the generic kernels below. The shuffles take every lane of a warp, so lanes past
// the last row stay to the end with no chunks (live false) instead of returning.
constexpr int kRowFloats = 32;
constexpr int kBlockRows = 0;  // G: the whole block per row

template <class S>
constexpr int kRowChunks = kRowFloats / Operand<float, S>::kWidth;  // K

template <int G>
struct RowGroup {
  int size;     // threads per row
  int g;        // this thread's place in its row's group
  int64_t row;  // the row it works on
  bool live;    // row < N
  __device__ explicit RowGroup(int64_t N) {
    if constexpr (G == kBlockRows) {
      size = static_cast<int>(blockDim.x);
      g = static_cast<int>(threadIdx.x);
      row = blockIdx.x;
    } else {
      size = G;
      g = static_cast<int>(threadIdx.x % G);
      row = blockIdx.x * int64_t{blockDim.x / G} + threadIdx.x / G;
    }
    live = row < N;
  }
  // The sum over the group, in every thread (scratch: 32 floats, block groups only). Lane
  // groups: a butterfly within the G lanes (xor offsets below G stay inside the group).
  __device__ float sum(float v, float* scratch) const {
    if constexpr (G == kBlockRows) {
      return block_reduce(v, scratch, Sum{});
    } else {
      (void)scratch;
      for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      return v;
    }
  }
};

template <class S, int G>
__global__ void layernorm_forward_typed_kernel(Operand<float, S> out, Operand<float, float> mean,
                                               Operand<float, float> rstd, Operand<float, S> inp,
                                               Operand<float, S> w, Operand<float, S> b, int64_t N,
                                               int C) {
  constexpr int W = Operand<float, S>::kWidth, K = kRowChunks<S>;
  __shared__ float scratch[32];
  const RowGroup<G> grp(N);
  const int chunks = grp.live ? C / W : 0;
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
  if (grp.g == 0 && grp.live) {
    mean.set(grp.row, m);
    rstd.set(grp.row, r);
  }
}

template <class S, int G>
__global__ void layernorm_backward_typed_kernel(Operand<float, S> dinp, Operand<float, S> dout,
                                                Operand<float, S> inp, Operand<float, S> w,
                                                Operand<float, float> mean,
                                                Operand<float, float> rstd, int64_t N, int C) {
  constexpr int W = Operand<float, S>::kWidth, K = kRowChunks<S>;
  __shared__ float scratch[32];
  const RowGroup<G> grp(N);
  const int chunks = grp.live ? C / W : 0;
  const int64_t base = grp.row * chunks;
  const float m = grp.live ? mean[grp.row] : 0.0f, r = grp.live ? rstd[grp.row] : 0.0f;
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

template <class S, int G>
__global__ void rmsnorm_forward_typed_kernel(Operand<float, S> out, Operand<float, float> rstd,
                                             Operand<float, S> inp, Operand<float, S> w, int64_t N,
                                             int C, float eps) {
  constexpr int W = Operand<float, S>::kWidth, K = kRowChunks<S>;
  __shared__ float scratch[32];
  const RowGroup<G> grp(N);
  const int chunks = grp.live ? C / W : 0;
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
  if (grp.g == 0 && grp.live) rstd.set(grp.row, r);
}

template <class S, int G>
__global__ void rmsnorm_backward_typed_kernel(Operand<float, S> dinp, Operand<float, S> dout,
                                              Operand<float, S> inp, Operand<float, S> w,
                                              Operand<float, float> rstd, int64_t N, int C) {
  constexpr int W = Operand<float, S>::kWidth, K = kRowChunks<S>;
  __shared__ float scratch[32];
  const RowGroup<G> grp(N);
  const int chunks = grp.live ? C / W : 0;
  const int64_t base = grp.row * chunks;
  const float r = grp.live ? rstd[grp.row] : 0.0f;
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

// Threads per row (G) of the typed kernel for rows of C of storage S at these addresses:
// 8, 32 or kBlockRows; -1: none (the generic kernels).
template <class S>
int row_group(int64_t C, std::initializer_list<const void*> ps) {
  constexpr int W = Operand<float, S>::kWidth, K = kRowChunks<S>;
  if (C % W != 0 || !aligned16(ps)) return -1;
  const int64_t chunks = C / W;
  if (chunks <= 8 * K) return 8;
  if (chunks <= 32 * K) return 32;
  return chunks <= int64_t{block_threads()} * K ? kBlockRows : -1;
}

// Blocks for a typed row kernel over N rows.
inline unsigned row_blocks(int G, int64_t N) {
  const int64_t rows_per_block = G == kBlockRows ? 1 : block_threads() / G;
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

// Each launcher runs one row kernel (typed where row_group allows, generic otherwise) and,
// for the backward passes, the weight gradients' column reduction: the same launches as
// before the typed kernels.

void layernorm_forward(Stream s, Arr out, Arr mean, Arr rstd, Arr inp, Arr w, Arr b, int64_t N,
                       int64_t C) {
  if (N == 0) return;
  by_acc(wide(out, mean, rstd, inp, w, b), [&](auto a) {
    using A = decltype(a);
    int mode = -1;  // threads per row of the typed kernel; -1: the generic one
    by_storage<A>({out, inp, w, b}, {mean, rstd}, [&](auto x, auto) {
      using S = typename decltype(x)::type;
      if constexpr (!std::is_same_v<S, Arr>) {
        mode = row_group<S>(C, {out.p, inp.p, w.p, b.p});
        if (mode < 0) return;
        using X = Operand<float, S>;
        using Y = Operand<float, float>;
        auto launch = [&](auto& kernel) {  // a reference: FERRY_LAUNCH takes its address
          FERRY_LAUNCH(kernel, row_blocks(mode, N), block_threads(), 0, as_stream(s), X(out),
                       Y(mean), Y(rstd), X(inp), X(w), X(b), N, static_cast<int>(C));
        };
        if (mode == 8) {
          launch(layernorm_forward_typed_kernel<S, 8>);
        } else if (mode == 32) {
          launch(layernorm_forward_typed_kernel<S, 32>);
        } else {
          launch(layernorm_forward_typed_kernel<S, kBlockRows>);
        }
      }
    });
    if (mode >= 0) return;
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
    int mode = -1;  // threads per row of the typed kernel; -1: the generic one
    by_storage<A>({dinp, dout, inp, w}, {mean, rstd}, [&](auto x, auto) {
      using S = typename decltype(x)::type;
      if constexpr (!std::is_same_v<S, Arr>) {
        mode = row_group<S>(C, {dinp.p, dout.p, inp.p, w.p});
        if (mode < 0) return;
        using X = Operand<float, S>;
        using Y = Operand<float, float>;
        auto launch = [&](auto& kernel) {  // a reference: FERRY_LAUNCH takes its address
          FERRY_LAUNCH(kernel, row_blocks(mode, N), block_threads(), 0, as_stream(s), X(dinp),
                       X(dout), X(inp), X(w), Y(mean), Y(rstd), N, static_cast<int>(C));
        };
        if (mode == 8) {
          launch(layernorm_backward_typed_kernel<S, 8>);
        } else if (mode == 32) {
          launch(layernorm_backward_typed_kernel<S, 32>);
        } else {
          launch(layernorm_backward_typed_kernel<S, kBlockRows>);
        }
      }
    });
    if (mode < 0) {
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
    int mode = -1;  // threads per row of the typed kernel; -1: the generic one
    by_storage<A>({out, inp, w}, {rstd}, [&](auto x, auto) {
      using S = typename decltype(x)::type;
      if constexpr (!std::is_same_v<S, Arr>) {
        mode = row_group<S>(C, {out.p, inp.p, w.p});
        if (mode < 0) return;
        using X = Operand<float, S>;
        using Y = Operand<float, float>;
        auto launch = [&](auto& kernel) {  // a reference: FERRY_LAUNCH takes its address
          FERRY_LAUNCH(kernel, row_blocks(mode, N), block_threads(), 0, as_stream(s), X(out),
                       Y(rstd), X(inp), X(w), N, static_cast<int>(C), static_cast<float>(eps));
        };
        if (mode == 8) {
          launch(rmsnorm_forward_typed_kernel<S, 8>);
        } else if (mode == 32) {
          launch(rmsnorm_forward_typed_kernel<S, 32>);
        } else {
          launch(rmsnorm_forward_typed_kernel<S, kBlockRows>);
        }
      }
    });
    if (mode >= 0) return;
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
    int mode = -1;  // threads per row of the typed kernel; -1: the generic one
    by_storage<A>({dinp, dout, inp, w}, {rstd}, [&](auto x, auto) {
      using S = typename decltype(x)::type;
      if constexpr (!std::is_same_v<S, Arr>) {
        mode = row_group<S>(C, {dinp.p, dout.p, inp.p, w.p});
        if (mode < 0) return;
        using X = Operand<float, S>;
        using Y = Operand<float, float>;
        auto launch = [&](auto& kernel) {  // a reference: FERRY_LAUNCH takes its address
          FERRY_LAUNCH(kernel, row_blocks(mode, N), block_threads(), 0, as_stream(s), X(dinp),
                       X(dout), X(inp), X(w), Y(rstd), N, static_cast<int>(C));
        };
        if (mode == 8) {
          launch(rmsnorm_backward_typed_kernel<S, 8>);
        } else if (mode == 32) {
          launch(rmsnorm_backward_typed_kernel<S, 32>);
        } else {
          launch(rmsnorm_backward_typed_kernel<S, kBlockRows>);
        }
      }
    });
    if (mode < 0) {
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
