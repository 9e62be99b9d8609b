// The PTX instructions of the mma.sync attention kernels (nn/cuda/attention_mma*.cu), each
// behind one small __device__ function: inline asm under nvcc, and under the CPU emulation
// (FERRY_CUDA_EMULATION) the emulation of testing/emu_mma.h, which does per lane what the
// PTX ISA documents. Kernels touch tensor-core fragments only through these functions and
// through the fragment layouts below, which are the PTX ISA's ("Matrix Fragments for
// mma.m16n8k16 with floating point type", .bf16/.f16), so what CI runs is what a GPU runs.
//
// Per lane: groupID g = lane / 4, threadID_in_group t = lane % 4.
// - A (16x16, row): a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9],
//   a[3] = A[g+8][2t+8, 2t+9] (two 16-bit elements per 32-bit register, the lower column
//   in the low half).
// - B (16x8, col): b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g].
// - C, D (16x8, f32): c[0], c[1] = C[g][2t, 2t+1], c[2], c[3] = C[g+8][2t, 2t+1].
// So an accumulator's two 8-column tiles side by side are, packed to 16 bits, the A
// fragment of a 16x16 product: FlashAttention-2's P = softmax(S) fed to P V from registers.
// ldmatrix .x4: lanes 8j..8j+7 give the row addresses (16 bytes each, 16-byte aligned, in
// shared memory) of 8x8 matrix j; lane i receives in r[j] row i / 4, columns 2 (i % 4) and
// 2 (i % 4) + 1 of matrix j, or with .trans column i / 4, rows 2 (i % 4) and 2 (i % 4) + 1.
// cp.async.cg: 16 bytes from global to shared memory behind the thread's back, visible to
// the thread once cp_async_wait<N> has waited for the group (cp_async_commit closes one),
// and to other threads after a barrier as well. All need compute capability 8.0: compiled
// for an older GPU (CMAKE_CUDA_ARCHITECTURES below 80) each traps, and the launchers never
// run the kernels there (mma_attention_obstacle).
#pragma once

#include <cstdint>
#include <type_traits>

#include "nn/cuda/common.cuh"

#if defined(FERRY_CUDA_EMULATION) || !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define FERRY_MMA_ARCH 1
#else
#define FERRY_MMA_ARCH 0
#endif

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
namespace detail {

// The 16-bit type's two floats rounded to nearest and packed: lo in bits 0-15.
template <class S>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
#ifdef FERRY_CUDA_EMULATION
  return uint32_t{__float2bfloat16_rn(lo).bits} | uint32_t{__float2bfloat16_rn(hi).bits} << 16;
#else
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
#endif
}

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
#ifdef FERRY_CUDA_EMULATION
  return uint32_t{__float2half_rn(lo).bits} | uint32_t{__float2half_rn(hi).bits} << 16;
#else
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
#endif
}

// d = a b + c, one warp, every lane with its fragments (layouts above); S: __nv_bfloat16
// or __half. d may be c.
template <class S>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                             const float (&c)[4]) {
#ifdef FERRY_CUDA_EMULATION
  ::ferry_emu::mma::mma_m16n8k16(d, a, b, c, std::is_same_v<S, __nv_bfloat16>);
#elif FERRY_MMA_ARCH
  if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
  }
#else
  (void)d, (void)a, (void)b, (void)c;
  __trap();
#endif
}

#if !defined(FERRY_CUDA_EMULATION)
__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
#endif

// Four 8x8 matrices of 16-bit elements; `row` is this lane's row address (see above).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#ifdef FERRY_CUDA_EMULATION
  ::ferry_emu::mma::ldmatrix_x4(r, row, false);
#elif FERRY_MMA_ARCH
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#else
  (void)r, (void)row;
  __trap();
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
#ifdef FERRY_CUDA_EMULATION
  ::ferry_emu::mma::ldmatrix_x4(r, row, true);
#elif FERRY_MMA_ARCH
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#else
  (void)r, (void)row;
  __trap();
#endif
}

// 16 bytes from global `src` to shared `dst` (both 16-byte aligned), or 16 zero bytes
// where `valid` is false (src is then not read: pass any mapped address).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
#ifdef FERRY_CUDA_EMULATION
  ::ferry_emu::mma::cp_async_16(dst, src, valid);
#elif FERRY_MMA_ARCH
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
#else
  (void)dst, (void)src, (void)valid;
  __trap();
#endif
}

// Closes the group of this thread's cp_async_16 calls since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#ifdef FERRY_CUDA_EMULATION
  ::ferry_emu::mma::cp_async_commit();
#elif FERRY_MMA_ARCH
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef FERRY_CUDA_EMULATION
  ::ferry_emu::mma::cp_async_wait(N);
#elif FERRY_MMA_ARCH
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

}  // namespace detail
FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
