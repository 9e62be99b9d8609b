// Every layer's backward against central finite differences, in double precision on the
// CPU device, on small odd shapes. Each test builds a scalar L = sum(out * R) for a fixed
// random R, so dL/dout = R is what the backward op receives.
#define BOOST_TEST_MODULE gradcheck_layers
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "nn/arch.h"
#include "nn/cpu_device.h"
#include "nn/dropout_mask.h"
#include "nn/gpt.h"
#include "nn/linear.h"
#include "nn/llama.h"
#include "test_util.h"

using namespace ferry;
using nn::DType;
using nn::Tensor;
using test::max_grad_error;
using test::random_tensor;
using test::zeros;

namespace {
constexpr double kTol = 1e-6;  // see test_util.h: max_grad_error
constexpr DType F = DType::f64;

// Where an adapter sits on its layer's output (nn/linear.h: LoraPair).
struct AdapterAt {
  int64_t row0, rows;
  double scale;
};

// A LoRA layer's two layouts on an output of 13 rows: two adapters on row windows of one
// packed weight (q's rows [0, 5) and v's [9, 13) of Llama's wqkv; k's rows [5, 9) bare), and
// one adapter over the whole output.
constexpr int64_t kLoraOut = 13;
const std::vector<std::vector<AdapterAt>> kLoraLayouts = {{{0, 5, 2.0}, {9, 4, 0.5}}, {{0, kLoraOut, 1.5}}};
const char* const kLoraLayoutNames[] = {"two adapters on row windows", "one adapter over the whole output"};
}  // namespace

BOOST_AUTO_TEST_CASE(linear_with_bias) {
  nn::CpuDevice dev(1 << 26);
  const int64_t N = 5, C = 7, OC = 3;
  Tensor x = random_tensor(dev, F, {N, C}, 1), w = random_tensor(dev, F, {OC, C}, 2);
  Tensor b = random_tensor(dev, F, {OC}, 3), R = random_tensor(dev, F, {N, OC}, 4);
  Tensor out = zeros(dev, F, {N, OC});
  auto loss = [&] {
    dev.gemm(out, x, false, w, true, 1.0, 0.0);
    dev.add_bias(out, b);
    return test::dot(out, R);
  };
  Tensor dx = zeros(dev, F, {N, C}), dw = zeros(dev, F, {OC, C}), db = zeros(dev, F, {OC});
  dev.gemm(dx, R, false, w, false, 1.0, 1.0);
  dev.gemm(dw, R, true, x, false, 1.0, 1.0);
  dev.bias_backward(db, R);
  BOOST_TEST(max_grad_error(loss, x, dx) < kTol);
  BOOST_TEST(max_grad_error(loss, w, dw) < kTol);
  BOOST_TEST(max_grad_error(loss, b, db) < kTol);
}

BOOST_AUTO_TEST_CASE(layernorm) {
  nn::CpuDevice dev(1 << 26);
  const int64_t N = 6, C = 11;
  Tensor x = random_tensor(dev, F, {N, C}, 5), w = random_tensor(dev, F, {C}, 6), b = random_tensor(dev, F, {C}, 7);
  Tensor R = random_tensor(dev, F, {N, C}, 8);
  Tensor out = zeros(dev, F, {N, C}), mean = zeros(dev, F, {N}), rstd = zeros(dev, F, {N});
  auto loss = [&] {
    dev.layernorm_forward(out, mean, rstd, x, w, b);
    return test::dot(out, R);
  };
  loss();
  Tensor dx = zeros(dev, F, {N, C}), dw = zeros(dev, F, {C}), db = zeros(dev, F, {C});
  dev.layernorm_backward(dx, dw, db, R, x, w, mean, rstd);
  BOOST_TEST(max_grad_error(loss, x, dx) < kTol);
  BOOST_TEST(max_grad_error(loss, w, dw) < kTol);
  BOOST_TEST(max_grad_error(loss, b, db) < kTol);
  // Output rows are normalised: mean b, and (out-b)/w has unit variance.
  loss();
  double m = 0;
  for (int64_t c = 0; c < C; ++c) m += (out.data_as<double>()[c] - b.data_as<double>()[c]) / w.data_as<double>()[c];
  BOOST_TEST(std::abs(m) < 1e-9);
}

