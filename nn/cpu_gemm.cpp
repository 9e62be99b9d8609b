#include "nn/cpu_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "nn/dtype.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define FERRY_F32_GEMM 1
#endif
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define FERRY_BF16_GEMM 1
#endif

namespace ferry::nn::cpu {

namespace {

// Element (m, k) of op(A) and (k, n) of op(B), zero past K (the bf16 odd K's pad).
template <class T>
struct Operand {
  const T* p;
  int64_t ld;
  bool trans;
  int64_t K;
  T a(int64_t m, int64_t k) const { return k >= K ? T{0} : trans ? p[k * ld + m] : p[m * ld + k]; }
  T b(int64_t k, int64_t n) const { return k >= K ? T{0} : trans ? p[n * ld + k] : p[k * ld + n]; }
};

float daz(uint16_t h) { return (h & 0x7f80u) == 0 ? ((h & 0x8000u) ? -0.0f : 0.0f) : bf16_to_f32(h); }
float ftz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

float epilogue(float acc, float old, float alpha, float beta) {
  return beta == 0.0f ? alpha * acc : std::fma(alpha, acc, beta == 1.0f ? old : beta * old);
}

}  // namespace

void gemm_f32_reference(float* c, int64_t ldc, const float* a, int64_t lda, bool ta, const float* b, int64_t ldb,
                        bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
  const Operand<float> A{a, lda, ta, K}, B{b, ldb, tb, K};
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc = std::fma(A.a(m, k), B.b(k, n), acc);
      float& out = c[m * ldc + n];
      out = epilogue(acc, beta == 0.0f ? 0.0f : out, alpha, beta);
    }
  }
}

void gemm_bf16_reference(void* c, bool c_bf16, int64_t ldc, const uint16_t* a, int64_t lda, bool ta,
                         const uint16_t* b, int64_t ldb, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                         float beta) {
  const Operand<uint16_t> A{a, lda, ta, K}, B{b, ldb, tb, K};
  const int64_t Kp = (K + 1) / 2;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t kp = 0; kp < Kp; ++kp) {
        acc = ftz(std::fma(daz(A.a(m, 2 * kp + 1)), daz(B.b(2 * kp + 1, n)), acc));
        acc = ftz(std::fma(daz(A.a(m, 2 * kp)), daz(B.b(2 * kp, n)), acc));
      }
      const int64_t at = m * ldc + n;
      float old = 0.0f;
      if (beta != 0.0f) old = c_bf16 ? bf16_to_f32(static_cast<uint16_t*>(c)[at]) : static_cast<float*>(c)[at];
      const float out = epilogue(acc, old, alpha, beta);
      if (c_bf16) {
        static_cast<uint16_t*>(c)[at] = f32_to_bf16(out);
      } else {
        static_cast<float*>(c)[at] = out;
      }
    }
  }
}

#ifdef FERRY_F32_GEMM

namespace {

// Register tile: kMR rows of op(A) by kNR = 32 columns of op(B) (two 16-lane vectors): 2 kMR
// accumulators, two B loads and kMR broadcasts per step of k. Both operands are packed into
// 32-bit "units" along k: an f32 element, or a pair of bf16 (k even in the low half).
constexpr int kMR = 8;
constexpr int64_t kNR = 32;
// Columns of op(B) packed at once and shared by the team: as many as fit in 4 MiB (at least
// 256, a multiple of 64 so that a block of NF4 columns starts on a quantization block),
// so that A is packed again only once per such block.
constexpr int64_t kPackBytes = int64_t{4} << 20;

uint32_t pair(uint16_t lo, uint16_t hi) { return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16); }

template <class T>
uint32_t bits(T v) {
  if constexpr (sizeof(T) == 4) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return u;
  } else {
    return v;
  }
}

// Units along k: K for f32, ceil(K/2) pairs for bf16.
template <class T>
int64_t units_of(int64_t K) {
  return sizeof(T) == 4 ? K : (K + 1) / 2;
}

// Unit u of a row that is contiguous along k (padded with zero past K).
template <class T>
uint32_t unit_at(const T* row, int64_t u, int64_t K) {
  if constexpr (sizeof(T) == 4) {
    return bits(row[u]);
  } else {
    if (2 * u + 1 < K) {
      uint32_t v;
      std::memcpy(&v, row + 2 * u, 4);
      return v;
    }
    return pair(row[2 * u], 0);
  }
}

