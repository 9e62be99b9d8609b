// AdamW over f32 shards kept on the device (nn/adamw_formula.h's element step), 16 bytes
// per stream per thread step.
#include "nn/cuda/common.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

// Four f32 streams: 16 bytes of each per thread step where all four are aligned, then the
// tail one element at a time (the same element formula either way).
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n,
                             int64_t chunks, AdamWConstants k) {
  constexpr int W = 4;
  for_each_chunk<W>(
      n, chunks,
      [&](int64_t j) {
        Vec<float, W> pj = vec_load<float, W>(p + j * W), mj = vec_load<float, W>(m + j * W),
                      vj = vec_load<float, W>(v + j * W);
        const Vec<float, W> gj = vec_load<float, W>(g + j * W);
        for (int e = 0; e < W; ++e) adamw_element(k, pj.e[e], gj.e[e], mj.e[e], vj.e[e]);
        vec_store<float, W>(p + j * W, pj);
        vec_store<float, W>(m + j * W, mj);
        vec_store<float, W>(v + j * W, vj);
      },
      [&](int64_t i) {
        float pi = p[i], mi = m[i], vi = v[i];
        adamw_element(k, pi, g[i], mi, vi);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
      });
}

}  // namespace

void adamw(Stream s, float* p, const float* g, float* m, float* v, int64_t n,
           const AdamWConstants& k) {
  if (n == 0) return;
  const int64_t chunks = aligned16({p, g, m, v}) ? n / 4 : 0;
  FERRY_LAUNCH(adamw_kernel, grid_for_chunks(n, chunks, 4), block_threads(), 0, as_stream(s), p, g,
               m, v, n, chunks, k);
  FERRY_CUDA_CHECK_LAUNCH();
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
