#include "nn/cpu_bf16_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "nn/dtype.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define FERRY_BF16_GEMM 1
#endif

namespace ferry::nn::cpu {

namespace {

// Element (m, k) of op(A) and (k, n) of op(B), zero past K (the odd K's pad).
struct Operand {
  const uint16_t* p;
  int64_t ld;
  bool trans;
  int64_t K;
  uint16_t a(int64_t m, int64_t k) const { return k >= K ? 0 : trans ? p[k * ld + m] : p[m * ld + k]; }
  uint16_t b(int64_t k, int64_t n) const { return k >= K ? 0 : trans ? p[n * ld + k] : p[k * ld + n]; }
};

float daz(uint16_t h) { return (h & 0x7f80u) == 0 ? ((h & 0x8000u) ? -0.0f : 0.0f) : bf16_to_f32(h); }
float ftz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

}  // namespace

void gemm_bf16_reference(void* c, bool c_bf16, int64_t ldc, const uint16_t* a, int64_t lda, bool ta,
                         const uint16_t* b, int64_t ldb, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                         float beta) {
  const Operand A{a, lda, ta, K}, B{b, ldb, tb, K};
  const int64_t Kp = (K + 1) / 2;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t kp = 0; kp < Kp; ++kp) {
        acc = ftz(std::fma(daz(A.a(m, 2 * kp + 1)), daz(B.b(2 * kp + 1, n)), acc));
        acc = ftz(std::fma(daz(A.a(m, 2 * kp)), daz(B.b(2 * kp, n)), acc));
      }
      const int64_t at = m * ldc + n;
      float out = alpha * acc;
      if (beta != 0.0f) {
        const float old = c_bf16 ? bf16_to_f32(static_cast<uint16_t*>(c)[at]) : static_cast<float*>(c)[at];
        out = std::fma(alpha, acc, beta == 1.0f ? old : beta * old);
      }
      if (c_bf16) {
        static_cast<uint16_t*>(c)[at] = f32_to_bf16(out);
      } else {
        static_cast<float*>(c)[at] = out;
      }
    }
  }
}

#ifdef FERRY_BF16_GEMM

namespace {

// Register tile: MR rows of op(A) by NR = 32 columns of op(B) (two 16-lane vectors), so
// 2 MR accumulators, two B loads and MR broadcasts per pair of k.
constexpr int kMR = 8;
constexpr int64_t kNR = 32;
// Columns of op(B) packed at once, shared by the team: Kp x 256 pairs (K x 512 bytes).
constexpr int64_t kNC = 256;

uint32_t pair(uint16_t lo, uint16_t hi) { return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16); }

// Rows [m0, m0 + mr) of op(A) as [Kp][kMR] pairs (k even in the low half), zero padded.
void pack_a(uint32_t* dst, const Operand& A, int64_t m0, int64_t mr, int64_t Kp) {
  const int64_t K = A.K;
  if (!A.trans) {
    for (int64_t i = 0; i < kMR; ++i) {
      if (i >= mr) {
        for (int64_t kp = 0; kp < Kp; ++kp) dst[kp * kMR + i] = 0;
        continue;
      }
      const uint16_t* row = A.p + (m0 + i) * A.ld;
      const int64_t full = K / 2;
      for (int64_t kp = 0; kp < full; ++kp) {
        uint32_t v;
        std::memcpy(&v, row + 2 * kp, 4);
        dst[kp * kMR + i] = v;
      }
      if (full < Kp) dst[full * kMR + i] = pair(row[K - 1], 0);
    }
    return;
  }
  for (int64_t kp = 0; kp < Kp; ++kp) {
    const uint16_t* lo = A.p + 2 * kp * A.ld + m0;
    const uint16_t* hi = 2 * kp + 1 < K ? lo + A.ld : nullptr;
    uint32_t* d = dst + kp * kMR;
    for (int64_t i = 0; i < kMR; ++i) d[i] = i < mr ? pair(lo[i], hi ? hi[i] : 0) : 0;
  }
}

// Columns [n0, n0 + nr) of op(B) as [Kp][kNR] pairs, zero padded.
void pack_b(uint32_t* dst, const Operand& B, int64_t n0, int64_t nr, int64_t Kp) {
  const int64_t K = B.K;
  if (B.trans) {
    for (int64_t j = 0; j < kNR; ++j) {
      if (j >= nr) {
        for (int64_t kp = 0; kp < Kp; ++kp) dst[kp * kNR + j] = 0;
        continue;
      }
      const uint16_t* row = B.p + (n0 + j) * B.ld;
      const int64_t full = K / 2;
      for (int64_t kp = 0; kp < full; ++kp) {
        uint32_t v;
        std::memcpy(&v, row + 2 * kp, 4);
        dst[kp * kNR + j] = v;
      }
      if (full < Kp) dst[full * kNR + j] = pair(row[K - 1], 0);
    }
    return;
  }
  for (int64_t kp = 0; kp < Kp; ++kp) {
    const uint16_t* lo = B.p + 2 * kp * B.ld + n0;
    const uint16_t* hi = 2 * kp + 1 < K ? lo + B.ld : nullptr;
    uint32_t* d = dst + kp * kNR;
    for (int64_t j = 0; j < kNR; ++j) d[j] = j < nr ? pair(lo[j], hi ? hi[j] : 0) : 0;
  }
}

