// LayerNorm (GPT-2) and RMSNorm (Llama): one block per row forward and for the input
// gradient; the weight gradients are column reductions (nn/cuda/column_reduce.cuh).
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

}  // namespace

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

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