BOOST_AUTO_TEST_CASE(causal_attention) {
  nn::CpuDevice dev(1 << 26);
  const int64_t B = 2, T = 5, NH = 3, C = 6;
  Tensor qkv = random_tensor(dev, F, {B, T, 3 * C}, 9), R = random_tensor(dev, F, {B, T, C}, 10);
  Tensor out = zeros(dev, F, {B, T, C}), lse = zeros(dev, F, {B, NH, T});
  auto loss = [&] {
    dev.attention_forward(out, lse, qkv, NH);
    return test::dot(out, R);
  };
  loss();
  Tensor dqkv = zeros(dev, F, {B, T, 3 * C});
  dev.attention_backward(dqkv, R, qkv, out, lse, NH);
  BOOST_TEST(max_grad_error(loss, qkv, dqkv) < kTol);
  // Causality: position t's output does not depend on later positions.
  loss();
  std::vector<double> before(out.data_as<double>(), out.data_as<double>() + out.numel());
  qkv.data_as<double>()[(T - 1) * 3 * C + 2 * C] += 1.0;  // batch 0, last position's v
  qkv.data_as<double>()[(T - 1) * 3 * C + C] += 1.0;      // and its k
  loss();
  for (int64_t t = 0; t < T - 1; ++t)
    for (int64_t c = 0; c < C; ++c) BOOST_TEST(out.data_as<double>()[t * C + c] == before[static_cast<size_t>(t * C + c)]);
}

// Grouped-query attention: 4 query heads share 2 key/value heads (hs = 3); against the
// gradient by differences and against multi-head attention with each k/v head repeated.
BOOST_AUTO_TEST_CASE(grouped_query_attention) {
  nn::CpuDevice dev(1 << 26);
  const int64_t B = 2, T = 5, NH = 4, KVH = 2, hs = 3, C = NH * hs, W = (NH + 2 * KVH) * hs;
  Tensor qkv = random_tensor(dev, F, {B, T, W}, 19), R = random_tensor(dev, F, {B, T, C}, 20);
  Tensor out = zeros(dev, F, {B, T, C}), lse = zeros(dev, F, {B, NH, T});
  auto loss = [&] {
    dev.attention_forward(out, lse, qkv, NH, KVH);
    return test::dot(out, R);
  };
  loss();
  Tensor dqkv = zeros(dev, F, {B, T, W});
  dev.attention_backward(dqkv, R, qkv, out, lse, NH, KVH);
  BOOST_TEST(max_grad_error(loss, qkv, dqkv) < kTol);
  loss();
  Tensor full = zeros(dev, F, {B, T, 3 * C}), out_mha = zeros(dev, F, {B, T, C}), lse_mha = zeros(dev, F, {B, NH, T});
  for (int64_t r = 0; r < B * T; ++r) {
    const double* src = qkv.data_as<double>() + r * W;
    double* dst = full.data_as<double>() + r * 3 * C;
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t kv = h / (NH / KVH);
      for (int64_t i = 0; i < hs; ++i) {
        dst[h * hs + i] = src[h * hs + i];
        dst[C + h * hs + i] = src[(NH + kv) * hs + i];
        dst[2 * C + h * hs + i] = src[(NH + KVH + kv) * hs + i];
      }
    }
  }
  dev.attention_forward(out_mha, lse_mha, full, NH);
  for (int64_t i = 0; i < out.numel(); ++i) BOOST_TEST(out.data_as<double>()[i] == out_mha.data_as<double>()[i]);
  BOOST_CHECK_THROW(dev.attention_forward(out, lse, qkv, NH, 3), std::invalid_argument);  // 4 heads, 3 groups
}

// Across tiles (the CPU device's are 64 positions) with packed documents, one starting
// at the tile edge (64) and one just past it (65): the gradient by differences.
BOOST_AUTO_TEST_CASE(attention_across_tiles_with_documents) {
  nn::CpuDevice dev(1 << 26);
  const int64_t B = 1, T = 70, NH = 2, KVH = 1, hs = 2, C = NH * hs, W = (NH + 2 * KVH) * hs;
  Tensor qkv = random_tensor(dev, F, {B, T, W}, 29), R = random_tensor(dev, F, {B, T, C}, 30);
  Tensor docs = Tensor::empty(dev, nn::DType::i32, {B * T});
  for (int64_t t = 0; t < T; ++t) docs.data_as<int32_t>()[t] = t < 30 ? 0 : t < 64 ? 30 : t < 65 ? 64 : 65;
  Tensor out = zeros(dev, F, {B, T, C}), lse = zeros(dev, F, {B, NH, T});
  auto loss = [&] {
    dev.attention_forward(out, lse, qkv, NH, KVH, docs);
    return test::dot(out, R);
  };
  loss();
  Tensor dqkv = zeros(dev, F, {B, T, W});
  dev.attention_backward(dqkv, R, qkv, out, lse, NH, KVH, docs);
  BOOST_TEST(max_grad_error(loss, qkv, dqkv) < kTol);
}

