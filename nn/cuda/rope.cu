// Rotary position embeddings (Hugging Face's Llama layout), forward and the inverse rotation
// for backward, in place or accumulating.
#include "nn/cuda/common.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

// One thread per element of a row; the thread of the first half of a rotated pair computes
// both (in place is safe: it reads both before writing), the second half's does nothing.
template <class A>
__global__ void rope_kernel(Arr out, Arr inp, int64_t N, int64_t T, int64_t heads, int64_t hd,
                            int64_t width, Rope rope, bool inverse, bool accumulate) {
  const int64_t half = hd / 2;
  FERRY_FOR_EACH(e, N * width) {
    const int64_t n = e / width, c = e % width;
    if (c >= heads * hd) {
      if (accumulate) {
        st<A>(out, e, ld<A>(out, e) + ld<A>(inp, e));
      } else if (out.p != inp.p) {
        st<A>(out, e, ld<A>(inp, e));
      }
      continue;
    }
    const int64_t i = c % hd;
    if (i >= half) continue;
    // The angle in double, cos/sin rounded to A: the CPU kernel's table, entry by entry.
    const double a = static_cast<double>(n % T) *
                     rope.inv_freq(i, hd);
    const A cs = static_cast<A>(cos(a));
    const A sn = static_cast<A>(inverse ? -sin(a) : sin(a));
    const A x1 = ld<A>(inp, e), x2 = ld<A>(inp, e + half);
    const A y1 = x1 * cs - x2 * sn, y2 = x2 * cs + x1 * sn;
    if (accumulate) {
      st<A>(out, e, ld<A>(out, e) + y1);
      st<A>(out, e + half, ld<A>(out, e + half) + y2);
    } else {
      st<A>(out, e, y1);
      st<A>(out, e + half, y2);
    }
  }
}

}  // namespace

void rope(Stream s, Arr out, Arr inp, int64_t N, int64_t T, int64_t heads, int64_t hd,
          int64_t width, const Rope& rope, bool inverse, bool accumulate) {
  if (N * width == 0) return;
  by_acc(wide(out, inp), [&](auto a) {
    FERRY_LAUNCH(rope_kernel<decltype(a)>, grid_for(N * width), block_threads(), 0, as_stream(s), out, inp,
                 N, T, heads, hd, width, rope, inverse, accumulate);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
