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

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
