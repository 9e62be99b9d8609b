// The CPU device's GEMM kernels (nn/cpu_gemm.h: f32 on AVX-512, bf16 on AVX512-BF16):
// - bit for bit the scalar references of their stated arithmetic, for every transpose, odd
//   and even K, edge tiles in M and N, row strides wider than the matrix, alpha/beta, f32
//   and bf16 outputs, subnormal inputs (read as zero);
// - within fp32 summation error of an f64 product;
// - a row's result does not depend on M, N or the thread count (a rank's rows give the
//   same bits whatever the batch around them);
// - CpuDevice::gemm and gemm_cols take them: bf16 operands into bf16 or f32 outputs, f32
//   products of at least 64 x 64.
// On a CPU without the instructions the kernels' cases are skipped and said so.
#define BOOST_TEST_MODULE cpu_gemm
#include <boost/test/unit_test.hpp>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "nn/cpu_gemm.h"
#include "nn/cpu_device.h"
#include "nn/dtype.h"
#include "nn/rng.h"

using namespace ferry;
using nn::cpu::bf16_gemm_available;
using nn::cpu::f32_gemm_available;
using nn::cpu::gemm_bf16;
using nn::cpu::gemm_bf16_reference;
using nn::cpu::gemm_f32;
using nn::cpu::gemm_f32_reference;

namespace {

std::vector<uint16_t> random_bf16(int64_t n, uint64_t seed, float scale = 1.0f) {
  nn::Rng rng(seed);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = nn::f32_to_bf16(scale * static_cast<float>(rng.normal()));
  return v;
}

struct Case {
  int64_t M, N, K;
  bool ta, tb;
  int64_t pad;  // extra columns in every row stride
  float alpha, beta;
  bool c_bf16;
};

// Runs one case through the kernel and the reference; returns the number of differing bits' elements.
int64_t mismatches(const Case& k, uint64_t seed) {
  const int64_t lda = (k.ta ? k.M : k.K) + k.pad, ldb = (k.tb ? k.K : k.N) + k.pad, ldc = k.N + k.pad;
  const std::vector<uint16_t> a = random_bf16((k.ta ? k.K : k.M) * lda, seed);
  const std::vector<uint16_t> b = random_bf16((k.tb ? k.N : k.K) * ldb, seed + 1);
  const std::vector<uint16_t> c0 = random_bf16(k.M * ldc, seed + 2);
  std::vector<float> cf(c0.size());
  for (size_t i = 0; i < c0.size(); ++i) cf[i] = nn::bf16_to_f32(c0[i]);
  int64_t bad = 0;
  if (k.c_bf16) {
    std::vector<uint16_t> got = c0, want = c0;
    gemm_bf16(got.data(), true, ldc, a.data(), lda, k.ta, b.data(), ldb, k.tb, k.M, k.N, k.K, k.alpha, k.beta);
    gemm_bf16_reference(want.data(), true, ldc, a.data(), lda, k.ta, b.data(), ldb, k.tb, k.M, k.N, k.K, k.alpha,
                        k.beta);
    for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
  } else {
    std::vector<float> got = cf, want = cf;
    gemm_bf16(got.data(), false, ldc, a.data(), lda, k.ta, b.data(), ldb, k.tb, k.M, k.N, k.K, k.alpha, k.beta);
    gemm_bf16_reference(want.data(), false, ldc, a.data(), lda, k.ta, b.data(), ldb, k.tb, k.M, k.N, k.K, k.alpha,
                        k.beta);
    for (size_t i = 0; i < got.size(); ++i) bad += std::memcmp(&got[i], &want[i], 4) != 0;
  }
  return bad;
}

// The f32 kernel on the same case (c_bf16 ignored), against its reference.
int64_t mismatches_f32(const Case& k, uint64_t seed) {
  const int64_t lda = (k.ta ? k.M : k.K) + k.pad, ldb = (k.tb ? k.K : k.N) + k.pad, ldc = k.N + k.pad;
  auto values = [](int64_t n, uint64_t s) {
    nn::Rng rng(s);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<float>(rng.normal());
    return v;
  };
  const std::vector<float> a = values((k.ta ? k.K : k.M) * lda, seed), b = values((k.tb ? k.N : k.K) * ldb, seed + 1);
  std::vector<float> got = values(k.M * ldc, seed + 2), want = got;
  gemm_f32(got.data(), ldc, a.data(), lda, k.ta, b.data(), ldb, k.tb, k.M, k.N, k.K, k.alpha, k.beta);
  gemm_f32_reference(want.data(), ldc, a.data(), lda, k.ta, b.data(), ldb, k.tb, k.M, k.N, k.K, k.alpha, k.beta);
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += std::memcmp(&got[i], &want[i], 4) != 0;
  return bad;
}

#define REQUIRE_F32_KERNEL()                                                         \
  if (!f32_gemm_available()) {                                                       \
    BOOST_TEST_MESSAGE("skipped: this build or CPU has no AVX-512 kernel");          \
    return;                                                                          \
  }

#define REQUIRE_KERNEL()                                                             \
  if (!bf16_gemm_available()) {                                                      \
    BOOST_TEST_MESSAGE("skipped: this build or CPU has no AVX512-BF16 kernel");      \
    return;                                                                          \
  }

}  // namespace

