// Rotary position embeddings (Hugging Face's Llama layout), forward and the inverse rotation
// for backward, in place or accumulating: a thread per row and rotated pair, over the heads
// (docs/design/cuda.md, "Memory-bound kernels").
#include "nn/cuda/common.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

// One thread per (row, rotated pair i): the angle depends on the position and i alone, so
// the thread computes its cos/sin once (in double, then rounded to A: the CPU kernel's table,
// entry by entry) and rotates pair i of every head of the row; in place is safe (it reads
// both halves of a pair before writing). A second grid-stride copies or adds the
// pass-through columns past heads * hd. Rows and columns kept incrementally
// (for_each_cell): no 64-bit division per element. The double pow/cos/sin are what cost
// here (about 150 double operations a pair): one set per row and pair instead of one per
// element brings them from above the memory time to a fraction of it.
template <class A, class X>
__global__ void rope_kernel(X out, X inp, int64_t N, int64_t T, int64_t heads, int64_t hd,
                            int64_t width, Rope rope, bool inverse, bool accumulate, bool copy) {
  const int64_t half = hd / 2;
  for_each_cell(N, half, [&](int64_t, int64_t n, int64_t i) {
    const double a = static_cast<double>(n % T) * rope.inv_freq(i, hd);
    const A cs = static_cast<A>(cos(a));
    const A sn = static_cast<A>(inverse ? -sin(a) : sin(a));
    for (int64_t h = 0, e = n * width + i; h < heads; ++h, e += hd) {
      const A x1 = inp[e], x2 = inp[e + half];
      const A y1 = x1 * cs - x2 * sn, y2 = x2 * cs + x1 * sn;
      if (accumulate) {
        out.set(e, out[e] + y1);
        out.set(e + half, out[e + half] + y2);
      } else {
        out.set(e, y1);
        out.set(e + half, y2);
      }
    }
  });
  if (!copy) return;
  const int64_t rotated = heads * hd;
  for_each_cell(N, width - rotated, [&](int64_t, int64_t n, int64_t c) {
    const int64_t e = n * width + rotated + c;
    out.set(e, accumulate ? out[e] + inp[e] : inp[e]);
  });
}

}  // namespace

void rope(Stream s, Arr out, Arr inp, int64_t N, int64_t T, int64_t heads, int64_t hd,
          int64_t width, const Rope& rope, bool inverse, bool accumulate) {
  if (N * width == 0) return;
  const int64_t pass = width - heads * hd;
  const bool copy = pass > 0 && (accumulate || out.p != inp.p);
  by_acc(wide(out, inp), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({out, inp}, {}, [&](auto x, auto) {
      using X = Operand<A, typename decltype(x)::type>;
      auto& kernel = rope_kernel<A, X>;  // a reference: FERRY_LAUNCH takes its address
      FERRY_LAUNCH(kernel, grid_for(std::max(N * (hd / 2), copy ? N * pass : 0)), block_threads(),
                   0, as_stream(s), X(out), X(inp), N, T, heads, hd, width, rope, inverse,
                   accumulate, copy);
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
