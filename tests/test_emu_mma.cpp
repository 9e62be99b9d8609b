// The emulation of the mma.sync attention kernels' PTX (testing/emu_mma.h through the
// wrappers of nn/cuda/mma.cuh) against the PTX ISA's per-lane layouts, written out here
// once more from the ISA's tables, and against a plain matrix product: one warp loads a
// 16x16 A and a 16x8 B from shared memory with ldmatrix (B stored by rows of n, as K is in
// the attention kernels, or by rows of k through .trans, as V is) and multiplies them with
// mma m16n8k16, in bf16 and f16. cp.async lands at the wait, not before. Emulated build only.
#define BOOST_TEST_MODULE emu_mma
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "nn/cuda/mma.cuh"
#include "nn/dtype.h"
#include "nn/rng.h"

using namespace ferry;
namespace mma = ferry::nn::cuda::detail;

namespace {

// A 16-bit element's bits for value v in the type (bf16 or f16), and back.
uint16_t bits_of(float v, bool bf16) {
  return bf16 ? nn::f32_to_bf16(v) : nn::f32_to_f16(v);
}
float value_of(uint16_t b, bool bf16) {
  return bf16 ? nn::bf16_to_f32(b) : nn::f16_to_f32(b);
}
uint16_t lo(uint32_t r) {
  return static_cast<uint16_t>(r & 0xFFFFu);
}
uint16_t hi(uint32_t r) {
  return static_cast<uint16_t>(r >> 16);
}

constexpr int kPitch = 24;  // elements per shared-memory row: 48 bytes, rows 16-byte aligned

// One warp: every lane's four registers after ldmatrix_x4 (or .trans) of the 16x16 tile in
// shared memory, lane l giving row l % 16 at column 8 (l / 16): the A-operand addressing.
std::vector<std::array<uint32_t, 4>> load_tile(const std::vector<uint16_t>& tile, bool trans) {
  std::vector<std::array<uint32_t, 4>> regs(32);
  ferry_emu::launch(dim3(1), dim3(32), 16 * kPitch * 2, [&] {
    auto* s = reinterpret_cast<uint16_t*>(ferry_emu::dynamic_shared());
    const int l = static_cast<int>(threadIdx.x);
    if (l == 0) std::memcpy(s, tile.data(), tile.size() * 2);
    __syncwarp();
    uint32_t r[4];
    if (trans) {
      mma::ldmatrix_x4_trans(r, s + (l % 16) * kPitch + (l / 16) * 8);
    } else {
      mma::ldmatrix_x4(r, s + (l % 16) * kPitch + (l / 16) * 8);
    }
    for (int j = 0; j < 4; ++j) regs[static_cast<size_t>(l)][static_cast<size_t>(j)] = r[j];
  });
  return regs;
}

}  // namespace

// ldmatrix .x4 gives lane i row i / 4, columns 2 (i % 4), +1 of each 8x8 matrix (the lanes
// 8j..8j+7 address matrix j's rows): with the A addressing, exactly the A fragment of the
// m16n8k16 table (a0,a1: row g, cols 2t, 2t+1; a2,a3: row g+8; a4..a7: cols + 8). .trans
// gives lane i column i / 4, rows 2 (i % 4), +1: the B fragment of the tile's transpose.
BOOST_AUTO_TEST_CASE(ldmatrix_gives_each_lane_the_isa_fragment) {
  std::vector<uint16_t> tile(16 * kPitch, 0);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) tile[static_cast<size_t>(r * kPitch + c)] = static_cast<uint16_t>(r * 16 + c);
  auto at = [](int r, int c) { return static_cast<uint16_t>(r * 16 + c); };
  const auto rows = load_tile(tile, false);
  const auto cols = load_tile(tile, true);
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    const auto& a = rows[static_cast<size_t>(l)];
    BOOST_TEST_CONTEXT("lane " << l) {
      for (int i = 0; i < 8; ++i) {  // a_i: register i / 2, half i % 2
        const int row = g + ((i / 2) % 2 == 1 ? 8 : 0), col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
        const uint32_t reg = a[static_cast<size_t>(i / 2)];
        BOOST_TEST((i % 2 == 0 ? lo(reg) : hi(reg)) == at(row, col));
      }
      // .trans, matrix j = rows 8 (j % 2).., columns 8 (j / 2)..: lane l holds its
      // column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1.
      for (int j = 0; j < 4; ++j) {
        const int r0 = 8 * (j % 2), c0 = 8 * (j / 2);
        const uint32_t reg = cols[static_cast<size_t>(l)][static_cast<size_t>(j)];
        BOOST_TEST(lo(reg) == at(r0 + 2 * t, c0 + g));
        BOOST_TEST(hi(reg) == at(r0 + 2 * t + 1, c0 + g));
      }
    }
  }
}