// acc[i][v] over every pair of k, in order: VDPBF16PS adds the odd product, then the even.
void micro(const uint32_t* ap, const uint32_t* bp, int64_t Kp, __m512 (&acc)[kMR][2]) {
#pragma GCC unroll 8
  for (int i = 0; i < kMR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < Kp; ++kp) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + 16);
#pragma GCC unroll 8
    for (int i = 0; i < kMR; ++i) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(ap[i]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], x, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], x, b1);
    }
    ap += kMR;
    bp += kNR;
  }
}

// f32_to_bf16 on 16 lanes: nearest even, NaN kept quiet.
__m256i round_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i top = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(top, _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, top, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}

// Row m's lanes [n, n + count) of C from acc: alpha acc (+ beta C), rounded once.
void store(void* c, bool c_bf16, int64_t at, int count, __m512 acc, float alpha, float beta) {
  const __mmask16 mask = static_cast<__mmask16>(count >= 16 ? 0xffff : (1u << count) - 1);
  const __m512 va = _mm512_set1_ps(alpha);
  __m512 out;
  if (beta == 0.0f) {
    out = _mm512_mul_ps(va, acc);
  } else {
    __m512 old;
    if (c_bf16) {
      const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<uint16_t*>(c) + at);
      old = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      old = _mm512_maskz_loadu_ps(mask, static_cast<float*>(c) + at);
    }
    if (beta != 1.0f) old = _mm512_mul_ps(_mm512_set1_ps(beta), old);
    out = _mm512_fmadd_ps(va, acc, old);
  }
  if (c_bf16) {
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(c) + at, mask, round_bf16(out));
  } else {
    _mm512_mask_storeu_ps(static_cast<float*>(c) + at, mask, out);
  }
}

}  // namespace

bool bf16_gemm_available() {
  static const bool yes = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return yes;
}

void gemm_bf16(void* c, bool c_bf16, int64_t ldc, const uint16_t* a, int64_t lda, bool ta, const uint16_t* b,
               int64_t ldb, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
  if (!bf16_gemm_available()) throw std::logic_error("gemm_bf16: this CPU has no AVX512-BF16");
  if (M <= 0 || N <= 0) return;
  const Operand A{a, lda, ta, K}, B{b, ldb, tb, K};
  const int64_t Kp = (K + 1) / 2;
  const int64_t tiles = (M + kMR - 1) / kMR;
  std::vector<uint32_t> bpack(static_cast<size_t>(kNC / kNR * Kp * kNR));
  // One team for the whole product: B's block is packed by all, then (tile, panel) pairs
  // are shared out in tile-major order, so a thread repacks A only when its tile changes.
#pragma omp parallel
  {
    std::vector<uint32_t> apack(static_cast<size_t>(Kp * kMR));
    __m512 acc[kMR][2];
    for (int64_t n0 = 0; n0 < N; n0 += kNC) {
      const int64_t nc = std::min(kNC, N - n0);
      const int64_t panels = (nc + kNR - 1) / kNR;
#pragma omp for schedule(static)
      for (int64_t p = 0; p < panels; ++p) {
        pack_b(bpack.data() + p * Kp * kNR, B, n0 + p * kNR, std::min(kNR, nc - p * kNR), Kp);
      }
      int64_t packed = -1;
#pragma omp for schedule(static)
      for (int64_t idx = 0; idx < tiles * panels; ++idx) {
        const int64_t tile = idx / panels, p = idx % panels;
        const int64_t m0 = tile * kMR, mr = std::min<int64_t>(kMR, M - m0);
        if (tile != packed) {
          pack_a(apack.data(), A, m0, mr, Kp);
          packed = tile;
        }
        micro(apack.data(), bpack.data() + p * Kp * kNR, Kp, acc);
        const int64_t col = n0 + p * kNR, cols = std::min(kNR, nc - p * kNR);
        for (int64_t i = 0; i < mr; ++i) {
          for (int v = 0; v < 2 && v * 16 < cols; ++v) {
            store(c, c_bf16, (m0 + i) * ldc + col + v * 16, static_cast<int>(std::min<int64_t>(16, cols - v * 16)),
                  acc[i][v], alpha, beta);
          }
        }
      }
    }
  }
}

#else  // a build for CPUs without AVX512-BF16: the device widens instead

bool bf16_gemm_available() { return false; }

void gemm_bf16(void*, bool, int64_t, const uint16_t*, int64_t, bool, const uint16_t*, int64_t, bool, int64_t, int64_t,
               int64_t, float, float) {
  throw std::logic_error("gemm_bf16: this build has no AVX512-BF16 kernel (FERRY_NATIVE on a CPU that has it)");
}

#endif

}  // namespace ferry::nn::cpu
