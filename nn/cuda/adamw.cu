// AdamW over f32 shards kept on the device (nn/adamw_formula.h's element step).
#include "nn/cuda/common.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n,
                             AdamWConstants k) {
  FERRY_FOR_EACH(i, n) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_element(k, pi, g[i], mi, vi);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

void adamw(Stream s, float* p, const float* g, float* m, float* v, int64_t n,
           const AdamWConstants& k) {
  if (n == 0) return;
  FERRY_LAUNCH(adamw_kernel, grid_for(n), block_threads(), 0, as_stream(s), p, g, m, v, n, k);
  FERRY_CUDA_CHECK_LAUNCH();
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