// Unit u at column j from rows that run along m (or n): rows k = u (f32) or 2u, 2u + 1 (bf16).
template <class T>
uint32_t unit_across(const T* base, int64_t ld, int64_t u, int64_t j, int64_t K) {
  if constexpr (sizeof(T) == 4) {
    return bits(base[u * ld + j]);
  } else {
    const uint16_t lo = base[2 * u * ld + j];
    return pair(lo, 2 * u + 1 < K ? base[(2 * u + 1) * ld + j] : 0);
  }
}

// Lines [first, first + count) of an operand (rows of op(A), columns of op(B)) as
// [units][W] (W = kMR or kNR), zero padded. along_k: each line is contiguous along k in
// memory (A not transposed, B transposed), else lines run across the rows k.
template <int64_t W, class T>
void pack(uint32_t* dst, const T* p, int64_t ld, bool along_k, int64_t K, int64_t first, int64_t count, int64_t U) {
  if (along_k) {
    for (int64_t i = 0; i < W; ++i) {
      const T* line = i < count ? p + (first + i) * ld : nullptr;
      for (int64_t u = 0; u < U; ++u) dst[u * W + i] = line ? unit_at(line, u, K) : 0;
    }
    return;
  }
  for (int64_t u = 0; u < U; ++u) {
    for (int64_t i = 0; i < W; ++i) dst[u * W + i] = i < count ? unit_across(p + first, ld, u, i, K) : 0;
  }
}

template <class T>
void pack_a(uint32_t* dst, const Operand<T>& A, int64_t m0, int64_t mr, int64_t U) {
  pack<kMR>(dst, A.p, A.ld, !A.trans, A.K, m0, mr, U);
}

template <class T>
void pack_b(uint32_t* dst, const Operand<T>& B, int64_t n0, int64_t nr, int64_t U) {
  pack<kNR>(dst, B.p, B.ld, B.trans, B.K, n0, nr, U);
}

// acc[i][v] over every unit of k, in order (VDPBF16PS adds a pair's odd product, then the even).
// Row i's unit u of A is ap[u * a_u + i * a_i]: packed ([U][kMR]: a_u = kMR, a_i = 1), or
// for f32 read where it lies (AP float: a row along k, a_u = 1 and a_i = lda; across, a_u =
// lda and a_i = 1). B's two vectors are at bp + u * b_u and 16 further: packed (b_u = kNR)
// or, for f32 not transposed, in place (b_u = ldb). NV = 1 leaves out the second vector's
// products, for a panel of at most 16 columns (an adapter's rank) whose rest is padding.
template <class T, int NV, class AP, class BP>
void micro(const AP* ap, int64_t a_u, int64_t a_i, const BP* bp, int64_t b_u, int64_t U, __m512 (&acc)[kMR][2]) {
#pragma GCC unroll 8
  for (int i = 0; i < kMR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t u = 0; u < U; ++u) {
    const __m512i b0 = _mm512_loadu_si512(bp);
    const __m512i b1 = NV == 2 ? _mm512_loadu_si512(bp + 16) : b0;
#pragma GCC unroll 8
    for (int i = 0; i < kMR; ++i) {
      __m512i x;
      if constexpr (std::is_same_v<AP, float>) {
        x = _mm512_castps_si512(_mm512_set1_ps(ap[i * a_i]));
      } else {
        x = _mm512_set1_epi32(static_cast<int>(ap[i * a_i]));
      }
      if constexpr (sizeof(T) == 4) {
        acc[i][0] = _mm512_fmadd_ps(_mm512_castsi512_ps(x), _mm512_castsi512_ps(b0), acc[i][0]);
        if constexpr (NV == 2) acc[i][1] = _mm512_fmadd_ps(_mm512_castsi512_ps(x), _mm512_castsi512_ps(b1), acc[i][1]);
      } else {
#ifdef FERRY_BF16_GEMM
        acc[i][0] = _mm512_dpbf16_ps(acc[i][0], (__m512bh)x, (__m512bh)b0);
        if constexpr (NV == 2) acc[i][1] = _mm512_dpbf16_ps(acc[i][1], (__m512bh)x, (__m512bh)b1);
#endif
      }
    }
    ap += a_u;
    bp += b_u;
  }
}