BOOST_AUTO_TEST_CASE(kernel_equals_reference_bit_for_bit) {
  REQUIRE_KERNEL();
  uint64_t seed = 11;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (bool c_bf16 : {false, true}) {
        // edge tiles (M not a multiple of 8, N not of 32 or 256), odd K, K = 1, padded strides
        for (const Case& shape : {Case{37, 70, 65, ta, tb, 0, 1, 0, c_bf16}, Case{8, 32, 2, ta, tb, 3, 1, 0, c_bf16},
                                  Case{1, 300, 1, ta, tb, 5, 1, 1, c_bf16},
                                  Case{19, 17, 128, ta, tb, 0, 0.5f, 1, c_bf16},
                                  Case{64, 513, 33, ta, tb, 2, 2.0f, -0.75f, c_bf16}}) {
          BOOST_TEST_CONTEXT("M " << shape.M << " N " << shape.N << " K " << shape.K << " ta " << ta << " tb " << tb
                                  << " bf16 out " << c_bf16 << " alpha " << shape.alpha << " beta " << shape.beta) {
            BOOST_TEST(mismatches(shape, seed++) == 0);
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(f32_kernel_equals_reference_bit_for_bit) {
  REQUIRE_F32_KERNEL();
  uint64_t seed = 101;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      // and the thin products' paths: A read in place (N <= 64, full tiles; the edge tile
      // packed), panels of at most 16 columns (one vector), B read in place (at most four
      // tiles, whole panels, B not transposed)
      for (const Case& shape : {Case{37, 70, 65, ta, tb, 0, 1, 0, false}, Case{8, 32, 1, ta, tb, 3, 1, 0, false},
                                Case{1, 300, 7, ta, tb, 5, 1, 1, false}, Case{19, 17, 128, ta, tb, 0, 0.5f, 1, false},
                                Case{64, 513, 33, ta, tb, 2, 2.0f, -0.75f, false},
                                Case{37, 16, 65, ta, tb, 1, 1, 0, false}, Case{13, 5, 30, ta, tb, 0, 1, 1, false},
                                Case{32, 64, 40, ta, tb, 3, 1, 0, false}, Case{16, 96, 513, ta, tb, 0, 0.5f, -1, false}}) {
        BOOST_TEST_CONTEXT("f32 M " << shape.M << " N " << shape.N << " K " << shape.K << " ta " << ta << " tb " << tb
                                    << " alpha " << shape.alpha << " beta " << shape.beta) {
          BOOST_TEST(mismatches_f32(shape, seed++) == 0);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(subnormal_inputs_read_as_zero) {
  REQUIRE_KERNEL();
  // a = [tiny subnormal, 1], b = [huge, 1]: read as zero, the subnormal's product (which in
  // fp32 would be a normal number) does not count.
  const uint16_t sub = 0x0001, one = nn::f32_to_bf16(1.0f), big = nn::f32_to_bf16(1e30f);
  const std::vector<uint16_t> a{sub, one}, b{big, one};
  float got = -1, want = -1;
  gemm_bf16(&got, false, 1, a.data(), 2, false, b.data(), 1, false, 1, 1, 2, 1, 0);
  gemm_bf16_reference(&want, false, 1, a.data(), 2, false, b.data(), 1, false, 1, 1, 2, 1, 0);
  BOOST_TEST(want == 1.0f);
  BOOST_TEST(got == want);
}

BOOST_AUTO_TEST_CASE(close_to_f64) {
  REQUIRE_KERNEL();
  const int64_t M = 45, N = 77, K = 301;
  const std::vector<uint16_t> a = random_bf16(M * K, 3), b = random_bf16(N * K, 4);
  std::vector<float> c(static_cast<size_t>(M * N));
  gemm_bf16(c.data(), false, N, a.data(), K, false, b.data(), K, true, M, N, K, 1, 0);
  double worst = 0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(nn::bf16_to_f32(a[m * K + k])) * nn::bf16_to_f32(b[n * K + k]);
        s += p;
        mag += std::abs(p);
      }
      worst = std::max(worst, std::abs(c[m * N + n] - s) / mag);
    }
  }
  BOOST_TEST(worst < 1e-5);  // K fp32 roundings of partial sums, each at most 2^-24 of the magnitude
}

BOOST_AUTO_TEST_CASE(rows_independent_of_batch_and_threads) {
  REQUIRE_KERNEL();
  const int64_t M = 50, N = 300, K = 96;
  const std::vector<uint16_t> a = random_bf16(M * K, 5), b = random_bf16(N * K, 6);
  std::vector<float> whole(static_cast<size_t>(M * N));
  gemm_bf16(whole.data(), false, N, a.data(), K, false, b.data(), K, true, M, N, K, 1, 0);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  // rows 13..15 alone, and columns 40..299 alone, on one thread
  std::vector<float> rows(static_cast<size_t>(3 * N)), cols(static_cast<size_t>(M * 260));
  gemm_bf16(rows.data(), false, N, a.data() + 13 * K, K, false, b.data(), K, true, 3, N, K, 1, 0);
  gemm_bf16(cols.data(), false, 260, a.data(), K, false, b.data() + 40 * K, K, true, M, 260, K, 1, 0);
  omp_set_num_threads(threads);
  BOOST_TEST(std::memcmp(rows.data(), whole.data() + 13 * N, rows.size() * 4) == 0);
  int64_t bad = 0;
  for (int64_t m = 0; m < M; ++m) bad += std::memcmp(&cols[m * 260], &whole[m * N + 40], 260 * 4) != 0;
  BOOST_TEST(bad == 0);
}

BOOST_AUTO_TEST_CASE(device_gemm_takes_it_for_bf16) {
  REQUIRE_KERNEL();
  nn::CpuDevice dev(64 << 20);
  const int64_t M = 21, N = 40, K = 35;
  const std::vector<uint16_t> a = random_bf16(M * K, 7), b = random_bf16(N * K, 8);
  nn::Tensor ta = nn::Tensor::empty(dev, nn::DType::bf16, {M, K}), tb = nn::Tensor::empty(dev, nn::DType::bf16, {N, K});
  std::memcpy(ta.data(), a.data(), a.size() * 2);
  std::memcpy(tb.data(), b.data(), b.size() * 2);
  // gemm into bf16 and into f32 (a weight gradient's dtype), and gemm_cols on a window
  nn::Tensor c16 = nn::Tensor::empty(dev, nn::DType::bf16, {M, N}), c32 = nn::Tensor::empty(dev, nn::DType::f32, {M, N});
  dev.gemm(c16, ta, false, tb, true, 1, 0);
  dev.gemm(c32, ta, false, tb, true, 1, 0);
  std::vector<uint16_t> want16(static_cast<size_t>(M * N));
  std::vector<float> want32(static_cast<size_t>(M * N));
  gemm_bf16_reference(want16.data(), true, N, a.data(), K, false, b.data(), K, true, M, N, K, 1, 0);
  gemm_bf16_reference(want32.data(), false, N, a.data(), K, false, b.data(), K, true, M, N, K, 1, 0);
  BOOST_TEST(std::memcmp(c16.data(), want16.data(), want16.size() * 2) == 0);
  BOOST_TEST(std::memcmp(c32.data(), want32.data(), want32.size() * 4) == 0);
  // columns [10, 30) of c32 from columns [5, 20) of a, added (beta 1)
  nn::Tensor bw = nn::Tensor::empty(dev, nn::DType::bf16, {20, 15});
  const std::vector<uint16_t> bwv = random_bf16(20 * 15, 9);
  std::memcpy(bw.data(), bwv.data(), bwv.size() * 2);
  std::vector<float> before(static_cast<float*>(c32.data()), static_cast<float*>(c32.data()) + M * N);
  dev.gemm_cols(c32, 10, 20, ta, 5, 15, false, bw, true, 1, 1);
  std::vector<float> want = before;
  gemm_bf16_reference(want.data() + 10, false, N, a.data() + 5, K, false, bwv.data(), 15, true, M, 20, 15, 1, 1);
  BOOST_TEST(std::memcmp(c32.data(), want.data(), want.size() * 4) == 0);
}

BOOST_AUTO_TEST_CASE(device_gemm_takes_the_f32_kernel_from_8_by_16) {
  REQUIRE_F32_KERNEL();
  nn::CpuDevice dev(64 << 20);
  for (const int64_t N : {64, 16, 8}) {  // 16 columns (a rank-16 adapter's) too; 8 stay with Eigen
    const int64_t M = 70, K = 33;
    nn::Rng rng(12);
    nn::Tensor a = nn::Tensor::empty(dev, nn::DType::f32, {K, M}), b = nn::Tensor::empty(dev, nn::DType::f32, {K, N});
    for (int64_t i = 0; i < a.numel(); ++i) a.data_as<float>()[i] = static_cast<float>(rng.normal());
    for (int64_t i = 0; i < b.numel(); ++i) b.data_as<float>()[i] = static_cast<float>(rng.normal());
    nn::Tensor c = nn::Tensor::empty(dev, nn::DType::f32, {M, N});
    dev.gemm(c, a, true, b, false, 1, 0);
    std::vector<float> want(static_cast<size_t>(M * N));
    gemm_f32_reference(want.data(), N, a.data_as<float>(), M, true, b.data_as<float>(), N, false, M, N, K, 1, 0);
    double worst = 0;
    bool same = true;
    for (int64_t i = 0; i < M * N; ++i) {
      same = same && c.data_as<float>()[i] == want[static_cast<size_t>(i)];
      worst = std::max(worst, std::abs(double(c.data_as<float>()[i]) - want[static_cast<size_t>(i)]));
    }
    BOOST_TEST(worst < 1e-4);
    if (N >= 16) BOOST_TEST(same);  // the kernel's bits
  }
}

// The NF4 operand (gemm_bf16_nf4, QLoRA's base dequantized as it is packed): equal bit for
// bit to gemm_bf16 on the dequantized matrix rounded to bf16, for W^T (the forward) and W
// (dx), pieces of a packed projection, odd inner dimensions, rows and columns that start
// inside quantization blocks, and (the large case) more than one packed block of columns.
BOOST_AUTO_TEST_CASE(nf4_operand_equals_the_dequantized_matrix_bit_for_bit) {
  REQUIRE_KERNEL();
  struct Shape {
    int64_t M, R, in;
    std::vector<int64_t> pieces;
  };
  for (const Shape& s : {Shape{5, 45, 67, {20, 25}}, Shape{9, 96, 128, {64, 16, 16}}, Shape{3, 600, 8200, {600}},
                         Shape{3, 8200, 600, {8000, 200}}}) {
    std::vector<std::vector<uint8_t>> blobs;
    std::vector<nn::cpu::Nf4Operand> w;
    std::vector<uint16_t> dense;
    int64_t row = 0;
    for (const int64_t rows : s.pieces) {
      nn::Rng rng(static_cast<uint64_t>(rows * 7 + s.in));
      std::vector<float> v(static_cast<size_t>(rows * s.in));
      for (auto& x : v) x = static_cast<float>(0.05 * rng.normal());
      const nn::Nf4Tensor q = nn::nf4_quantize(v.data(), rows * s.in, true, nullptr, nullptr);
      const nn::Nf4Layout l = nn::nf4_layout(rows, s.in, true);
      blobs.emplace_back(static_cast<size_t>(l.bytes));
      nn::nf4_write_blob(q, l, blobs.back().data());
      std::vector<float> deq(v.size());
      nn::nf4_dequantize_rect(blobs.back().data(), l, 0, rows, 0, s.in, deq.data());
      for (float x : deq) dense.push_back(nn::f32_to_bf16(x));
      w.push_back({blobs.back().data(), l, row});
      row += rows;
    }
    for (const bool w_trans : {true, false}) {
      if (s.R * s.in > 1000000 && w_trans != (s.R < s.in)) continue;  // each large shape once: several column blocks
      const int64_t K = w_trans ? s.in : s.R, N = w_trans ? s.R : s.in;
      BOOST_TEST_CONTEXT("M " << s.M << " W [" << s.R << ", " << s.in << "] " << (w_trans ? "W^T" : "W")) {
        const std::vector<uint16_t> a = random_bf16(s.M * K, 21);
        for (const bool c_bf16 : {false, true}) {
          const std::vector<uint16_t> c0 = random_bf16(s.M * N, 22);
          std::vector<float> f0(c0.size());
          for (size_t i = 0; i < c0.size(); ++i) f0[i] = nn::bf16_to_f32(c0[i]);
          std::vector<uint16_t> g16 = c0, w16 = c0;
          std::vector<float> g32 = f0, w32 = f0;
          void* got = c_bf16 ? static_cast<void*>(g16.data()) : static_cast<void*>(g32.data());
          void* want = c_bf16 ? static_cast<void*>(w16.data()) : static_cast<void*>(w32.data());
          nn::cpu::gemm_bf16_nf4(got, c_bf16, N, a.data(), K, w, w_trans, s.M, N, K, 1, 1);
          gemm_bf16(want, c_bf16, N, a.data(), K, false, dense.data(), s.in, w_trans, s.M, N, K, 1, 1);
          BOOST_TEST((c_bf16 ? g16 == w16 : std::memcmp(g32.data(), w32.data(), g32.size() * 4) == 0));
        }
      }
    }
    // Pieces with a gap are refused.
    if (w.size() > 1) {
      std::vector<nn::cpu::Nf4Operand> gap = {w.back()};
      float c = 0;
      BOOST_CHECK_THROW(
          nn::cpu::gemm_bf16_nf4(&c, false, 1, dense.data(), s.in, gap, true, 1, s.R, s.in, 1, 0), std::invalid_argument);
    }
  }
}
