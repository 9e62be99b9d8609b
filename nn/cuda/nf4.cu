// NF4 dequantization (DeviceOps::nf4_dequantize, nn/nf4_blob.h): one thread per panel
// element, the block's scale and the NF4 value each computed with the float32 roundings of
// nn/nf4_blob.cpp (__fmul_rn and __fadd_rn: never contracted into an FMA), so the panel is
// the CPU device's bit for bit. A panel is written once per GEMM panel and read by cuBLAS
// (nn/nf4_matmul.cpp); the blob's scales are re-read by neighbouring threads from cache.
#include "nn/cuda/nf4.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

template <class A, class X>
__global__ void nf4_dequantize_kernel(X out, const uint8_t* blob, Nf4Args q, Nf4Values table, int64_t R, int64_t C,
                                      int64_t r0, int64_t c0) {
  for_each_cell(R, C, [&](int64_t i, int64_t r, int64_t c) {
    out.set(i, static_cast<A>(nf4_element(blob, q, table, (r0 + r) * q.cols + c0 + c)));
  });
}

}  // namespace

void nf4_dequantize(Stream s, Arr panel, const uint8_t* blob, const Nf4Args& q, int64_t R, int64_t C, int64_t r0,
                    int64_t c0) {
  if (R * C == 0) return;
  const Nf4Values table = nf4_values();
  if (panel.dtype == DType::f64) {
    using X = Operand<double, Arr>;
    auto& kernel = nf4_dequantize_kernel<double, X>;
    FERRY_LAUNCH(kernel, grid_for(R * C), block_threads(), 0, as_stream(s), X(panel), blob, q, table, R, C, r0, c0);
  } else {
    by_type<float>(panel, [&](auto t) {
      using X = Operand<float, typename decltype(t)::type>;
      auto& kernel = nf4_dequantize_kernel<float, X>;
      FERRY_LAUNCH(kernel, grid_for(R * C), block_threads(), 0, as_stream(s), X(panel), blob, q, table, R, C, r0,
                   c0);
    });
  }
  FERRY_CUDA_CHECK_LAUNCH();
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