BOOST_AUTO_TEST_CASE(gelu) {
  nn::CpuDevice dev(1 << 26);
  Tensor x = random_tensor(dev, F, {3, 13}, 11, 2.0), R = random_tensor(dev, F, {3, 13}, 12);
  Tensor out = zeros(dev, F, {3, 13});
  auto loss = [&] {
    dev.gelu_forward(out, x);
    return test::dot(out, R);
  };
  Tensor dx = zeros(dev, F, {3, 13});
  dev.gelu_backward(dx, x, R);
  BOOST_TEST(max_grad_error(loss, x, dx) < kTol);
}

BOOST_AUTO_TEST_CASE(softmax_cross_entropy) {
  nn::CpuDevice dev(1 << 26);
  const int64_t N = 7, V = 9;
  Tensor logits = random_tensor(dev, F, {N, V}, 13, 3.0);
  Tensor targets = Tensor::empty(dev, DType::i32, {N});
  for (int64_t n = 0; n < N; ++n) targets.data_as<int32_t>()[n] = static_cast<int32_t>((n * 5) % V);
  Tensor probs = zeros(dev, F, {N, V}), losses = zeros(dev, F, {N});
  auto loss = [&] {
    dev.softmax_cross_entropy_forward(losses, probs, logits, targets);
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += losses.data_as<double>()[n];
    return s / static_cast<double>(N);
  };
  loss();
  Tensor dlogits = zeros(dev, F, {N, V});
  dev.softmax_cross_entropy_backward(dlogits, probs, targets, 1.0 / static_cast<double>(N));
  BOOST_TEST(max_grad_error(loss, logits, dlogits) < kTol);
  targets.data_as<int32_t>()[3] = static_cast<int32_t>(V);
  BOOST_CHECK_THROW(loss(), std::out_of_range);
}

BOOST_AUTO_TEST_CASE(embedding) {
  nn::CpuDevice dev(1 << 26);
  const int64_t B = 2, T = 3, C = 5, V = 4;
  Tensor wte = random_tensor(dev, F, {V, C}, 14), wpe = random_tensor(dev, F, {T + 2, C}, 15);
  Tensor tokens = Tensor::empty(dev, DType::i32, {B * T});
  const int32_t ids[] = {1, 3, 1, 0, 1, 2};  // a repeated token: gradients must add up
  dev.copy_from_host(tokens, ids);
  Tensor R = random_tensor(dev, F, {B * T, C}, 16), out = zeros(dev, F, {B * T, C});
  auto loss = [&] {
    dev.embedding_forward(out, tokens, wte, wpe, T);
    return test::dot(out, R);
  };
  Tensor dwte = zeros(dev, F, {V, C}), dwpe = zeros(dev, F, {T + 2, C});
  dev.embedding_backward(dwte, dwpe, R, tokens, T);
  BOOST_TEST(max_grad_error(loss, wte, dwte) < kTol);
  BOOST_TEST(max_grad_error(loss, wpe, dwpe) < kTol);
}

BOOST_AUTO_TEST_CASE(residual_add) {
  nn::CpuDevice dev(1 << 26);
  Tensor a = random_tensor(dev, F, {4, 3}, 17), b = random_tensor(dev, F, {4, 3}, 18);
  Tensor R = random_tensor(dev, F, {4, 3}, 19), out = zeros(dev, F, {4, 3});
  auto loss = [&] {
    dev.add(out, a, b);
    return test::dot(out, R);
  };
  Tensor da = zeros(dev, F, {4, 3});
  dev.accumulate(da, R);  // d(a+b)/da = identity: the backward of a residual add
  BOOST_TEST(max_grad_error(loss, a, da) < kTol);
  BOOST_TEST(max_grad_error(loss, b, da) < kTol);
}