#ifdef FERRY_BF16_GEMM
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
#endif

// Lanes [at, at + count) of C from acc: alpha acc (+ beta C), rounded once.
void store(void* c, bool c_bf16, int64_t at, int count, __m512 acc, float alpha, float beta) {
  const __mmask16 mask = static_cast<__mmask16>(count >= 16 ? 0xffff : (1u << count) - 1);
  const __m512 va = _mm512_set1_ps(alpha);
  __m512 out;
  if (beta == 0.0f) {
    out = _mm512_mul_ps(va, acc);
  } else {
    __m512 old;
    if (!c_bf16) {
      old = _mm512_maskz_loadu_ps(mask, static_cast<float*>(c) + at);
    } else {
#ifdef FERRY_BF16_GEMM  // bf16 outputs come only from the bf16 kernel (AVX512BW and VL)
      const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<uint16_t*>(c) + at);
      old = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#else
      old = _mm512_setzero_ps();
#endif
    }
    if (beta != 1.0f) old = _mm512_mul_ps(_mm512_set1_ps(beta), old);
    out = _mm512_fmadd_ps(va, acc, old);
  }
  if (c_bf16) {
#ifdef FERRY_BF16_GEMM
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(c) + at, mask, round_bf16(out));
#endif
  } else {
    _mm512_mask_storeu_ps(static_cast<float*>(c) + at, mask, out);
  }
}

