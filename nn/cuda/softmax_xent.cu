// Softmax with cross-entropy over the vocabulary: one block per row forward (log-sum-exp
// loss, the target flag), a grid-stride over the logits backward. Logits and their
// gradient typed (f32, bf16 or f16 with f32 probabilities) and moved 16 bytes at a time
// where rows allow (V a multiple of 8 and aligned); the Arr switch for other mixes
// (docs/design/cuda.md, "Memory-bound kernels").
#include "nn/cuda/common.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

// X: the logits' operand, P: the probabilities' and losses'. vectors: rows of V / W chunks.
template <class A, class X, class P>
__global__ void softmax_xent_forward_kernel(P losses, P probs, X logits, const int32_t* targets,
                                            int64_t V, bool vectors, int* err) {
  constexpr int W = kChunkWidth<X, P>;
  __shared__ A scratch[32];
  const int64_t n = blockIdx.x, row = n * V;
  const int64_t chunks = vectors ? V / W : 0, base = n * chunks;
  A mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < chunks; j += blockDim.x) {
    A l[W];
    logits.load(base + j, l);
    for (int k = 0; k < W; ++k) mx = l[k] > mx ? l[k] : mx;
  }
  for (int64_t v = chunks * W + threadIdx.x; v < V; v += blockDim.x) {
    const A l = logits[row + v];
    mx = l > mx ? l : mx;
  }
  mx = block_reduce(mx, scratch, Max{});
  A sum = 0;
  for (int64_t j = threadIdx.x; j < chunks; j += blockDim.x) {
    A l[W];
    logits.load(base + j, l);
    for (int k = 0; k < W; ++k) sum += exp(l[k] - mx);
  }
  for (int64_t v = chunks * W + threadIdx.x; v < V; v += blockDim.x) sum += exp(logits[row + v] - mx);
  sum = block_reduce(sum, scratch, Sum{});
  for (int64_t j = threadIdx.x; j < chunks; j += blockDim.x) {
    A l[W];
    logits.load(base + j, l);
    for (int k = 0; k < W; ++k) l[k] = exp(l[k] - mx) / sum;
    probs.store(base + j, l);
  }
  for (int64_t v = chunks * W + threadIdx.x; v < V; v += blockDim.x)
    probs.set(row + v, exp(logits[row + v] - mx) / sum);
  if (threadIdx.x == 0) {
    const int32_t t = targets[n];
    if (t == kIgnoreTarget) {
      losses.set(n, A(0));
    } else if (t < 0 || t >= V) {
      report(err, n, t);
    } else {
      losses.set(n, log(sum) - (logits[row + t] - mx));  // log-sum-exp: exact where p underflows
    }
  }
}

// dlogits += dloss (probs - onehot(target)) on rows whose target is not ignored; each
// thread keeps its cell's row as it strides (for_each_cell), no division per element.
template <class A, class X, class P>
__global__ void softmax_xent_backward_kernel(X dlogits, P probs, const int32_t* targets, int64_t N,
                                             int64_t V, A dloss, bool vectors) {
  constexpr int W = kChunkWidth<X, P>;
  if (vectors) {
    for_each_cell(N, V / W, [&](int64_t j, int64_t n, int64_t c) {
      const int32_t t = targets[n];
      if (t == kIgnoreTarget) return;
      A d[W], p[W];
      dlogits.load(j, d);
      probs.load(j, p);
      for (int k = 0; k < W; ++k) {
        const A onehot = c * W + k == t ? A(1) : A(0);
        d[k] = d[k] + dloss * (p[k] - onehot);
      }
      dlogits.store(j, d);
    });
  } else {
    for_each_cell(N, V, [&](int64_t i, int64_t n, int64_t v) {
      const int32_t t = targets[n];
      if (t == kIgnoreTarget) return;
      const A onehot = v == t ? A(1) : A(0);
      dlogits.set(i, dlogits[i] + dloss * (probs[i] - onehot));
    });
  }
}

}  // namespace

void softmax_cross_entropy_forward(Stream s, Arr losses, Arr probs, Arr logits,
                                   const int32_t* targets, int64_t N, int64_t V, int* err) {
  if (N == 0) return;
  by_acc(wide(losses, probs, logits), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({logits}, {losses, probs}, [&](auto x, auto y) {
      using X = Operand<A, typename decltype(x)::type>;
      using P = Operand<A, typename decltype(y)::type>;
      constexpr int W = kChunkWidth<X, P>;
      const bool vectors = V % W == 0 && vector_chunks<X, P>(V, {logits.p, probs.p}) > 0;
      auto& kernel = softmax_xent_forward_kernel<A, X, P>;  // FERRY_LAUNCH takes its address
      FERRY_LAUNCH(kernel, static_cast<unsigned>(N), block_threads(), 0, as_stream(s), P(losses),
                   P(probs), X(logits), targets, V, vectors, err);
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void softmax_cross_entropy_backward(Stream s, Arr dlogits, Arr probs, const int32_t* targets,
                                    int64_t N, int64_t V, double dloss) {
  if (N * V == 0) return;
  by_acc(wide(dlogits, probs), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({dlogits}, {probs}, [&](auto x, auto y) {
      using X = Operand<A, typename decltype(x)::type>;
      using P = Operand<A, typename decltype(y)::type>;
      constexpr int W = kChunkWidth<X, P>;
      const bool vectors = V % W == 0 && vector_chunks<X, P>(V, {dlogits.p, probs.p}) > 0;
      auto& kernel = softmax_xent_backward_kernel<A, X, P>;
      FERRY_LAUNCH(kernel, grid_for(vectors ? N * V / W : N * V), block_threads(), 0, as_stream(s),
                   X(dlogits), P(probs), targets, N, V, static_cast<A>(dloss), vectors);
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
