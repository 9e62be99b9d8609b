// The fused output layer's row kernels (DeviceOps::linear_cross_entropy_*, nn/linear_cross_entropy.h):
// one block per row of a chunk's scores, in the scores' own dtype. Forward takes the row's
// loss; backward turns the row into its gradient in place, dloss (softmax - onehot), so the
// chunk needs no probabilities beside it (the default's f32 [Nc, V]) and no zeroed gradient.
//
// One pass finds the row's max and sum of exponentials together (the online softmax: each
// thread keeps a running max and rescales its sum when the max grows, then the block
// combines the threads' pairs in a fixed order), so forward reads the row once and backward
// twice (the second pass writes the gradient). Rows go in 16-byte vectors where the row is
// aligned (bf16: V a multiple of 8, as the padded vocabularies are), element by element
// otherwise. Measured on an H200 (docs/design/measured.md), GPT-2 124M's head (8192 rows of
// 50,304 bf16 scores): three scalar passes took 1.25 ms forward and 2.46 ms backward, 3 to 6
// times the bytes' time at HBM speed. The values are the CPU device's softmax_cross_entropy
// of these scores to rounding: the sum's order differs (per thread, then the block's tree),
// and exp(s - max) / sum is exp(s - max) times 1 / sum.
#include "nn/cuda/common.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

// A running softmax denominator: the largest score seen and the sum of exp(score - max).
// Trivial (a __shared__ array of it takes no initializer); empty_max_sum() is the start.
template <class A>
struct MaxSum {
  A max;
  A sum;
};

template <class A>
__device__ __forceinline__ MaxSum<A> empty_max_sum() {
  return {-INFINITY, A(0)};
}

// exp(from - to) for a sum being moved from max `from` to max `to` >= from: 0 where `from` is
// -inf (an empty sum; exp(-inf - -inf) would be NaN).
template <class A>
__device__ __forceinline__ A rescale(A from, A to) {
  return from == -INFINITY ? A(0) : exp(from - to);
}

template <class A>
__device__ __forceinline__ MaxSum<A> combine(MaxSum<A> a, MaxSum<A> b) {
  MaxSum<A> r;
  r.max = a.max > b.max ? a.max : b.max;
  r.sum = a.sum * rescale(a.max, r.max) + b.sum * rescale(b.max, r.max);
  return r;
}

// Adds W scores to a running pair: the max first, so the sum is rescaled once per chunk.
template <class A, int W>
__device__ __forceinline__ void add_scores(MaxSum<A>& ms, const A (&x)[W]) {
  A m = ms.max;
  FERRY_UNROLL
  for (int k = 0; k < W; ++k) m = x[k] > m ? x[k] : m;
  if (m > ms.max) {
    ms.sum *= rescale(ms.max, m);
    ms.max = m;
  }
  // Every score so far -inf: each term is exp(-inf) = 0, and exp(-inf - -inf) would be NaN,
  // which no later rescale by 0 undoes (the CPU device takes the row's max first: 0s).
  if (ms.max == -INFINITY) return;
  FERRY_UNROLL
  for (int k = 0; k < W; ++k) ms.sum += exp(x[k] - ms.max);
}

// The warp's pairs combined down to lane 0 (a shuffle tree, the same order every time).
template <class A>
__device__ MaxSum<A> warp_max_sum(MaxSum<A> v) {
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum<A> other;
    other.max = __shfl_down_sync(0xffffffffu, v.max, o);
    other.sum = __shfl_down_sync(0xffffffffu, v.sum, o);
    v = combine(v, other);
  }
  return v;
}

// The pair over the block, every thread getting it: each warp's tree, then warp 0's over
// the warps' pairs, in a fixed order (the bits depend on the block size only).
template <class A>
__device__ MaxSum<A> block_max_sum(MaxSum<A> v, MaxSum<A>* scratch) {
  v = warp_max_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = warp_max_sum(lane < warps ? scratch[lane] : empty_max_sum<A>());
    if (lane == 0) scratch[32] = v;
  }
  __syncthreads();
  return scratch[32];
}

// The row's max and sum of exp(s - max): vector chunks [0, chunks) of W scores, then the
// scalar tail [chunks W, V) (everything where chunks is 0).
template <class A, int W, class X>
__device__ MaxSum<A> row_max_sum(const X& scores, int64_t n, int64_t V, int64_t chunks, MaxSum<A>* scratch) {
  MaxSum<A> ms = empty_max_sum<A>();
  for (int64_t j = threadIdx.x; j < chunks; j += blockDim.x) {
    A x[W];
    scores.template load<W>(n * (V / W) + j, x);
    add_scores(ms, x);
  }
  for (int64_t v = chunks * W + threadIdx.x; v < V; v += blockDim.x) {
    const A x[1] = {scores[n * V + v]};
    add_scores(ms, x);
  }
  return block_max_sum(ms, scratch);
}