// The whole product. pack_block(bpack, n0, nc, U) packs columns [n0, n0 + nc) of op(B) as
// panels of [U][kNR] units, one after another; it runs on every thread of the team and
// shares its work out with an orphaned `omp for` (whose barrier ends the packing).
// For f32, `in_place` lets thin products skip packing what each element of would serve few
// products (the LoRA adapters' products, whose rank is 16): A's tiles are read where they
// lie when op(B) has at most two panels, and op(B) (not transposed, whole panels) when A
// has at most four tiles. Packing is a copy: the arithmetic is the same either way.
template <class T, class PackBlock>
void drive(void* c, bool c_bf16, int64_t ldc, const T* a, int64_t lda, bool ta, const PackBlock& pack_block,
           int64_t M, int64_t N, int64_t K, float alpha, float beta, const Operand<T>* in_place = nullptr) {
  if (M <= 0 || N <= 0) return;
  const Operand<T> A{a, lda, ta, K};
  const int64_t U = units_of<T>(K);
  const int64_t tiles = (M + kMR - 1) / kMR;
  const int64_t fit = kPackBytes / (4 * std::max<int64_t>(U, 1)) / 64 * 64;
  const int64_t NC = std::min((N + kNR - 1) / kNR * kNR, std::max<int64_t>(256, fit));
  bool a_in_place = false, b_in_place = false;
  if constexpr (sizeof(T) == 4) {
    a_in_place = in_place && N <= 2 * kNR;
    b_in_place = in_place && !in_place->trans && tiles <= 4 && N % kNR == 0;
  }
  // Not zeroed: every panel is packed whole (padding included) before it is read. Allocated
  // here, not in the team, so that running out of memory throws instead of terminating.
  const std::unique_ptr<uint32_t[]> bpack(b_in_place ? nullptr : new uint32_t[static_cast<size_t>(NC * U)]);
  // One team for the whole product: B's block is packed by all, then (tile, panel) pairs
  // are shared out in tile-major order, so a thread repacks A only when its tile changes.
#pragma omp parallel
  {
    std::vector<uint32_t> apack(static_cast<size_t>(U * kMR));
    __m512 acc[kMR][2];
    for (int64_t n0 = 0; n0 < N; n0 += NC) {
      const int64_t nc = std::min(NC, N - n0);
      const int64_t panels = (nc + kNR - 1) / kNR;
      if (!b_in_place) pack_block(bpack.get(), n0, nc, U);
      int64_t packed = -1;
#pragma omp for schedule(static)
      for (int64_t idx = 0; idx < tiles * panels; ++idx) {
        const int64_t tile = idx / panels, p = idx % panels;
        const int64_t m0 = tile * kMR, mr = std::min<int64_t>(kMR, M - m0);
        const int64_t col = n0 + p * kNR, cols = std::min(kNR, nc - p * kNR);
        const bool a_direct = a_in_place && mr == kMR;
        if (!a_direct && tile != packed) {
          pack_a(apack.data(), A, m0, mr, U);
          packed = tile;
        }
        const auto run = [&](const auto* ap, int64_t a_u, int64_t a_i) {
          if constexpr (sizeof(T) == 4) {
            if (b_in_place) {
              const float* bp = reinterpret_cast<const float*>(in_place->p) + col;
              return micro<T, 2>(ap, a_u, a_i, bp, in_place->ld, U, acc);
            }
          }
          const uint32_t* bp = bpack.get() + p * U * kNR;
          if (cols <= 16) return micro<T, 1>(ap, a_u, a_i, bp, kNR, U, acc);
          micro<T, 2>(ap, a_u, a_i, bp, kNR, U, acc);
        };
        if constexpr (sizeof(T) == 4) {
          if (a_direct) {
            const float* ap = reinterpret_cast<const float*>(a);
            if (ta) {
              run(ap + m0, lda, int64_t{1});
            } else {
              run(ap + m0 * lda, int64_t{1}, lda);
            }
          } else {
            run(apack.data(), int64_t{kMR}, int64_t{1});
          }
        } else {
          run(apack.data(), int64_t{kMR}, int64_t{1});
        }
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

// Dense op(B): each panel packed by one thread.
template <class T>
auto dense_blocks(const Operand<T>& B) {
  return [B](uint32_t* bpack, int64_t n0, int64_t nc, int64_t U) {
    const int64_t panels = (nc + kNR - 1) / kNR;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < panels; ++p) pack_b(bpack + p * U * kNR, B, n0 + p * kNR, std::min(kNR, nc - p * kNR), U);
  };
}

}  // namespace

bool f32_gemm_available() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

void gemm_f32(float* c, int64_t ldc, const float* a, int64_t lda, bool ta, const float* b, int64_t ldb, bool tb,
              int64_t M, int64_t N, int64_t K, float alpha, float beta) {
  if (!f32_gemm_available()) throw std::logic_error("gemm_f32: this CPU has no AVX-512");
  const Operand<float> B{b, ldb, tb, K};
  drive<float>(c, false, ldc, a, lda, ta, dense_blocks(B), M, N, K, alpha, beta, &B);
}

#else  // a build for CPUs without AVX-512: the device uses Eigen

bool f32_gemm_available() { return false; }

void gemm_f32(float*, int64_t, const float*, int64_t, bool, const float*, int64_t, bool, int64_t, int64_t, int64_t,
              float, float) {
  throw std::logic_error("gemm_f32: this build has no AVX-512 kernel (FERRY_NATIVE on a CPU that has it)");
}

#endif

#ifdef FERRY_BF16_GEMM

bool bf16_gemm_available() {
  static const bool yes = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return yes;
}

void gemm_bf16(void* c, bool c_bf16, int64_t ldc, const uint16_t* a, int64_t lda, bool ta, const uint16_t* b,
               int64_t ldb, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
  if (!bf16_gemm_available()) throw std::logic_error("gemm_bf16: this CPU has no AVX512-BF16");
  drive<uint16_t>(c, c_bf16, ldc, a, lda, ta, dense_blocks(Operand<uint16_t>{b, ldb, tb, K}), M, N, K, alpha, beta);
}

namespace {

// The piece holding row r of W (the pieces tile W's rows in order).
const Nf4Operand& piece_of(const std::vector<Nf4Operand>& w, int64_t r) {
  for (const Nf4Operand& p : w)
    if (r >= p.row0 && r < p.row0 + p.layout.rows) return p;
  throw std::invalid_argument("gemm_bf16_nf4: no piece holds row " + std::to_string(r));
}

// Row r of W, columns [c0, c0 + n), in bf16 (zeros past W's rows: the odd K's pad).
void w_row(uint16_t* out, const std::vector<Nf4Operand>& w, int64_t rows, int64_t r, int64_t c0, int64_t n) {
  if (r >= rows) {
    std::fill_n(out, n, uint16_t{0});
    return;
  }
  const Nf4Operand& p = piece_of(w, r);
  nf4_dequantize_rect_16(p.blob, p.layout, r - p.row0, 1, c0, n, out, n, true);
}

}  // namespace

void gemm_bf16_nf4(void* c, bool c_bf16, int64_t ldc, const uint16_t* a, int64_t lda,
                   const std::vector<Nf4Operand>& w, bool w_trans, int64_t M, int64_t N, int64_t K, float alpha,
                   float beta) {
  if (!bf16_gemm_available()) throw std::logic_error("gemm_bf16_nf4: this CPU has no AVX512-BF16");
  int64_t rows = 0;
  for (const Nf4Operand& p : w) {
    if (p.row0 != rows || p.layout.cols != (w_trans ? K : N)) {
      throw std::invalid_argument("gemm_bf16_nf4: the pieces must tile W's rows in order, each " +
                                  std::to_string(w_trans ? K : N) + " columns wide");
    }
    rows += p.layout.rows;
  }
  if (rows != (w_trans ? N : K)) {
    throw std::invalid_argument("gemm_bf16_nf4: W has " + std::to_string(rows) + " rows, the product needs " +
                                std::to_string(w_trans ? N : K));
  }
  if (w_trans) {
    // op(B)(k, n) = W[n][k]: a panel's 32 columns are 32 rows of W, each dequantized whole
    // into a row of scratch (whole aligned blocks vectorised) and dealt out as pairs.
    auto blocks = [&](uint32_t* bpack, int64_t n0, int64_t nc, int64_t U) {
      const int64_t panels = (nc + kNR - 1) / kNR;
#pragma omp for schedule(static)
      for (int64_t p = 0; p < panels; ++p) {
        std::vector<uint16_t> row(static_cast<size_t>(2 * U), 0);
        uint32_t* dst = bpack + p * U * kNR;
        for (int64_t j = 0; j < kNR; ++j) {
          const int64_t n = n0 + p * kNR + j;
          if (n >= n0 + nc) {
            for (int64_t u = 0; u < U; ++u) dst[u * kNR + j] = 0;
            continue;
          }
          w_row(row.data(), w, rows, n, 0, K);
          for (int64_t u = 0; u < U; ++u) dst[u * kNR + j] = pair(row[2 * u], row[2 * u + 1]);
        }
      }
    };
    drive<uint16_t>(c, c_bf16, ldc, a, lda, false, blocks, M, N, K, alpha, beta);
    return;
  }
  // op(B)(k, n) = W[k][n]: unit u of every panel is rows 2u and 2u + 1 of W over the block's
  // columns, dequantized as two row segments (n0 is a multiple of 64: aligned blocks).
  auto blocks = [&](uint32_t* bpack, int64_t n0, int64_t nc, int64_t U) {
    const int64_t panels = (nc + kNR - 1) / kNR;
    std::vector<uint16_t> lo(static_cast<size_t>(panels * kNR), 0), hi(lo.size(), 0);
#pragma omp for schedule(static)
    for (int64_t u = 0; u < U; ++u) {
      w_row(lo.data(), w, rows, 2 * u, n0, nc);
      w_row(hi.data(), w, rows, 2 * u + 1, n0, nc);
      for (int64_t j = 0; j < panels * kNR; ++j) bpack[(j / kNR) * U * kNR + u * kNR + j % kNR] = pair(lo[j], hi[j]);
    }
  };
  drive<uint16_t>(c, c_bf16, ldc, a, lda, false, blocks, M, N, K, alpha, beta);
}

#else  // a build for CPUs without AVX512-BF16: the device widens instead

bool bf16_gemm_available() { return false; }

void gemm_bf16(void*, bool, int64_t, const uint16_t*, int64_t, bool, const uint16_t*, int64_t, bool, int64_t, int64_t,
               int64_t, float, float) {
  throw std::logic_error("gemm_bf16: this build has no AVX512-BF16 kernel (FERRY_NATIVE on a CPU that has it)");
}

void gemm_bf16_nf4(void*, bool, int64_t, const uint16_t*, int64_t, const std::vector<Nf4Operand>&, bool, int64_t,
                   int64_t, int64_t, float, float) {
  throw std::logic_error("gemm_bf16_nf4: this build has no AVX512-BF16 kernel (FERRY_NATIVE on a CPU that has it)");
}

#endif

}  // namespace ferry::nn::cpu
