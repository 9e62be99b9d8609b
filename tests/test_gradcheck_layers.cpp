// Every layer's backward against central finite differences, in double precision on the
// CPU device, on small odd shapes. Each test builds a scalar L = sum(out * R) for a fixed
// random R, so dL/dout = R is what the backward op receives.
#define BOOST_TEST_MODULE gradcheck_layers
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "nn/cpu_device.h"
#include "nn/linear.h"
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