template <class A, int W, class X, class P>
__global__ void linear_xent_forward_kernel(P losses, X scores, const int32_t* targets, int64_t V, int64_t chunks,
                                           int* err) {
  __shared__ MaxSum<A> scratch[33];
  const int64_t n = blockIdx.x;
  const MaxSum<A> ms = row_max_sum<A, W>(scores, n, V, chunks, scratch);
  if (threadIdx.x == 0) {
    const int32_t t = targets[n];
    if (t == kIgnoreTarget) {
      losses.set(n, A(0));
    } else if (t < 0 || t >= V) {
      report(err, n, t);
    } else {
      losses.set(n, log(ms.sum) - (scores[n * V + t] - ms.max));  // log-sum-exp, as softmax_xent_forward
    }
  }
}

template <class A, int W, class X>
__global__ void linear_xent_backward_kernel(X scores, const int32_t* targets, int64_t V, int64_t chunks, A dloss) {
  __shared__ MaxSum<A> scratch[33];
  const int64_t n = blockIdx.x;
  const int32_t t = targets[n];
  if (t == kIgnoreTarget) {  // no gradient: the row's scores become zeros
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) scores.set(n * V + v, A(0));
    return;
  }
  const MaxSum<A> ms = row_max_sum<A, W>(scores, n, V, chunks, scratch);
  const A inv = A(1) / ms.sum;
  for (int64_t j = threadIdx.x; j < chunks; j += blockDim.x) {
    A x[W];
    scores.template load<W>(n * (V / W) + j, x);
    FERRY_UNROLL
    for (int k = 0; k < W; ++k) x[k] = dloss * (exp(x[k] - ms.max) * inv - (j * W + k == t ? A(1) : A(0)));
    scores.template store<W>(n * (V / W) + j, x);
  }
  for (int64_t v = chunks * W + threadIdx.x; v < V; v += blockDim.x) {
    const A p = exp(scores[n * V + v] - ms.max) * inv;
    scores.set(n * V + v, dloss * (p - (v == t ? A(1) : A(0))));
  }
}

// Vector chunks per row: V / W where every row starts 16-byte aligned (V a multiple of W and
// the scores aligned) and the operand is typed, else 0.
template <class X>
int64_t row_chunks(const Arr& scores, int64_t V) {
  constexpr int W = X::kWidth;
  return V % W == 0 ? vector_chunks<X>(V, {scores.p}) : 0;
}

// Threads per row: 512 on a GPU (V of tens of thousands: each thread takes a dozen vectors,
// and 2-4 rows per multiprocessor keep the second pass's reads in L2), fewer rows' worth
// of fibers under the emulation.
inline int row_threads() {
#ifdef FERRY_CUDA_EMULATION
  return block_threads();
#else
  return 512;
#endif
}

}  // namespace

void linear_xent_forward_rows(Stream s, Arr losses, Arr scores, const int32_t* targets, int64_t N, int64_t V,
                              int* err) {
  if (N == 0) return;
  by_acc(wide(losses, scores), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({scores}, {losses}, [&](auto x, auto y) {
      using X = Operand<A, typename decltype(x)::type>;
      using P = Operand<A, typename decltype(y)::type>;
      auto& kernel = linear_xent_forward_kernel<A, X::kWidth, X, P>;  // FERRY_LAUNCH takes its address
      FERRY_LAUNCH(kernel, static_cast<unsigned>(N), row_threads(), 0, as_stream(s), P(losses), X(scores), targets, V,
                   row_chunks<X>(scores, V), err);
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void linear_xent_backward_rows(Stream s, Arr scores, const int32_t* targets, int64_t N, int64_t V, double dloss) {
  if (N == 0) return;
  by_acc(wide(scores), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({scores}, {}, [&](auto x, auto) {
      using X = Operand<A, typename decltype(x)::type>;
      auto& kernel = linear_xent_backward_kernel<A, X::kWidth, X>;
      FERRY_LAUNCH(kernel, static_cast<unsigned>(N), row_threads(), 0, as_stream(s), X(scores), targets, V,
                   row_chunks<X>(scores, V), static_cast<A>(dloss));
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
