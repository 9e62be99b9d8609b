// Token and position embeddings, forward (with the out-of-vocabulary flag) and backward
// (dwte in token order without atomics, dwpe as column sums).
#include "nn/cuda/column_reduce.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

// out[n] = wte[tokens[n]] + wpe[n % T], row by row: each thread keeps its cell's row and
// column as it strides (for_each_cell), in 16-byte chunks of the row when C is a multiple of
// the chunk width and the three arrays are aligned.
template <class A, class X>
__global__ void embedding_forward_kernel(X out, const int32_t* tokens, X wte, X wpe, int64_t N,
                                         int64_t T, int64_t C, int64_t V, bool vectors, bool narrow,
                                         int* err) {
  constexpr int W = X::kWidth;
  const int64_t cols = vectors ? C / W : C;
  for_each_cell(N, cols, [&](int64_t i, int64_t n, int64_t c) {
    const int32_t tok = tokens[n];
    if (tok < 0 || tok >= V) {
      if (c == 0) report(err, n, tok);
      return;
    }
    // 32-bit modulo where the row count allows it (narrow): a 64-bit one is a long call.
    const int64_t t = narrow ? int64_t{static_cast<uint32_t>(n) % static_cast<uint32_t>(T)} : n % T;
    if (vectors) {
      A x[W], p[W];
      wte.load(int64_t{tok} * cols + c, x);
      wpe.load(t * cols + c, p);
      FERRY_UNROLL
      for (int k = 0; k < W; ++k) x[k] = x[k] + p[k];
      out.store(i, x);
    } else {
      out.set(i, wte[int64_t{tok} * C + c] + wpe[t * C + c]);
    }
  });
}

// dwte[tokens[n]] += dout[n] for every n: rows sharing a token add into one dwte row. Each
// block owns the vocabulary rows v with v % gridDim.x == blockIdx.x and scans all tokens in
// order, a tile of blockDim.x at a time: the tile's tokens it owns are compacted, in order
// (a warp ballot and the warps' counts), then each thread walks them for its own columns
// (16-byte vectors of a row where C and the operands allow), keeping the running sum of a
// dwte row in registers while consecutive owned tokens are the same one, and loading the
// dout rows kRowsAhead at a time so that their loads overlap. Every dwte row is written by
// one block only and gets its rows in token order, each addition rounded as dwte stores it:
// no atomics, deterministic, and the CPU kernel's summation order (the result does not
// depend on the grid or block size).
// Cost (N = 8192 tokens, C = 768, 256 threads, 512 blocks): each block reads all N token ids
// (32 tiles; 16 MB of L2 reads in all) and dout once overall. A token that fills a fraction
// f of the batch makes its block add f N rows one after another: measured on an H200 with
// GPT-2 124M's bench (byte ids of English text, the space about 17% of them), the kernel
// that stored each addition to dwte and scanned with a shared-memory prefix sum took 1.1 ms.
constexpr int kRowsAhead = 4;

// One thread's columns [j W, j W + W) (W = 1: element j) of the tile's owned rows.
template <int W, class A, class X, class Y>
__device__ void add_owned_rows(const Y& dwte, const X& dout, const int* owned, const int* owned_token, int total,
                               int64_t n0, int64_t cols, int64_t j) {
  int cur = -1;
  A acc[W] = {};  // set from dwte before the first addition
  auto get = [&](const auto& op, int64_t row, A(&v)[W]) {
    if constexpr (W == 1) {
      v[0] = op[row * cols + j];
    } else {
      op.template load<W>(row * cols + j, v);
    }
  };
  auto flush = [&] {
    if constexpr (W == 1) {
      dwte.set(int64_t{cur} * cols + j, acc[0]);
    } else {
      dwte.template store<W>(int64_t{cur} * cols + j, acc);
    }
  };
  for (int k0 = 0; k0 < total; k0 += kRowsAhead) {
    A d[kRowsAhead][W] = {};  // rows past total stay unread
    FERRY_UNROLL
    for (int u = 0; u < kRowsAhead; ++u) {
      if (k0 + u < total) get(dout, n0 + owned[k0 + u], d[u]);
    }
    FERRY_UNROLL
    for (int u = 0; u < kRowsAhead; ++u) {
      if (k0 + u >= total) break;
      const int tok = owned_token[k0 + u];
      if (tok != cur) {
        if (cur >= 0) flush();
        cur = tok;
        get(dwte, cur, acc);
      }
      FERRY_UNROLL
      for (int w = 0; w < W; ++w) acc[w] = dwte.round(acc[w] + d[u][w]);
    }
  }
  if (cur >= 0) flush();
}

