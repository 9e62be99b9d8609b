// A bf16 x bf16 GEMM for the CPU device on AVX512-BF16 (VDPBF16PS): two bf16 products
// per fp32 lane per instruction, twice the multiply rate of the fp32 GEMM the device
// otherwise widens bf16 operands into (cpu_device.cpp's Widen), and without the widened
// copies. It keeps the device's bf16 contract: every product is exact in fp32 (8-bit
// significands), sums are fp32, each output is rounded once.
//
// The arithmetic of one output element, fixed whatever M, N, the threads or the blocking
// (so a row's result never depends on which rank or panel computed it):
//   acc = 0;  for kp = 0 .. ceil(K/2) - 1 (K padded with one zero when odd):
//     acc = fma(a[2kp+1], b[2kp+1], acc);  acc = fma(a[2kp], b[2kp], acc)
//   with bf16 subnormal inputs read as zero and subnormal sums flushed to zero
//   (VDPBF16PS's rules); then
//   out = beta == 0 ? alpha * acc : fma(alpha, acc, beta == 1 ? c : beta * c)
//   rounded once to C's dtype (bf16: nearest even, nn/dtype.h's f32_to_bf16).
// gemm_bf16_reference computes exactly this in scalar code; the tests compare bit for bit.
#pragma once

#include <cstdint>

namespace ferry::nn::cpu {

// True when this build carries the AVX512-BF16 kernel (compiled for a CPU that has it,
// FERRY_NATIVE) and the running CPU has the instructions; otherwise the device widens.
bool bf16_gemm_available();

// C = alpha op(A) op(B) + beta C, row-major. A is bf16 [M,K] with row stride lda, or
// [K,M] when ta; B is bf16 [K,N] with row stride ldb, or [N,K] when tb; C is [M,N] with
// row stride ldc, f32 (c_bf16 false) or bf16. beta == 0 never reads C. Runs on the
// calling thread's OpenMP team. Throws std::logic_error when !bf16_gemm_available().
void gemm_bf16(void* c, bool c_bf16, int64_t ldc, const uint16_t* a, int64_t lda, bool ta, const uint16_t* b,
               int64_t ldb, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta);

// The same contract in plain scalar code, single-threaded: the tests' reference.
void gemm_bf16_reference(void* c, bool c_bf16, int64_t ldc, const uint16_t* a, int64_t lda, bool ta,
                         const uint16_t* b, int64_t ldb, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                         float beta);

}  // namespace ferry::nn::cpu