namespace {

// D = A B + C through shared memory, ldmatrix and one mma, as the attention kernels use
// them: A (16x16) by rows; B (16x8) either as its transpose by rows ([n][k], ldmatrix_x4,
// matrices n 0..7 x k 0..7 and k 8..15) or by rows of k ([k][n], ldmatrix_x4_trans,
// matrices k 0..7 and k 8..15). C and D in the accumulator layout. Returns D row-major.
std::vector<float> product(const std::vector<float>& A, const std::vector<float>& B, const std::vector<float>& C,
                           bool bf16, bool b_trans) {
  std::vector<uint16_t> a(16 * kPitch, 0), b(16 * kPitch, 0);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) a[static_cast<size_t>(r * kPitch + c)] = bits_of(A[static_cast<size_t>(r * 16 + c)], bf16);
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) {
      const size_t at = b_trans ? static_cast<size_t>(k * kPitch + n) : static_cast<size_t>(n * kPitch + k);
      b[at] = bits_of(B[static_cast<size_t>(k * 8 + n)], bf16);
    }
  std::vector<float> D(16 * 8, 0.0f);
  ferry_emu::launch(dim3(1), dim3(32), 2 * 16 * kPitch * 2, [&] {
    auto* s = reinterpret_cast<uint16_t*>(ferry_emu::dynamic_shared());
    uint16_t* sa = s;
    uint16_t* sb = s + 16 * kPitch;
    const int l = static_cast<int>(threadIdx.x), g = l / 4, t = l % 4;
    if (l == 0) {
      std::memcpy(sa, a.data(), a.size() * 2);
      std::memcpy(sb, b.data(), b.size() * 2);
    }
    __syncwarp();
    uint32_t fa[4], fb4[4];
    mma::ldmatrix_x4(fa, sa + (l % 16) * kPitch + (l / 16) * 8);
    if (b_trans) {
      // lanes 0-7: k rows 0-7; 8-15: k rows 8-15 (lanes 16-31 repeat them; r[2], r[3] unused).
      mma::ldmatrix_x4_trans(fb4, sb + (l % 16) * kPitch);
    } else {
      // lanes 0-7: n rows at k 0-7; 8-15: the same rows at k 8-15.
      mma::ldmatrix_x4(fb4, sb + (l % 8) * kPitch + ((l / 8) % 2) * 8);
    }
    const uint32_t fb[2] = {fb4[0], fb4[1]};
    float c[4], d[4];
    for (int i = 0; i < 4; ++i) c[i] = C[static_cast<size_t>((g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1))];
    if (bf16) {
      mma::mma_m16n8k16<__nv_bfloat16>(d, fa, fb, c);
    } else {
      mma::mma_m16n8k16<__half>(d, fa, fb, c);
    }
    for (int i = 0; i < 4; ++i) D[static_cast<size_t>((g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1))] = d[i];
  });
  return D;
}

}  // namespace

// Small integers: every product and sum exact, so D must equal the plain product exactly;
// random normals rounded to the type: within f32 summation error of the f64 product.
BOOST_AUTO_TEST_CASE(ldmatrix_and_mma_compute_the_plain_product) {
  nn::Rng rng(3);
  for (const bool bf16 : {true, false}) {
    for (const bool b_trans : {false, true}) {
      for (const bool integers : {true, false}) {
        BOOST_TEST_CONTEXT((bf16 ? "bf16" : "f16") << (b_trans ? " .trans" : " rows") << (integers ? " integers" : " normals")) {
          std::vector<float> A(256), B(128), C(128);
          auto draw = [&] {
            const double v = integers ? std::floor(rng.normal() * 3.0) : rng.normal();
            return value_of(bits_of(static_cast<float>(v), bf16), bf16);
          };
          for (float& x : A) x = draw();
          for (float& x : B) x = draw();
          for (float& x : C) x = integers ? std::floor(static_cast<float>(rng.normal()) * 10) : static_cast<float>(rng.normal());
          const std::vector<float> D = product(A, B, C, bf16, b_trans);
          for (int m = 0; m < 16; ++m)
            for (int n = 0; n < 8; ++n) {
              double want = C[static_cast<size_t>(m * 8 + n)], mag = std::abs(want);
              for (int k = 0; k < 16; ++k) {
                const double p = double{A[static_cast<size_t>(m * 16 + k)]} * B[static_cast<size_t>(k * 8 + n)];
                want += p;
                mag += std::abs(p);
              }
              const double got = D[static_cast<size_t>(m * 8 + n)];
              if (integers) {
                BOOST_TEST(got == want, "D[" << m << "][" << n << "]");
              } else {
                BOOST_TEST(std::abs(got - want) <= 17 * std::ldexp(mag, -24), "D[" << m << "][" << n << "]");
              }
            }
        }
      }
    }
  }
}

// cp.async: the destination holds NaN bytes until the issuing thread's wait retires the
// group (a read before it sees them), the data after; an invalid source lands zeros.
BOOST_AUTO_TEST_CASE(cp_async_lands_at_the_wait) {
  alignas(16) float src[4] = {1, 2, 3, 4};
  float before[4] = {}, after[4] = {}, zeros[4] = {};
  ferry_emu::launch(dim3(1), dim3(32), 64, [&] {
    auto* s = reinterpret_cast<float*>(ferry_emu::dynamic_shared());
    if (threadIdx.x == 0) {
      mma::cp_async_16(s, src, true);
      mma::cp_async_commit();
      mma::cp_async_16(s + 4, src, false);
      mma::cp_async_commit();
      std::memcpy(before, s, 16);
      mma::cp_async_wait<1>();  // the first group only
      std::memcpy(after, s, 16);
      BOOST_TEST(std::isnan(s[4]));
      mma::cp_async_wait<0>();
      std::memcpy(zeros, s + 4, 16);
    }
  });
  for (int i = 0; i < 4; ++i) {
    BOOST_TEST(std::isnan(before[i]));
    BOOST_TEST(after[i] == src[i]);
    BOOST_TEST(zeros[i] == 0.0f);
  }
}
