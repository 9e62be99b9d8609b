// The fused output layer and cross-entropy (DeviceOps::linear_cross_entropy_forward and
// _backward, nn/linear_cross_entropy.h) on the CPU device against an f64 reference of the
// unfused formula: logits = x w^T, loss = logsumexp(logits) - logits[target], and its
// gradient through the linear layer. Inputs are rounded to the dtype under test first and
// the reference computes from the rounded values, so the errors measure the op.
// Shapes make several chunks with a shorter last one; targets include ignored rows; dx and
// dw start from random values (the ops add); and the head's peak memory at N = 4096,
// V = 32,000 stays within the chunk budget, not N x V.
#define BOOST_TEST_MODULE linear_cross_entropy
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <vector>

#include "nn/cpu_device.h"
#include "nn/linear_cross_entropy.h"
#include "nn/rng.h"
#include "test_util.h"

using namespace ferry;
using nn::DType;
using nn::Tensor;

namespace {

std::vector<double> values(nn::Device& dev, const Tensor& t) {
  const Tensor wide = Tensor::empty(dev, DType::f64, t.shape());
  dev.cast(wide, t);
  return {wide.data_as<double>(), wide.data_as<double>() + wide.numel()};
}

struct Reference {
  std::vector<double> losses, dx, dw;  // dx, dw: the gradient alone (what the op adds)
};

// The unfused formula in f64, row by row.
Reference reference(const std::vector<double>& x, const std::vector<double>& w, const std::vector<int32_t>& targets,
                    int64_t N, int64_t C, int64_t V, double dloss) {
  Reference r;
  r.losses.assign(static_cast<size_t>(N), 0.0);
  r.dx.assign(static_cast<size_t>(N * C), 0.0);
  r.dw.assign(static_cast<size_t>(V * C), 0.0);
  std::vector<double> s(static_cast<size_t>(V));
  for (int64_t n = 0; n < N; ++n) {
    const int32_t t = targets[static_cast<size_t>(n)];
    if (t == nn::kIgnoreTarget) continue;
    double mx = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      double acc = 0;
      for (int64_t c = 0; c < C; ++c) acc += x[static_cast<size_t>(n * C + c)] * w[static_cast<size_t>(v * C + c)];
      s[static_cast<size_t>(v)] = acc;
      mx = std::max(mx, acc);
    }
    double z = 0;
    for (double sv : s) z += std::exp(sv - mx);
    const double lse = mx + std::log(z);
    r.losses[static_cast<size_t>(n)] = lse - s[static_cast<size_t>(t)];
    for (int64_t v = 0; v < V; ++v) {
      const double g = dloss * (std::exp(s[static_cast<size_t>(v)] - lse) - (v == t ? 1.0 : 0.0));
      for (int64_t c = 0; c < C; ++c) {
        r.dx[static_cast<size_t>(n * C + c)] += g * w[static_cast<size_t>(v * C + c)];
        r.dw[static_cast<size_t>(v * C + c)] += g * x[static_cast<size_t>(n * C + c)];
      }
    }
  }
  return r;
}

// ||got - (start + want)|| / ||want||: an op that overwrote instead of adding is off by
// about ||start|| / ||want||, here near 1.
double error(const std::vector<double>& got, const std::vector<double>& start, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = got[i] - ((start.empty() ? 0.0 : start[i]) + want[i]);
    diff += e * e;
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

// The tests below cut rows into chunks at a 64 MiB budget (1 GiB by default), so that
// shapes quick on a CPU still make several chunks.
struct Budget64MiB {
  Budget64MiB() { nn::set_linear_cross_entropy_scratch_bytes(size_t{64} << 20); }
  ~Budget64MiB() { nn::set_linear_cross_entropy_scratch_bytes(0); }
  Budget64MiB(const Budget64MiB&) = delete;
  Budget64MiB& operator=(const Budget64MiB&) = delete;
};

struct Case {
  const char* name;
  DType compute, grad;  // x, w (and dx) in `compute`; dw in `grad`
  double tol;
};

}  // namespace

