// The device form of one NF4 matrix (nn/nf4.h): its whole quantization state in one
// contiguous byte region, the "blob", so that a unit's frozen span can hold it and every
// tier moves it as plain bytes (docs/design/adapters.md, section 5), and so that a kernel
// dequantizes any rectangle of it from one pointer.
//
// Layout, byte offsets from the blob's start (each aligned to 16 bytes):
//   double quantization:  code     256 float32 (the 8-bit code of the absmax quantization)
//                         offset   1 float32
//                         nested   one float32 per 256 blocks
//                         absmax   one uint8 code per block
//                         packed   (numel + 1) / 2 bytes, element 2k in byte k's high nibble
//   plain:                absmax   one float32 per block, then packed as above
// A matrix is [rows, cols] row-major, flattened into blocks of 64 elements that run across
// rows, exactly as bitsandbytes quantizes an nn.Linear weight: the blob is the Nf4Tensor
// of nf4_quantize over the flattened matrix, rearranged, nothing recomputed.
// Host byte order (little-endian on every machine ferry builds for; the GPU's too).
#pragma once

#include <cstdint>

#include "nn/nf4.h"

namespace ferry::nn {

struct Nf4Layout {
  int64_t rows = 0, cols = 0;
  bool double_quant = true;
  int64_t code_at = 0, offset_at = 0, nested_at = 0;  // double quantization only (0 otherwise)
  int64_t absmax_at = 0;  // uint8 codes (double quantization) or float32 absmax (plain)
  int64_t packed_at = 0;
  int64_t bytes = 0;  // the blob's length, a multiple of 16
  int64_t numel() const { return rows * cols; }
  int64_t blocks() const { return (numel() + kNf4BlockSize - 1) / kNf4BlockSize; }
  // Bytes a rectangle's dequantization reads: its packed nibbles and its blocks' scales
  // (a whole row range reads its blocks once; the op ledger's operand bytes).
  int64_t rect_bytes(int64_t r, int64_t c) const;
};

// The layout of a [rows, cols] matrix (rows, cols >= 0; std::invalid_argument otherwise).
Nf4Layout nf4_layout(int64_t rows, int64_t cols, bool double_quant);

// blob[0, l.bytes) = q rearranged (alignment gaps zeroed). q must match l (its numel, its
// double_quant; nf4_check passes), else std::invalid_argument.
void nf4_write_blob(const Nf4Tensor& q, const Nf4Layout& l, uint8_t* blob);
// The Nf4Tensor a blob holds (for an export that writes bitsandbytes' tensors, or a merge).
Nf4Tensor nf4_read_blob(const uint8_t* blob, const Nf4Layout& l);

// out[R, C] row-major = rows [r0, r0 + R) x columns [c0, c0 + C) of the dequantized matrix,
// bit for bit what nf4_dequantize gives for those elements. The rectangle must lie inside
// the matrix (std::invalid_argument). The reference of DeviceOps::nf4_dequantize.
void nf4_dequantize_rect(const uint8_t* blob, const Nf4Layout& l, int64_t r0, int64_t R, int64_t c0, int64_t C,
                         float* out);
// The same rectangle rounded once to bf16 (bf16 true) or f16, into out with row stride ld:
// f32_to_bf16 (f32_to_f16) of each value nf4_dequantize_rect gives, bit for bit, looked up
// in a table of the block's 16 rounded values (whole aligned blocks 64 at a time with
// AVX-512 where the build has it). DeviceOps::nf4_dequantize's 16-bit path on the CPU.
void nf4_dequantize_rect_16(const uint8_t* blob, const Nf4Layout& l, int64_t r0, int64_t R, int64_t c0, int64_t C,
                            uint16_t* out, int64_t ld, bool bf16);

}  // namespace ferry::nn
