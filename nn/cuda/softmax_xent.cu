// Softmax with cross-entropy over the vocabulary: one block per row forward (log-sum-exp
// loss, the target flag), one thread per logit backward.
#include "nn/cuda/common.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

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

}  // namespace

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

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
