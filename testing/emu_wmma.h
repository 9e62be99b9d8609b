// The CPU emulation of CUDA's warp matrix functions (nvcuda::wmma, <mma.h>) for the
// emulated test builds (testing/cuda_emulation.h; tests only, FERRY_CUDA_EMULATION).
//
// What it keeps of the documented semantics (CUDA C++ Programming Guide, "Warp Matrix
// Functions"), 16x16x16 tiles of bf16 or f16 with an f32 accumulator:
// - d = a b + c with the products exact and the sums in f32, k in order;
// - which lane holds which element of a fragment is unspecified, so kernels may touch
//   fragments only through fill/load/store/mma: here a multiplicand fragment holds the
//   whole tile in every lane, and an accumulator holds in lane L the elements e = L mod 32
//   of the row-major tile (so a warp's mma does the GPU's 4096 multiply-adds, not 32 times
//   that);
// - loads need a 256-bit aligned pointer and ldm a multiple of 16 bytes: anything else is
//   std::logic_error naming the function (a GPU's result is undefined there), thrown on the
//   lane's fiber, so the process ends with that message;
// - every lane of the warp must make the same calls with the same pointer, ldm and layout
//   (the *_sync functions are warp-wide): the lanes' calls are compared whenever they
//   meet, and a difference is std::logic_error naming the warp and block;
// - a warp's lanes share nothing through these calls: a lane's load reads the whole tile
//   itself, and a store writes only that lane's 1/32 of the elements. So a kernel that
//   reads a stored tile, or loads one that other lanes wrote, without __syncwarp between,
//   reads stale elements here (fibers run a lane up to its next barrier), as it may on a GPU.
// Not emulated: the fragments' x[] elements and num_elements (kernels here do not use them).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "testing/cuda_emulation.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "cuda emulation: 16x16x16 fragments only");
  static_assert(std::is_same_v<Use, accumulator> ? std::is_same_v<T, float> && std::is_void_v<Layout>
                                                 : (std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>) &&
                                                       (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>),
                "cuda emulation: a multiplicand fragment is bf16 or f16 with row_major or col_major, an accumulator "
                "float without a layout (as nvcc requires at 16x16x16)");
  static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
  float tile[rows * cols];  // the whole tile, row-major, in every lane
};

namespace emu {

inline float widen(float x) {
  return x;
}
inline float widen(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
inline float widen(__half x) {
  return __half2float(x);
}
// Rounds to what a fragment of T holds (fill_fragment converts the value to T).
inline float as_held(float v, float*) {
  return v;
}
inline float as_held(float v, __nv_bfloat16*) {
  return __bfloat162float(__float2bfloat16_rn(v));
}
inline float as_held(float v, __half*) {
  return __half2float(__float2half_rn(v));
}

inline void check(const void* p, unsigned ldm, size_t element, const char* fn) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0) {
    throw std::logic_error(std::string("cuda emulation: ") + fn + ": the pointer is not 256-bit aligned");
  }
  if ((ldm * element) % 16 != 0) {
    throw std::logic_error(std::string("cuda emulation: ") + fn + ": ldm " + std::to_string(ldm) +
                           " is not a multiple of 16 bytes");
  }
}

inline unsigned lane() {
  return threadIdx.x % 32;
}

}  // namespace emu

template <class Use, int M, int N, int K, class T, class L>
void fill_fragment(fragment<Use, M, N, K, T, L>& f, float v) {
  ::ferry_emu::wmma_called({1, nullptr, 0, 0});
  const float held = emu::as_held(v, static_cast<T*>(nullptr));
  for (float& x : f.tile) x = held;  // an accumulator's other lanes' elements are never read
}

// Multiplicand tiles: element (r, c) at p[r * ldm + c] (row_major) or p[c * ldm + r].
template <class Use, int M, int N, int K, class T, class L>
void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const T* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "accumulators load with a layout_t");
  emu::check(p, ldm, sizeof(T), "load_matrix_sync");
  ::ferry_emu::wmma_called({2, p, ldm, std::is_same_v<L, row_major> ? 0 : 1});
  using F = fragment<Use, M, N, K, T, L>;
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      f.tile[r * F::cols + c] =
          emu::widen(std::is_same_v<L, row_major> ? p[r * ldm + c] : p[c * ldm + r]);
}

template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm, layout_t layout) {
  emu::check(p, ldm, sizeof(float), "load_matrix_sync");
  ::ferry_emu::wmma_called({3, p, ldm, static_cast<int>(layout)});
  for (int e = static_cast<int>(emu::lane()); e < M * N; e += 32) {
    const int r = e / N, c = e % N;
    f.tile[e] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
  }
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t layout) {
  emu::check(p, ldm, sizeof(float), "store_matrix_sync");
  ::ferry_emu::wmma_called({4, p, ldm, static_cast<int>(layout)});
  for (int e = static_cast<int>(emu::lane()); e < M * N; e += 32) {
    const int r = e / N, c = e % N;
    (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.tile[e];
  }
}

template <int M, int N, int K, class T, class LA, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
              const fragment<matrix_b, M, N, K, T, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
  ::ferry_emu::wmma_called({5, nullptr, 0, 0});
  for (int e = static_cast<int>(emu::lane()); e < M * N; e += 32) {
    const int m = e / N, n = e % N;
    float acc = c.tile[e];
    for (int k = 0; k < K; ++k) acc += a.tile[m * K + k] * b.tile[k * N + n];
    d.tile[e] = acc;  // d may be c: element e of c has been read
  }
}

}  // namespace nvcuda::wmma