// Llama's layers (nn/llama_kernels.h).
BOOST_AUTO_TEST_CASE(rmsnorm) {
  nn::CpuDevice dev(1 << 26);
  const int64_t N = 5, C = 11;
  Tensor x = random_tensor(dev, F, {N, C}, 31, 1.5), w = random_tensor(dev, F, {C}, 32);
  Tensor R = random_tensor(dev, F, {N, C}, 33);
  Tensor out = zeros(dev, F, {N, C}), rstd = zeros(dev, F, {N});
  auto loss = [&] {
    dev.rmsnorm_forward(out, rstd, x, w, 1e-5);
    return test::dot(out, R);
  };
  loss();
  // A hand-computed row: out = x / sqrt(mean(x^2) + eps) * w.
  double ss = 0;
  for (int64_t c = 0; c < C; ++c) ss += x.data_as<double>()[c] * x.data_as<double>()[c];
  const double r = 1.0 / std::sqrt(ss / C + 1e-5);
  BOOST_TEST(out.data_as<double>()[3] == x.data_as<double>()[3] * r * w.data_as<double>()[3],
             boost::test_tools::tolerance(1e-12));
  Tensor dx = zeros(dev, F, {N, C}), dw = zeros(dev, F, {C});
  dev.rmsnorm_backward(dx, dw, R, x, w, rstd);
  BOOST_TEST(max_grad_error(loss, x, dx) < kTol);
  BOOST_TEST(max_grad_error(loss, w, dw) < kTol);
}

BOOST_AUTO_TEST_CASE(swiglu) {
  nn::CpuDevice dev(1 << 26);
  const int64_t N = 4, H = 9;
  Tensor gu = random_tensor(dev, F, {N, 2 * H}, 41, 2.0), R = random_tensor(dev, F, {N, H}, 42);
  Tensor out = zeros(dev, F, {N, H});
  auto loss = [&] {
    dev.swiglu_forward(out, gu);
    return test::dot(out, R);
  };
  loss();
  const double g = gu.data_as<double>()[2], u = gu.data_as<double>()[H + 2];
  BOOST_TEST(out.data_as<double>()[2] == g / (1 + std::exp(-g)) * u, boost::test_tools::tolerance(1e-12));
  Tensor dgu = zeros(dev, F, {N, 2 * H});
  dev.swiglu_backward(dgu, gu, R);
  BOOST_TEST(max_grad_error(loss, gu, dgu) < kTol);
}

BOOST_AUTO_TEST_CASE(rotary_embedding) {
  nn::CpuDevice dev(1 << 26);
  const int64_t B = 2, T = 5, heads = 3, hd = 6;
  Tensor x = random_tensor(dev, F, {B * T, heads * hd}, 51), R = random_tensor(dev, F, {B * T, heads * hd}, 52);
  Tensor out = zeros(dev, F, {B * T, heads * hd});
  auto loss = [&] {
    dev.rope_forward(out, x, T, heads, hd, 10000.0);
    return test::dot(out, R);
  };
  loss();
  // Position 0 is not rotated; row 7 is position 2: element (head 1, i = 1) by angle 2 * 10000^(-2/6).
  for (int64_t i = 0; i < heads * hd; ++i) BOOST_TEST(out.data_as<double>()[i] == x.data_as<double>()[i]);
  const double a = 2.0 * std::pow(10000.0, -2.0 / 6.0);
  const double* xr = x.data_as<double>() + 7 * heads * hd + hd;
  BOOST_TEST(out.data_as<double>()[7 * heads * hd + hd + 1] == xr[1] * std::cos(a) - xr[4] * std::sin(a),
             boost::test_tools::tolerance(1e-12));
  Tensor dx = zeros(dev, F, {B * T, heads * hd});
  dev.rope_backward(dx, R, T, heads, hd, 10000.0);
  BOOST_TEST(max_grad_error(loss, x, dx) < kTol);
  // In place gives the same values.
  loss();  // out again from the unperturbed x
  Tensor y = random_tensor(dev, F, {B * T, heads * hd}, 51);
  dev.rope_forward(y, y, T, heads, hd, 10000.0);
  for (int64_t i = 0; i < y.numel(); ++i) BOOST_TEST(y.data_as<double>()[i] == out.data_as<double>()[i]);
  BOOST_CHECK_THROW(dev.rope_forward(out, x, T, 4, hd, 10000.0), std::invalid_argument);  // 4 heads of 6 > 18 columns
  // Only the first heads rotate (q and k of a qkv row): the rest passes through, both ways.
  Tensor part = zeros(dev, F, {B * T, heads * hd});
  auto loss2 = [&] {
    dev.rope_forward(part, x, T, 2, hd, 10000.0);
    return test::dot(part, R);
  };
  loss2();
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t c = 2 * hd; c < heads * hd; ++c)
      BOOST_TEST(part.data_as<double>()[r * heads * hd + c] == x.data_as<double>()[r * heads * hd + c]);
  Tensor dpart = zeros(dev, F, {B * T, heads * hd});
  dev.rope_backward(dpart, R, T, 2, hd, 10000.0);
  BOOST_TEST(max_grad_error(loss2, x, dpart) < kTol);
}

