// SwiGLU (Llama's MLP) and GELU's tanh approximation (GPT-2), forward and backward: 16
// bytes per operand per thread step where the operands allow it, one element otherwise
// (docs/design/cuda.md, "Memory-bound kernels").
#include "nn/cuda/common.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

// The element formulas, shared by the vector and scalar loops (the same bits either way).
template <class A>
__device__ __forceinline__ A swiglu(A g, A u) {
  return g / (A(1) + exp(-g)) * u;
}
// d(silu(g) u)/dg and /du, times d.
template <class A>
__device__ __forceinline__ void swiglu_grad(A g, A u, A d, A& dg, A& du) {
  const A sg = A(1) / (A(1) + exp(-g));
  dg = d * u * sg * (A(1) + g * (A(1) - sg));
  du = d * g * sg;
}

// Rows of [gate | up] (2H) to rows of H: a thread keeps its cell's row and column as it
// strides (for_each_cell); chunks of the row when H is a multiple of the chunk width.
template <class A, class X>
__global__ void swiglu_forward_kernel(X out, X gate_up, int64_t N, int64_t H, bool vectors) {
  constexpr int W = X::kWidth;
  if (vectors) {
    const int64_t HW = H / W;
    for_each_cell(N, HW, [&](int64_t j, int64_t n, int64_t h) {
      A g[W], u[W];
      gate_up.load(n * 2 * HW + h, g);
      gate_up.load(n * 2 * HW + HW + h, u);
      FERRY_UNROLL
      for (int k = 0; k < W; ++k) g[k] = swiglu(g[k], u[k]);
      out.store(j, g);
    });
  } else {
    for_each_cell(N, H, [&](int64_t i, int64_t n, int64_t h) {
      out.set(i, swiglu(gate_up[n * 2 * H + h], gate_up[n * 2 * H + H + h]));
    });
  }
}

template <class A, class X>
__global__ void swiglu_backward_kernel(X dgate_up, X gate_up, X dout, int64_t N, int64_t H,
                                       bool vectors) {
  constexpr int W = X::kWidth;
  if (vectors) {
    const int64_t HW = H / W;
    for_each_cell(N, HW, [&](int64_t j, int64_t n, int64_t h) {
      const int64_t gj = n * 2 * HW + h, uj = gj + HW;
      A g[W], u[W], d[W], dg[W], du[W];
      gate_up.load(gj, g);
      gate_up.load(uj, u);
      dout.load(j, d);
      dgate_up.load(gj, dg);
      dgate_up.load(uj, du);
      FERRY_UNROLL
      for (int k = 0; k < W; ++k) {
        A eg, eu;
        swiglu_grad(g[k], u[k], d[k], eg, eu);
        dg[k] = dg[k] + eg;
        du[k] = du[k] + eu;
      }
      dgate_up.store(gj, dg);
      dgate_up.store(uj, du);
    });
  } else {
    for_each_cell(N, H, [&](int64_t i, int64_t n, int64_t h) {
      const int64_t gi = n * 2 * H + h, ui = gi + H;
      A eg, eu;
      swiglu_grad(gate_up[gi], gate_up[ui], dout[i], eg, eu);
      dgate_up.set(gi, dgate_up[gi] + eg);
      dgate_up.set(ui, dgate_up[ui] + eu);
    });
  }
}

constexpr double kGeluK = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluC = 0.044715;

template <class A>
__device__ __forceinline__ A gelu(A x) {
  return A(0.5) * x * (A(1) + tanh(A(kGeluK) * (x + A(kGeluC) * x * x * x)));
}
template <class A>
__device__ __forceinline__ A gelu_grad(A x) {
  const A th = tanh(A(kGeluK) * (x + A(kGeluC) * x * x * x));
  return A(0.5) * (A(1) + th) +
         A(0.5) * x * (A(1) - th * th) * A(kGeluK) * (A(1) + A(3 * kGeluC) * x * x);
}

