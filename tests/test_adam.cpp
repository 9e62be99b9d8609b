// CPU AdamW against a hand-computed step and a scalar double-precision reference of
// torch.optim.AdamW's update.
#define BOOST_TEST_MODULE adam
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <vector>

#include "nn/dtype.h"
#include "nn/rng.h"
#include "offload/cpu_adam.h"

using namespace ferry;

BOOST_AUTO_TEST_CASE(first_step_by_hand) {
  // lr 0.1, betas (0.9, 0.999), eps 1e-8, wd 0.01, p = 1, g = 0.5:
  // m = 0.05, v = 0.00025; bias-corrected m = 0.5, v = 0.25, sqrt = 0.5;
  // p = 1 * (1 - 0.1 * 0.01) - 0.1 * 0.5 / (0.5 + 1e-8) = 0.999 - 0.1 = 0.899 (to 1e-8).
  offload::CpuAdam adam({0.1, 0.9, 0.999, 1e-8, 0.01});
  float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
  adam.update(&p, &g, &m, &v, 1, 1, 0.1, 0.01, 1.0);
  BOOST_TEST(m == 0.05f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(v == 0.00025f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(p == 0.899f, boost::test_tools::tolerance(1e-6f));
}

BOOST_AUTO_TEST_CASE(matches_a_double_reference_over_steps_and_tiles) {
  // More than one tile (16K elements) with a ragged end, so the threaded split is covered.
  const int64_t n = 40000;
  const offload::AdamWParams hp{2e-3, 0.9, 0.95, 1e-8, 0.1};
  offload::CpuAdam adam(hp);
  std::vector<float> p(n), m(n, 0), v(n, 0), g(n);
  std::vector<double> rp(n), rm(n, 0), rv(n, 0);
  nn::Rng rng(11);
  for (int64_t i = 0; i < n; ++i) rp[i] = p[i] = static_cast<float>(rng.normal());
  const double scale = 0.25;  // as for gradients summed over 4 micro-batches
  for (int64_t step = 1; step <= 5; ++step) {
    const double lr = hp.lr * step / 5.0;
    for (int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(rng.normal());
    adam.update(p.data(), g.data(), m.data(), v.data(), n, step, lr, hp.weight_decay, scale);
    const double bc1 = 1 - std::pow(hp.beta1, step), bc2 = 1 - std::pow(hp.beta2, step);
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g[i] * scale;
      rm[i] = hp.beta1 * rm[i] + (1 - hp.beta1) * gi;
      rv[i] = hp.beta2 * rv[i] + (1 - hp.beta2) * gi * gi;
      rp[i] = rp[i] * (1 - lr * hp.weight_decay) - (lr / bc1) * rm[i] / (std::sqrt(rv[i]) / std::sqrt(bc2) + hp.eps);
    }
  }
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(p[i] - rp[i]));
  // Each step moves p by at most ~lr; f32 rounding of the update and of p (|p| ~ 3) stays
  // below 1e-6 after five steps.
  BOOST_TEST(worst < 2e-6);
}

BOOST_AUTO_TEST_CASE(rejects_step_zero) {
  offload::CpuAdam adam({});
  float p = 0, g = 0, m = 0, v = 0;
  BOOST_CHECK_THROW(adam.update(&p, &g, &m, &v, 1, 0, 1e-3, 0, 1), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(fused_bf16_and_f16_copies_are_the_rounded_update) {
  const int64_t n = 20000;  // more than one tile
  offload::CpuAdam adam({1e-2, 0.9, 0.999, 1e-8, 0.0});
  for (const nn::DType low : {nn::DType::bf16, nn::DType::f16}) {
    std::vector<float> p(n), g(n), m(n, 0), v(n, 0), p2, m2(n, 0), v2(n, 0);
    nn::Rng rng(4);
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(rng.normal()), g[i] = static_cast<float>(rng.normal());
    p[7] = 1e5f;  // past f16's range: infinity, as the device's cast gives
    p2 = p;
    std::vector<uint16_t> out(n, 0);
    adam.update(p.data(), g.data(), m.data(), v.data(), n, 1, 1e-2, 0.0, 1.0, out.data(), low);
    adam.update(p2.data(), g.data(), m2.data(), v2.data(), n, 1, 1e-2, 0.0, 1.0);
    for (int64_t i = 0; i < n; ++i) {
      BOOST_TEST(p[i] == p2[i]);  // the fp32 update is unchanged, and its copy is exact RNE
      BOOST_TEST(out[i] == (low == nn::DType::bf16 ? nn::f32_to_bf16(p[i]) : nn::f32_to_f16(p[i])));
    }
  }
  std::vector<float> x(4, 1.0f);
  std::vector<uint16_t> out(4);
  BOOST_CHECK_THROW(adam.update(x.data(), x.data(), x.data(), x.data(), 4, 1, 1e-2, 0.0, 1.0, out.data(), nn::DType::f32),
                    std::invalid_argument);
}