// The linear layer with LoRA adapters (nn/linear.h): L = sum(y * R) with y = x w^T + b plus
// each adapter's scale (x a^T) b^T in its rows, or y = gelu(that) with `pre` defined (the
// adapters added before the GELU, so backward is given dL/dpre). Against differences for x
// (dx is overwritten: it starts random), every adapter's a and b, and w and the bias where
// they are trained; in both layouts, with and without a bias, a GELU, and a trained w.
BOOST_AUTO_TEST_CASE(linear_with_lora_adapters) {
  nn::CpuDevice dev(1 << 26);
  const int64_t N = 5, IN = 7, OUT = kLoraOut, r = 2;
  uint64_t seed = 60;
  for (size_t layout = 0; layout < kLoraLayouts.size(); ++layout) {
    for (int bias = 0; bias < 2; ++bias) {
      for (int gelu = 0; gelu < 2; ++gelu) {
        for (int trained = 0; trained < 2; ++trained) {
          BOOST_TEST_CONTEXT(kLoraLayoutNames[layout] << (bias ? ", bias" : ", no bias") << (gelu ? ", GELU" : "")
                                                      << (trained ? ", w trained" : ", w frozen")) {
            const Tensor x = random_tensor(dev, F, {N, IN}, seed++), R = random_tensor(dev, F, {N, OUT}, seed++);
            nn::Linear l{random_tensor(dev, F, {OUT, IN}, seed++), Tensor{}, Tensor{}, Tensor{}, {}};
            if (bias) {
              l.b = random_tensor(dev, F, {OUT}, seed++);
              l.db = zeros(dev, F, {OUT});
            }
            if (trained) l.dw = zeros(dev, F, {OUT, IN});
            for (const AdapterAt& at : kLoraLayouts[layout]) {
              l.lora.push_back({random_tensor(dev, F, {r, IN}, seed), random_tensor(dev, F, {at.rows, r}, seed + 1),
                                zeros(dev, F, {r, IN}), zeros(dev, F, {at.rows, r}), at.row0, at.rows, at.scale});
              seed += 2;
            }
            const Tensor y = zeros(dev, F, {N, OUT}), pre = gelu ? zeros(dev, F, {N, OUT}) : Tensor{};
            auto loss = [&] {
              nn::linear_forward(dev, l, y, x, pre);
              return test::dot(y, R);
            };
            loss();
            Tensor dy = R;
            if (gelu) {
              dy = zeros(dev, F, {N, OUT});
              dev.gelu_backward(dy, pre, R);
            }
            const Tensor dx = random_tensor(dev, F, {N, IN}, seed++);
            nn::linear_backward(dev, l, dx, dy, x);
            BOOST_TEST(max_grad_error(loss, x, dx) < kTol);
            for (size_t k = 0; k < l.lora.size(); ++k) {
              BOOST_TEST(max_grad_error(loss, l.lora[k].a, l.lora[k].da) < kTol, "adapter " << k << "'s a");
              BOOST_TEST(max_grad_error(loss, l.lora[k].b, l.lora[k].db) < kTol, "adapter " << k << "'s b");
            }
            if (trained) BOOST_TEST(max_grad_error(loss, l.w, l.dw) < kTol);
            if (bias) BOOST_TEST(max_grad_error(loss, l.b, l.db) < kTol);
          }
        }
      }
    }
  }
}

