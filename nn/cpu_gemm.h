// The CPU device's GEMM kernels on AVX-512, in place of Eigen's products where the CPU has
// the instructions (cpu_device.cpp chooses; f64, the tests' reference dtype, stays Eigen):
//   f32   FMA, a register tile of 8 rows by 32 columns, 1.08-1.14x Eigen's rate at
//         `ferry bench model`'s GPT shapes on the development machine (measured.md); thin
//         products (a rank-16 adapter's) read the operand that would be packed for few
//         products in place and skip a panel's padding vector: 1.1-2.6x Eigen's there;
//   bf16  VDPBF16PS (AVX512-BF16): two bf16 products per fp32 lane per instruction, about
//         twice the f32 kernel's rate (2.2-2.4x Eigen's f32 there), and neither operand
//         widened to a copy first
//         (cpu_device.cpp's Widen). It keeps the device's bf16 contract: every product is
//         exact in fp32 (8-bit significands), sums are fp32, each output rounded once.
//
// The arithmetic of one output element is fixed whatever M, N, the threads or the
// blocking, so a row's result never depends on which rank, batch or panel computed it:
//   f32:  acc = 0; for k = 0 .. K-1: acc = fma(a[k], b[k], acc)
//   bf16: acc = 0; for kp = 0 .. ceil(K/2) - 1 (K padded with one zero when odd):
//           acc = fma(a[2kp+1], b[2kp+1], acc); acc = fma(a[2kp], b[2kp], acc)
//         with bf16 subnormal inputs read as zero and subnormal sums flushed to zero
//         (VDPBF16PS's rules);
//   then out = beta == 0 ? alpha * acc : fma(alpha, acc, beta == 1 ? c : beta * c), rounded
//   once to C's dtype (bf16: nearest even, nn/dtype.h's f32_to_bf16).
// The *_reference functions compute exactly this in scalar code; the tests compare bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "nn/nf4_blob.h"

namespace ferry::nn::cpu {

// True when this build carries the kernel (compiled for a CPU that has the instructions,
// FERRY_NATIVE) and the running CPU has them; otherwise the device uses Eigen (widening
// bf16 operands to f32 first).
bool f32_gemm_available();
bool bf16_gemm_available();

// C = alpha op(A) op(B) + beta C, row-major. A is [M,K] with row stride lda, or [K,M] when
// ta; B is [K,N] with row stride ldb, or [N,K] when tb; C is [M,N] with row stride ldc.
// beta == 0 never reads C. Runs on the calling thread's OpenMP team; every element of C is
// computed by one thread. Throws std::logic_error when the kernel is not available.
void gemm_f32(float* c, int64_t ldc, const float* a, int64_t lda, bool ta, const float* b, int64_t ldb, bool tb,
              int64_t M, int64_t N, int64_t K, float alpha, float beta);
// bf16 A and B; C f32 (c_bf16 false) or bf16.
void gemm_bf16(void* c, bool c_bf16, int64_t ldc, const uint16_t* a, int64_t lda, bool ta, const uint16_t* b,
               int64_t ldb, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta);

// One NF4 piece of a weight W [R, in] (nn/nf4_matmul.h's Nf4Weight as host pointers): rows
// [row0, row0 + layout.rows) of W, its blob from `blob`.
struct Nf4Operand {
  const uint8_t* blob;
  Nf4Layout layout;
  int64_t row0;
};
// The bf16 kernel with op(B) read straight from NF4 pieces, dequantized as the operand is
// packed (a row of W at a time into scratch, never a panel of it): w_trans, op(B) = W^T
// (N = R, K = in: the forward x W^T), else op(B) = W (K = R, N = in: dx = dy W). A is bf16
// [M,K], not transposed. Each W value is f32_to_bf16 of nf4_dequantize_rect's, so C equals
// gemm_bf16 on the dequantized bf16 W bit for bit. std::invalid_argument when the pieces
// do not tile W's rows in order with K (w_trans) or N columns.
void gemm_bf16_nf4(void* c, bool c_bf16, int64_t ldc, const uint16_t* a, int64_t lda,
                   const std::vector<Nf4Operand>& w, bool w_trans, int64_t M, int64_t N, int64_t K, float alpha,
                   float beta);

// The same contracts in plain scalar code, single-threaded: the tests' references.
void gemm_f32_reference(float* c, int64_t ldc, const float* a, int64_t lda, bool ta, const float* b, int64_t ldb,
                        bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta);
void gemm_bf16_reference(void* c, bool c_bf16, int64_t ldc, const uint16_t* a, int64_t lda, bool ta,
                         const uint16_t* b, int64_t ldb, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                         float beta);

}  // namespace ferry::nn::cpu