// Several chunks with a shorter last one: V = 40,000 makes chunks of 208 rows in f32 (8
// bytes of scratch per score) and 272 in bf16 (6) at 64 MiB; N = 300 is a multiple of neither.
BOOST_AUTO_TEST_CASE(forward_and_backward_match_the_unfused_formula_in_f64) {
  const Budget64MiB budget;
  nn::CpuDevice dev(size_t{1} << 30, 2);
  const int64_t N = 300, C = 8, V = 40000;
  const double dloss = 0.75;
  for (const Case& k : {Case{"f32", DType::f32, DType::f32, 1e-5}, Case{"bf16", DType::bf16, DType::bf16, 1e-2},
                        Case{"bf16, f32 dw", DType::bf16, DType::f32, 1e-2}}) {
    BOOST_TEST_CONTEXT(k.name) {
      const DType stat = is_low_precision(k.compute) ? DType::f32 : k.compute;
      const int64_t rows = nn::linear_cross_entropy_chunk_rows(
          N, V, nn::dtype_size(k.compute) + nn::dtype_size(stat));
      BOOST_TEST_REQUIRE(rows < N);
      BOOST_TEST_REQUIRE(N % rows != 0);
      const Tensor x = test::random_tensor(dev, k.compute, {N, C}, 1, 0.5);
      const Tensor w = test::random_tensor(dev, k.compute, {V, C}, 2, 0.5);
      const Tensor targets = Tensor::empty(dev, DType::i32, {N});
      nn::Rng rng(3);
      std::vector<int32_t> t(static_cast<size_t>(N));
      for (int64_t n = 0; n < N; ++n) {
        // Every seventh row ignored (a prompt or padding position), the first one too.
        t[static_cast<size_t>(n)] = n % 7 == 0 ? nn::kIgnoreTarget : static_cast<int32_t>(rng.below(V));
      }
      std::copy(t.begin(), t.end(), targets.data_as<int32_t>());
      const Reference want = reference(values(dev, x), values(dev, w), t, N, C, V, dloss);

      const Tensor losses = Tensor::empty(dev, stat, {N});
      dev.linear_cross_entropy_forward(losses, x, w, targets);
      const std::vector<double> got = values(dev, losses);
      double worst = 0;
      for (int64_t n = 0; n < N; ++n) {
        const double d = std::abs(got[static_cast<size_t>(n)] - want.losses[static_cast<size_t>(n)]);
        worst = std::max(worst, d / (1.0 + want.losses[static_cast<size_t>(n)]));
        if (t[static_cast<size_t>(n)] == nn::kIgnoreTarget) BOOST_TEST(got[static_cast<size_t>(n)] == 0.0);
      }
      BOOST_TEST_MESSAGE(k.name << ": worst loss error " << worst);
      BOOST_TEST(worst <= k.tol);

      const Tensor dx = test::random_tensor(dev, k.compute, {N, C}, 4, 0.05);
      const Tensor dw = test::random_tensor(dev, k.grad, {V, C}, 5, 0.05);
      const std::vector<double> dx0 = values(dev, dx), dw0 = values(dev, dw);
      dev.linear_cross_entropy_backward(dx, dw, x, w, targets, dloss);
      const double edx = error(values(dev, dx), dx0, want.dx), edw = error(values(dev, dw), dw0, want.dw);
      BOOST_TEST_MESSAGE(k.name << ": dx error " << edx << ", dw error " << edw);
      BOOST_TEST(edx <= k.tol);
      BOOST_TEST(edw <= k.tol);
      // Ignored rows get no gradient: their dx rows are left as they were.
      const std::vector<double> dx1 = values(dev, dx);
      for (int64_t c = 0; c < C; ++c) BOOST_TEST(dx1[static_cast<size_t>(7 * C + c)] == dx0[static_cast<size_t>(7 * C + c)]);
    }
  }
}