// An adapter whose b is zero (PEFT's initialisation) leaves the base layer's output as it
// was, bit for bit; with b random the layer is the base layer with its weight merged,
// W' = W + scale (b a) in the adapter's rows (PEFT's merge_and_unload), within rounding.
BOOST_AUTO_TEST_CASE(lora_adapters_start_as_the_base_layer_and_merge_into_its_weight) {
  nn::CpuDevice dev(1 << 26);
  const int64_t N = 5, IN = 7, OUT = kLoraOut, r = 2;
  uint64_t seed = 160;
  for (size_t layout = 0; layout < kLoraLayouts.size(); ++layout) {
    for (int bias = 0; bias < 2; ++bias) {
      for (int gelu = 0; gelu < 2; ++gelu) {
        BOOST_TEST_CONTEXT(kLoraLayoutNames[layout] << (bias ? ", bias" : ", no bias") << (gelu ? ", GELU" : "")) {
          const Tensor x = random_tensor(dev, F, {N, IN}, seed++);
          const nn::Linear base{random_tensor(dev, F, {OUT, IN}, seed++),
                                bias ? random_tensor(dev, F, {OUT}, seed++) : Tensor{}, Tensor{}, Tensor{}, {}};
          nn::Linear adapted = base;
          for (const AdapterAt& at : kLoraLayouts[layout]) {
            adapted.lora.push_back({random_tensor(dev, F, {r, IN}, seed++), zeros(dev, F, {at.rows, r}), Tensor{},
                                    Tensor{}, at.row0, at.rows, at.scale});
          }
          auto forward = [&](const nn::Linear& l) {
            const Tensor y = zeros(dev, F, {N, OUT}), pre = gelu ? zeros(dev, F, {N, OUT}) : Tensor{};
            nn::linear_forward(dev, l, y, x, pre);
            return y;
          };
          const Tensor y0 = forward(base), y1 = forward(adapted);
          BOOST_TEST(std::memcmp(y0.data(), y1.data(), y0.nbytes()) == 0, "b = 0 changed the base layer's output");

          // W' = W + scale (b a) in each adapter's rows, b random.
          const nn::Linear merged{random_tensor(dev, F, {OUT, IN}, 0), base.b, Tensor{}, Tensor{}, {}};
          dev.copy(merged.w, base.w);
          for (nn::LoraPair& p : adapted.lora) {
            p.b = random_tensor(dev, F, {p.rows, r}, seed++);
            double* wm = merged.w.data_as<double>() + p.row0 * IN;
            for (int64_t i = 0; i < p.rows; ++i)
              for (int64_t k = 0; k < IN; ++k)
                for (int64_t j = 0; j < r; ++j)
                  wm[i * IN + k] += p.scale * p.b.data_as<double>()[i * r + j] * p.a.data_as<double>()[j * IN + k];
          }
          const Tensor want = forward(merged), got = forward(adapted);
          double scale = 0, worst = 0;
          for (int64_t i = 0; i < want.numel(); ++i) scale = std::max(scale, std::abs(want.data_as<double>()[i]));
          for (int64_t i = 0; i < want.numel(); ++i)
            worst = std::max(worst, std::abs(got.data_as<double>()[i] - want.data_as<double>()[i]));
          BOOST_TEST(worst <= 1e-13 * scale, "adapted vs merged: worst difference " << worst << " of " << scale);
          // The adapters changed the output: the comparison above is not of two base layers.
          BOOST_TEST(std::memcmp(got.data(), y0.data(), y0.nbytes()) != 0);
        }
      }
    }
  }
}

