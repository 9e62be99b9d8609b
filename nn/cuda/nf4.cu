// NF4 dequantization (DeviceOps::nf4_dequantize, nn/nf4_blob.h): one thread per panel
// element, the block's scale and the NF4 value each computed with the float32 roundings of
// nn/nf4_blob.cpp (__fmul_rn and __fadd_rn: never contracted into an FMA), so the panel is
// the CPU device's bit for bit. A panel is written once per GEMM panel and read by cuBLAS
// (nn/nf4_matmul.cpp); the blob's scales are re-read by neighbouring threads from cache.
#include "nn/cuda/common.cuh"
#include "nn/nf4.h"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

struct Nf4Values {
  float v[16];
};

template <class A, class X>
__global__ void nf4_dequantize_kernel(X out, const uint8_t* blob, Nf4Args q, Nf4Values table, int64_t R, int64_t C,
                                      int64_t r0, int64_t c0) {
  for_each_cell(R, C, [&](int64_t i, int64_t r, int64_t c) {
    const int64_t e = (r0 + r) * q.cols + c0 + c;
    const int64_t b = e / kNf4BlockSize;
    float s;
    if (q.double_quant) {
      const float code = reinterpret_cast<const float*>(blob + q.code_at)[blob[q.absmax_at + b]];
      const float nested = reinterpret_cast<const float*>(blob + q.nested_at)[b / kNf4NestedBlockSize];
      const float offset = *reinterpret_cast<const float*>(blob + q.offset_at);
      s = __fadd_rn(__fmul_rn(code, nested), offset);
    } else {
      s = reinterpret_cast<const float*>(blob + q.absmax_at)[b];
    }
    const uint8_t byte = blob[q.packed_at + e / 2];
    const float w = __fmul_rn(table.v[(e & 1) ? (byte & 15) : (byte >> 4)], s);
    out.set(i, static_cast<A>(w));
  });
}

}  // namespace

void nf4_dequantize(Stream s, Arr panel, const uint8_t* blob, const Nf4Args& q, int64_t R, int64_t C, int64_t r0,
                    int64_t c0) {
  if (R * C == 0) return;
  Nf4Values table;
  for (int k = 0; k < 16; ++k) table.v[k] = kNf4Table[static_cast<size_t>(k)];
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