template <class A, class X>
__global__ void gelu_forward_kernel(X out, X inp, int64_t n, int64_t chunks) {
  constexpr int W = X::kWidth;
  for_each_chunk<W>(
      n, chunks,
      [&](int64_t j) {
        A x[W];
        inp.load(j, x);
        FERRY_UNROLL
        for (int k = 0; k < W; ++k) x[k] = gelu(x[k]);
        out.store(j, x);
      },
      [&](int64_t i) { out.set(i, gelu(inp[i])); });
}

template <class A, class X>
__global__ void gelu_backward_kernel(X dinp, X inp, X dout, int64_t n, int64_t chunks) {
  constexpr int W = X::kWidth;
  for_each_chunk<W>(
      n, chunks,
      [&](int64_t j) {
        A x[W], d[W], g[W];
        inp.load(j, x);
        dout.load(j, d);
        dinp.load(j, g);
        FERRY_UNROLL
        for (int k = 0; k < W; ++k) g[k] = g[k] + d[k] * gelu_grad(x[k]);
        dinp.store(j, g);
      },
      [&](int64_t i) { dinp.set(i, dinp[i] + dout[i] * gelu_grad(inp[i])); });
}

}  // namespace

void swiglu_forward(Stream s, Arr out, Arr gate_up, int64_t N, int64_t H) {
  if (N * H == 0) return;
  by_acc(wide(out, gate_up), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({out, gate_up}, {}, [&](auto x, auto) {
      using X = Operand<A, typename decltype(x)::type>;
      const bool vectors = H % X::kWidth == 0 && vector_chunks<X>(H, {out.p, gate_up.p}) > 0;
      auto& kernel = swiglu_forward_kernel<A, X>;  // a reference: FERRY_LAUNCH takes its address
      FERRY_LAUNCH(kernel, grid_for(vectors ? N * H / X::kWidth : N * H), block_threads(), 0,
                   as_stream(s), X(out), X(gate_up), N, H, vectors);
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(Stream s, Arr dgate_up, Arr gate_up, Arr dout, int64_t N, int64_t H) {
  if (N * H == 0) return;
  by_acc(wide(dgate_up, gate_up, dout), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({dgate_up, gate_up, dout}, {}, [&](auto x, auto) {
      using X = Operand<A, typename decltype(x)::type>;
      const bool vectors =
          H % X::kWidth == 0 && vector_chunks<X>(H, {dgate_up.p, gate_up.p, dout.p}) > 0;
      auto& kernel = swiglu_backward_kernel<A, X>;
      FERRY_LAUNCH(kernel, grid_for(vectors ? N * H / X::kWidth : N * H), block_threads(), 0,
                   as_stream(s), X(dgate_up), X(gate_up), X(dout), N, H, vectors);
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void gelu_forward(Stream s, Arr out, Arr inp, int64_t n) {
  if (n == 0) return;
  by_acc(wide(out, inp), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({out, inp}, {}, [&](auto x, auto) {
      using X = Operand<A, typename decltype(x)::type>;
      const int64_t chunks = vector_chunks<X>(n, {out.p, inp.p});
      auto& kernel = gelu_forward_kernel<A, X>;
      FERRY_LAUNCH(kernel, grid_for_chunks(n, chunks, X::kWidth), block_threads(), 0,
                   as_stream(s), X(out), X(inp), n, chunks);
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void gelu_backward(Stream s, Arr dinp, Arr inp, Arr dout, int64_t n) {
  if (n == 0) return;
  by_acc(wide(dinp, inp, dout), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({dinp, inp, dout}, {}, [&](auto x, auto) {
      using X = Operand<A, typename decltype(x)::type>;
      const int64_t chunks = vector_chunks<X>(n, {dinp.p, inp.p, dout.p});
      auto& kernel = gelu_backward_kernel<A, X>;
      FERRY_LAUNCH(kernel, grid_for_chunks(n, chunks, X::kWidth), block_threads(), 0,
                   as_stream(s), X(dinp), X(inp), X(dout), n, chunks);
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