// PEFT's lora_dropout on the adapters' input (nn/linear.h: LoraPair::dropout): the mask is a
// function of (key, global row, column), so forward and backward see the same one and
// differences are valid. Against differences for x, every adapter's a and b (and w and the
// bias where trained), p = 0.3, each adapter its own key, rows starting at global row 7. The
// forward is checked first against the formula itself (the adapters' part of y is
// scale ((x . mask / (1 - p)) a^T) b^T, mask from nn/dropout_mask.h), so that a layer that
// ignored dropout in both passes would fail here, not pass the differences.
BOOST_AUTO_TEST_CASE(linear_with_lora_adapters_and_dropout) {
  nn::CpuDevice dev(1 << 26);
  const int64_t N = 6, IN = 7, OUT = kLoraOut, r = 2, row0 = 7;
  const double p = 0.3;
  uint64_t seed = 260;
  for (size_t layout = 0; layout < kLoraLayouts.size(); ++layout) {
    for (int gelu = 0; gelu < 2; ++gelu) {
      for (int trained = 0; trained < 2; ++trained) {
        BOOST_TEST_CONTEXT(kLoraLayoutNames[layout] << (gelu ? ", GELU" : "")
                                                    << (trained ? ", w trained" : ", w frozen")) {
          const Tensor x = random_tensor(dev, F, {N, IN}, seed++), R = random_tensor(dev, F, {N, OUT}, seed++);
          nn::Linear l{random_tensor(dev, F, {OUT, IN}, seed++), random_tensor(dev, F, {OUT}, seed++), Tensor{},
                       zeros(dev, F, {OUT}), {}};
          if (trained) l.dw = zeros(dev, F, {OUT, IN});
          for (const AdapterAt& at : kLoraLayouts[layout]) {
            nn::LoraPair a{random_tensor(dev, F, {r, IN}, seed), random_tensor(dev, F, {at.rows, r}, seed + 1),
                           zeros(dev, F, {r, IN}), zeros(dev, F, {at.rows, r}), at.row0, at.rows, at.scale};
            a.dropout = p;
            a.dropout_key = 0x5eed0000 + seed;
            a.dropout_row0 = row0;
            l.lora.push_back(a);
            seed += 2;
          }
          // The forward against the formula, without GELU: y - base = the adapters' sum.
          {
            const nn::Linear base{l.w, l.b, Tensor{}, Tensor{}, {}};
            const Tensor y = zeros(dev, F, {N, OUT}), y0 = zeros(dev, F, {N, OUT});
            nn::linear_forward(dev, l, y, x);
            nn::linear_forward(dev, base, y0, x);
            const uint64_t threshold = nn::dropout_threshold(p);
            double worst = 0, size = 0;
            size_t dropped = 0;
            for (const nn::LoraPair& a : l.lora) {
              for (int64_t n = 0; n < N; ++n) {
                for (int64_t o = 0; o < a.rows; ++o) {
                  double want = 0;
                  for (int64_t j = 0; j < r; ++j) {
                    double u = 0;
                    for (int64_t k = 0; k < IN; ++k) {
                      const bool keep = nn::dropout_keep(a.dropout_key, row0 + n, k, threshold);
                      dropped += !keep;
                      if (keep) u += x.data_as<double>()[n * IN + k] / (1 - p) * a.a.data_as<double>()[j * IN + k];
                    }
                    want += a.scale * u * a.b.data_as<double>()[o * r + j];
                  }
                  const int64_t at = n * OUT + a.row0 + o;
                  worst = std::max(worst, std::abs(y.data_as<double>()[at] - y0.data_as<double>()[at] - want));
                  size = std::max(size, std::abs(want));
                }
              }
            }
            BOOST_TEST(worst <= 1e-12 * std::max(1.0, size), "the adapters' part of y off by " << worst);
            BOOST_TEST(dropped > 0u);  // the mask dropped something: the comparison is not of dropout 0
          }
          const Tensor y = zeros(dev, F, {N, OUT}), pre = gelu ? zeros(dev, F, {N, OUT}) : Tensor{};
          auto loss = [&] {
            nn::linear_forward(dev, l, y, x, pre);
            return test::dot(y, R);
          };
          loss();
          Tensor dy = R;
          if (gelu) {
            dy = zeros(dev, F, {N, OUT});
            dev.gelu_backward(dy, pre, R);
          }
          const Tensor dx = random_tensor(dev, F, {N, IN}, seed++);
          nn::linear_backward(dev, l, dx, dy, x);
          BOOST_TEST(max_grad_error(loss, x, dx) < kTol);
          for (size_t k = 0; k < l.lora.size(); ++k) {
            BOOST_TEST(max_grad_error(loss, l.lora[k].a, l.lora[k].da) < kTol, "adapter " << k << "'s a");
            BOOST_TEST(max_grad_error(loss, l.lora[k].b, l.lora[k].db) < kTol, "adapter " << k << "'s b");
          }
          if (trained) BOOST_TEST(max_grad_error(loss, l.w, l.dw) < kTol);
          BOOST_TEST(max_grad_error(loss, l.b, l.db) < kTol);
        }
      }
    }
  }
}