// The head's memory does not grow with N x V: at N = 4096 and V = 32,000 (f32), the
// unfused path holds 500 MiB of logits and as much of probabilities and of their gradient;
// the fused ops' peak above x, w, dx, dw and the losses is the chunk's scratch (at 64 MiB;
// at the default 1 GiB this shape would be one chunk).
BOOST_AUTO_TEST_CASE(peak_memory_is_the_chunk_budget_not_tokens_times_vocabulary) {
  const Budget64MiB budget;
  nn::CpuDevice dev(size_t{2} << 30, 2);
  const int64_t N = 4096, C = 32, V = 32000;
  const Tensor x = test::random_tensor(dev, DType::f32, {N, C}, 1, 0.5);
  const Tensor w = test::random_tensor(dev, DType::f32, {V, C}, 2, 0.5);
  const Tensor targets = Tensor::empty(dev, DType::i32, {N});
  for (int64_t n = 0; n < N; ++n) targets.data_as<int32_t>()[n] = static_cast<int32_t>((n * 7919) % V);
  const Tensor losses = Tensor::empty(dev, DType::f32, {N});
  const Tensor dx = test::zeros(dev, DType::f32, {N, C}), dw = test::zeros(dev, DType::f32, {V, C});
  const size_t held = dev.memory().in_use;
  dev.reset_peak();
  dev.linear_cross_entropy_forward(losses, x, w, targets);
  const size_t forward_peak = dev.memory().peak - held;
  dev.reset_peak();
  dev.linear_cross_entropy_backward(dx, dw, x, w, targets, 1.0 / static_cast<double>(N));
  const size_t backward_peak = dev.memory().peak - held;
  BOOST_TEST(dev.memory().in_use == held);  // the scratch is freed per call
  const size_t unfused = static_cast<size_t>(N * V) * 4;
  BOOST_TEST_MESSAGE("above x, w, dx, dw, losses: forward " << nn::format_bytes(forward_peak) << ", backward "
                                                          << nn::format_bytes(backward_peak) << "; one f32 [N, V] "
                                                          << nn::format_bytes(unfused));
  // The chunk's losses (backward) and the arena's alignment beside the budget.
  const size_t slack = 64 * 1024;
  BOOST_TEST(forward_peak <= nn::linear_cross_entropy_scratch_bytes() + slack);
  BOOST_TEST(backward_peak <= nn::linear_cross_entropy_scratch_bytes() + slack);
  BOOST_TEST(backward_peak * 4 < unfused);
  // And the values are still the loss: each row's against a direct f64 sum on 3 rows.
  for (int64_t n : {int64_t{0}, int64_t{2047}, N - 1}) {
    const float* xr = x.data_as<float>() + n * C;
    double mx = -INFINITY;
    std::vector<double> s(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) {
      double acc = 0;
      for (int64_t c = 0; c < C; ++c) acc += static_cast<double>(xr[c]) * w.data_as<float>()[v * C + c];
      s[static_cast<size_t>(v)] = acc;
      mx = std::max(mx, acc);
    }
    double z = 0;
    for (double sv : s) z += std::exp(sv - mx);
    const double want = mx + std::log(z) - s[static_cast<size_t>(targets.data_as<int32_t>()[n])];
    BOOST_TEST(losses.data_as<float>()[n] == want, boost::test_tools::tolerance(1e-5));
  }
}

BOOST_AUTO_TEST_CASE(chunk_rows_fill_the_budget_and_stay_within_n) {
  // 1 GiB of bf16 scores and f32 probabilities at Llama 3's vocabulary: 1392 rows (1395.1
  // less 8's remainder), 6 chunks of 8192 tokens.
  BOOST_TEST(nn::linear_cross_entropy_chunk_rows(8192, 128256, 6) == 1392);
  BOOST_TEST(nn::linear_cross_entropy_chunk_rows(8192, 128256, 2) == 4184);  // bf16 scores alone
  BOOST_TEST(nn::linear_cross_entropy_chunk_rows(10, 256, 8) == 10);         // small heads: one chunk
  BOOST_TEST(nn::linear_cross_entropy_chunk_rows(10, int64_t{1} << 40, 8) == 1);  // never 0
}

BOOST_AUTO_TEST_CASE(mismatched_shapes_are_refused_naming_the_op) {
  nn::CpuDevice dev(size_t{64} << 20, 1);
  const Tensor x = test::zeros(dev, DType::f32, {6, 4}), w = test::zeros(dev, DType::f32, {9, 4});
  const Tensor w5 = test::zeros(dev, DType::f32, {9, 5}), targets = test::zeros(dev, DType::i32, {6});
  const Tensor losses = Tensor::empty(dev, DType::f32, {6}), short_losses = Tensor::empty(dev, DType::f32, {5});
  auto names_op = [](const std::invalid_argument& e) {
    return std::string(e.what()).find("linear_cross_entropy") != std::string::npos;
  };
  BOOST_CHECK_EXCEPTION(dev.linear_cross_entropy_forward(losses, x, w5, targets), std::invalid_argument, names_op);
  BOOST_CHECK_EXCEPTION(dev.linear_cross_entropy_forward(short_losses, x, w, targets), std::invalid_argument,
                        names_op);
  BOOST_CHECK_EXCEPTION(dev.linear_cross_entropy_backward(x, w5, x, w, targets, 1.0), std::invalid_argument,
                        names_op);
  dev.linear_cross_entropy_forward(losses, x, w, targets);  // all-zero scores: log 9 per row
  BOOST_TEST(losses.data_as<float>()[3] == std::log(9.0), boost::test_tools::tolerance(1e-6));
}
