// SwiGLU (Llama's MLP) and GELU's tanh approximation (GPT-2), forward and backward: one
// thread per element.
#include "nn/cuda/common.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

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

}  // namespace

void swiglu_forward(Stream s, Arr out, Arr gate_up, int64_t N, int64_t H) {
  if (N * H == 0) return;
  by_acc(wide(out, gate_up), [&](auto a) {
    FERRY_LAUNCH(swiglu_forward_kernel<decltype(a)>, grid_for(N * H), block_threads(), 0, as_stream(s),
                 out, gate_up, N, H);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(Stream s, Arr dgate_up, Arr gate_up, Arr dout, int64_t N, int64_t H) {
  if (N * H == 0) return;
  by_acc(wide(dgate_up, gate_up, dout), [&](auto a) {
    FERRY_LAUNCH(swiglu_backward_kernel<decltype(a)>, grid_for(N * H), block_threads(), 0, as_stream(s),
                 dgate_up, gate_up, dout, N, H);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void gelu_forward(Stream s, Arr out, Arr inp, int64_t n) {
  if (n == 0) return;
  by_acc(wide(out, inp), [&](auto a) {
    FERRY_LAUNCH(gelu_forward_kernel<decltype(a)>, grid_for(n), block_threads(), 0, as_stream(s), out, inp,
                 n);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void gelu_backward(Stream s, Arr dinp, Arr inp, Arr dout, int64_t n) {
  if (n == 0) return;
  by_acc(wide(dinp, inp, dout), [&](auto a) {
    FERRY_LAUNCH(gelu_backward_kernel<decltype(a)>, grid_for(n), block_threads(), 0, as_stream(s), dinp,
                 inp, dout, n);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
