// One NF4 value on the GPU, as nn/nf4_blob.cpp computes it on the CPU: the block's scale
// (double quantization: code[absmax byte] x nested scale + offset) and the 4-bit code's
// table value times it, each with one float32 rounding (__fmul_rn, __fadd_rn: never
// contracted into an FMA), so every device gives the same bits. For the dequantizing
// kernels (nf4.cu's panels, nf4_gemm.cu's operand loads).
#pragma once

#include "nn/cuda/common.cuh"
#include "nn/nf4.h"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
namespace detail {

struct Nf4Values {
  float v[16];
};

inline Nf4Values nf4_values() {
  Nf4Values t;
  for (int k = 0; k < 16; ++k) t.v[k] = kNf4Table[static_cast<size_t>(k)];
  return t;
}

// Element e (row-major over the matrix's [rows, q.cols]) of the matrix in `blob`.
__device__ __forceinline__ float nf4_element(const uint8_t* blob, const Nf4Args& q, const Nf4Values& table,
                                             int64_t e) {
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
  return __fmul_rn(table.v[(e & 1) ? (byte & 15) : (byte >> 4)], s);
}

}  // namespace detail
FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