// The model's side (nn/model.h: set_lora_dropout): a GPT-2 with adapters on every linear
// layer, dropout 0.3 keyed per micro-batch. Every adapter tensor's gradient against
// differences of the model's loss, with activation checkpointing off and on (backward
// recomputes the forward, masks included, from the model's setting); the same key gives the
// same loss bit for bit, another key or another row0 another loss, p = 0 the loss of a model
// never given dropout.
BOOST_AUTO_TEST_CASE(model_lora_dropout_gradients_match_differences) {
  nn::CpuDevice dev(1 << 28);
  const nn::GPTConfig cfg{/*n_layer=*/2, /*n_head=*/3, /*n_embd=*/9, /*vocab_size=*/11, /*block_size=*/7};
  nn::LoraOptions lora;
  lora.r = 2;
  lora.alpha = 4;
  lora.target_modules = {"all-linear"};
  const int64_t B = 2, T = 5;
  for (int checkpointing = 0; checkpointing < 2; ++checkpointing) {
    BOOST_TEST_CONTEXT((checkpointing ? "activation checkpointing" : "activations kept")) {
      nn::GPT model(cfg, dev, F);
      model.add_lora(nn::arch("gpt2"), nn::LlamaConfig{}, lora);
      model.set_activation_checkpointing(checkpointing == 1);
      nn::ResidentUnits units(dev, F, model.units());
      for (int u = 0; u < model.num_units(); ++u) model.init_unit(u, units.weights[static_cast<size_t>(u)], 7);
      // Random B (PEFT starts it at 0, which would leave A without gradient) and larger weights.
      for (size_t u = 0; u < units.weights.size(); ++u) {
        dev.accumulate(units.weights[u], random_tensor(dev, F, units.weights[u].shape(), 99 + u, 0.3));
      }
      Tensor tokens = Tensor::empty(dev, DType::i32, {B * T}), targets = Tensor::empty(dev, DType::i32, {B * T});
      nn::Rng rng(3);
      for (int64_t i = 0; i < B * T; ++i) {
        tokens.data_as<int32_t>()[i] = static_cast<int32_t>(rng.below(11));
        targets.data_as<int32_t>()[i] = static_cast<int32_t>(rng.below(11));
      }
      auto loss = [&] { return model.forward(units, tokens, targets, B, T); };
      const double plain = loss();
      model.set_lora_dropout(0.0, 77, 40);
      BOOST_TEST(loss() == plain);
      model.set_lora_dropout(0.3, 78, 40);
      const double other_key = loss();
      model.set_lora_dropout(0.3, 77, 50);
      const double other_rows = loss();
      model.set_lora_dropout(0.3, 77, 40);
      const double l0 = loss();
      BOOST_TEST(loss() == l0);
      BOOST_TEST(l0 != plain);
      BOOST_TEST(l0 != other_key);
      BOOST_TEST(l0 != other_rows);
      units.zero_grads();
      loss();
      model.backward(units);
      int64_t checked = 0;
      for (const nn::LoraAdapter& a : model.lora()) {
        const nn::UnitSpec& u = model.units()[static_cast<size_t>(a.unit)];
        for (const size_t t : {a.a, a.b}) {
          const Tensor w = u.view(units.weights[static_cast<size_t>(a.unit)], t);
          const Tensor g = u.grad_view(units.grads[static_cast<size_t>(a.unit)], t);
          BOOST_TEST_INFO("tensor " << u.tensors[t].name);
          BOOST_TEST(max_grad_error(loss, w, g, 40) < kTol);
          checked += std::min<int64_t>(w.numel(), 40);
        }
      }
      BOOST_TEST(checked > 0);
      BOOST_CHECK_THROW(model.set_lora_dropout(1.0, 77, 40), std::invalid_argument);
      BOOST_CHECK_THROW(model.set_lora_dropout(0.3, 77, -1), std::invalid_argument);
    }
  }
  // Each adapter its own key, and each micro-batch key its own set.
  std::vector<uint64_t> keys;
  for (const uint64_t key : {uint64_t{0}, uint64_t{1}, uint64_t{77}})
    for (size_t a = 0; a < 64; ++a) keys.push_back(nn::Model::lora_dropout_key(key, a));
  std::sort(keys.begin(), keys.end());
  BOOST_TEST((std::adjacent_find(keys.begin(), keys.end()) == keys.end()));
}
