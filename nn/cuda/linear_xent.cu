// The fused output layer's row kernels (DeviceOps::linear_cross_entropy_*, nn/linear_cross_entropy.h):
// one block per row of a chunk's scores, in the scores' own dtype. Forward takes the row's
// loss; backward turns the row into its gradient in place, dloss (softmax - onehot), so the
// chunk needs no probabilities beside it (the default's f32 [Nc, V]) and no zeroed gradient.
// Each is the max, the sum of exponentials (block reductions in a fixed order), then the loss
// or the gradient: the values the CPU device's softmax_cross_entropy gives from these scores,
// to rounding. Scalar accesses (Operand's typed loads where the dtypes allow); the scores
// were just written by the GEMM, so their passes mostly read from L2.
#include "nn/cuda/common.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

// The row's max and sum of exp(s - max), every thread getting both.
template <class A, class X>
__device__ void row_softmax_stats(const X& scores, int64_t row, int64_t V, A* scratch, A& mx, A& sum) {
  mx = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const A s = scores[row + v];
    mx = s > mx ? s : mx;
  }
  mx = block_reduce(mx, scratch, Max{});
  sum = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += exp(scores[row + v] - mx);
  sum = block_reduce(sum, scratch, Sum{});
}

template <class A, class X, class P>
__global__ void linear_xent_forward_kernel(P losses, X scores, const int32_t* targets, int64_t V, int* err) {
  __shared__ A scratch[32];
  const int64_t n = blockIdx.x, row = n * V;
  A mx, sum;
  row_softmax_stats<A>(scores, row, V, scratch, mx, sum);
  if (threadIdx.x == 0) {
    const int32_t t = targets[n];
    if (t == kIgnoreTarget) {
      losses.set(n, A(0));
    } else if (t < 0 || t >= V) {
      report(err, n, t);
    } else {
      losses.set(n, log(sum) - (scores[row + t] - mx));  // log-sum-exp, as softmax_xent_forward
    }
  }
}

template <class A, class X>
__global__ void linear_xent_backward_kernel(X scores, const int32_t* targets, int64_t V, A dloss) {
  __shared__ A scratch[32];
  const int64_t n = blockIdx.x, row = n * V;
  const int32_t t = targets[n];
  if (t == kIgnoreTarget) {  // no gradient: the row's scores become zeros
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) scores.set(row + v, A(0));
    return;
  }
  A mx, sum;
  row_softmax_stats<A>(scores, row, V, scratch, mx, sum);
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const A p = exp(scores[row + v] - mx) / sum;
    scores.set(row + v, dloss * (p - (v == t ? A(1) : A(0))));
  }
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
      auto& kernel = linear_xent_forward_kernel<A, X, P>;  // FERRY_LAUNCH takes its address
      FERRY_LAUNCH(kernel, static_cast<unsigned>(N), block_threads(), 0, as_stream(s), P(losses), X(scores),
                   targets, V, err);
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
      auto& kernel = linear_xent_backward_kernel<A, X>;
      FERRY_LAUNCH(kernel, static_cast<unsigned>(N), block_threads(), 0, as_stream(s), X(scores), targets, V,
                   static_cast<A>(dloss));
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
