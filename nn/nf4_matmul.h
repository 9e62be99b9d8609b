// Products with a frozen NF4 weight (QLoRA's base, docs/design/adapters.md section 5): W
// is dequantized a panel at a time into a temporary of the compute dtype
// (DeviceOps::nf4_dequantize) and multiplied by the device's GEMM on column windows
// (DeviceOps::gemm_cols), so no full-precision copy of a layer exists: at most
// kNf4PanelElements values at once. A weight may be several NF4 pieces (one per Hugging Face
// module of a packed projection, each quantized on its own); a panel gathers whatever rows
// of each it covers, so the product is one GEMM per panel whatever the pieces. Forward cuts
// W by rows (each panel fills its own output columns), backward by columns (likewise for
// dx): every output element is one GEMM's dot product over the whole inner dimension,
// rounded once, as with the dequantized weight multiplied whole (bitsandbytes'
// matmul_4bit for training: dequantize_4bit, then torch's matmul); with one panel, the very
// GEMM the dense weight gets. A device that multiplies straight from the blobs
// (DeviceOps::nf4_gemm: the CPU device, dequantizing each row of W as its GEMM packs the
// operand, so not even a panel exists) does so instead, with the same values.
#pragma once

#include <cstdint>
#include <vector>

#include "nn/device.h"
#include "nn/nf4_blob.h"

namespace ferry::nn {

// One NF4 matrix of a layer's weight: rows [row0, row0 + layout.rows) of it (one Hugging
// Face projection of a packed one, such as q_proj of Llama's wqkv, has its own quantization
// state, as bitsandbytes quantizes each nn.Linear), its blob the raw bytes of `blob` (a view
// of a unit's frozen span, any dtype) from its first byte.
struct Nf4Weight {
  Tensor blob;
  Nf4Layout layout;  // [rows, in]
  int64_t row0 = 0;
};

// The largest dequantized panel, in elements (8 MiB in bf16).
inline constexpr int64_t kNf4PanelElements = int64_t{1} << 22;
// The most pieces the cuda device's fused kernel takes in one product (nn/cuda_kernels.h's
// kNf4GemmMaxPieces; more fall back to panels): a packed projection has three at most.
inline constexpr size_t kNf4FusedMaxPieces = 8;

// W is `pieces`, which cover rows [0, R) in order with one row length `in`
// (std::invalid_argument otherwise). max_panel: the panel bound (tests make it small).
// c[:, c_col + j] = beta c[:, c_col + j] + sum_k a[:, k] W[j, k] for j < R: the forward
// y = x W^T into W's columns of y. a [N, in], c [N, ldc]; the panel in a's dtype.
void nf4_matmul_nt(Device& dev, const Tensor& c, int64_t c_col, const Tensor& a, const std::vector<Nf4Weight>& pieces,
                   double beta, int64_t max_panel = kNf4PanelElements);
// c[:, k] = beta c[:, k] + sum_j a[:, a_col + j] W[j, k]: the input gradient dx = dy W from
// W's columns of dy. a [N, lda], c [N, in]; the panel in a's dtype.
void nf4_matmul_nn(Device& dev, const Tensor& c, const Tensor& a, int64_t a_col, const std::vector<Nf4Weight>& pieces,
                   double beta, int64_t max_panel = kNf4PanelElements);

}  // namespace ferry::nn