template <class A, int W, class X, class Y>
__global__ void embedding_backward_wte_kernel(Y dwte, X dout, const int32_t* tokens, int64_t N, int64_t C,
                                              bool vectors) {
  __shared__ int warp_count[kMaxThreads / 32];
  __shared__ int owned[kMaxThreads];        // tile positions of the owned tokens, in order
  __shared__ int owned_token[kMaxThreads];  // and their tokens
  const unsigned blocks = gridDim.x, me = blockIdx.x;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, warps = blockDim.x >> 5;
  const int64_t cols = vectors ? C / W : C;
  for (int64_t n0 = 0; n0 < N; n0 += blockDim.x) {
    const int64_t n = n0 + t;
    const int32_t tok = n < N ? tokens[n] : -1;
    // A negative id is no row (the forward reported it); 32-bit modulo: a 64-bit one is a call.
    const bool mine = tok >= 0 && static_cast<unsigned>(tok) % blocks == me;
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < warps; ++w) {
      before += w < warp ? warp_count[w] : 0;
      total += warp_count[w];
    }
    if (mine) {
      const int at = before + __popc(ballot & ((1u << lane) - 1u));
      owned[at] = t;
      owned_token[at] = tok;
    }
    __syncthreads();
    for (int64_t j = t; j < cols; j += blockDim.x) {
      if (vectors) {
        add_owned_rows<W, A>(dwte, dout, owned, owned_token, total, n0, cols, j);
      } else {
        add_owned_rows<1, A>(dwte, dout, owned, owned_token, total, n0, cols, j);
      }
    }
    __syncthreads();  // warp_count, owned and owned_token are rewritten by the next tile
  }
}

}  // namespace

void embedding_forward(Stream s, Arr out, const int32_t* tokens, Arr wte, Arr wpe, int64_t N,
                       int64_t T, int64_t C, int64_t V, int* err) {
  if (N * C == 0) return;
  by_acc(wide(out, wte, wpe), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({out, wte, wpe}, {}, [&](auto x, auto) {
      using X = Operand<A, typename decltype(x)::type>;
      const bool vectors = C % X::kWidth == 0 && vector_chunks<X>(C, {out.p, wte.p, wpe.p}) > 0;
      auto& kernel = embedding_forward_kernel<A, X>;  // a reference: FERRY_LAUNCH takes its address
      FERRY_LAUNCH(kernel, grid_for(vectors ? N * C / X::kWidth : N * C), block_threads(), 0,
                   as_stream(s), X(out), tokens, X(wte), X(wpe), N, T, C, V, vectors,
                   N <= INT32_MAX, err);
    });
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
      constexpr int W = kChunkWidth<X, Y>;
      const bool vectors = C % W == 0 && vector_chunks<X, Y>(C, {dwte.p, dout.p}) > 0;
      auto& wte_kernel = embedding_backward_wte_kernel<A, W, X, Y>;
      const Y wte(dwte);
      const X grad(dout);
      FERRY_LAUNCH(wte_kernel, blocks, block_threads(), 0, as_stream(s), wte, grad, tokens, N, C, vectors);
      FERRY_CUDA_CHECK_LAUNCH();
      // dwpe[t, c] += sum over b of dout[b T + t, c]: the column sums of dout as [N / T, T C].
      reduce_columns<A>(as_stream(s), ColumnSumTerm<A, X>{X(dout)}, N / T, T * C, dwpe, Arr{});
    });
  });
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
