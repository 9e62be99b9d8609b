// bf16 and f16 on the CPU device: every op, on operands that the low type represents
// exactly, must store exactly the f32 op's result rounded once to the low type (the
// contract of cpu_device.h: compute in f32, round each output once). Mixed operands (low
// activations, f32 weight gradients) leave the f32 outputs equal to the all-f32 run.
#define BOOST_TEST_MODULE low_precision
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "nn/cpu_device.h"
#include "nn/dtype.h"
#include "test_util.h"

using namespace ferry;
using nn::DType;
using nn::Shape;
using nn::Tensor;

namespace {

// accum_f32: a weight gradient, f32 under mixed precision; stat_out/stat_in: statistics
// (attention's log-sum-exps), f32 whatever the activations' dtype.
enum class Kind { in, out, accum, accum_f32, stat_out, stat_in };

struct Arg {
  Kind kind;
  Shape shape;
};

struct Case {
  std::string name;
  std::vector<Arg> args;
  std::function<void(nn::Device&, const std::vector<Tensor>&, const Tensor& tokens)> run;
};

constexpr int64_t B = 2, T = 5, C = 12, NH = 3, KVH = 1, V = 11, H = 7;
constexpr int64_t N = B * T, HD = C / NH;

std::vector<Case> cases() {
  using K = Kind;
  return {
      {"gemm", {{K::accum, {5, 7}}, {K::in, {9, 5}}, {K::in, {7, 9}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) { d.gemm(a[0], a[1], true, a[2], true, 0.5, 1.0); }},
      {"gemm (weight gradient)", {{K::accum_f32, {7, 9}}, {K::in, {13, 7}}, {K::in, {13, 9}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) { d.gemm(a[0], a[1], true, a[2], false, 1.0, 1.0); }},
      {"add_bias", {{K::accum, {N, C}}, {K::in, {C}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) { d.add_bias(a[0], a[1]); }},
      {"bias_backward", {{K::accum_f32, {C}}, {K::in, {N, C}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) { d.bias_backward(a[0], a[1]); }},
      {"add", {{K::out, {N, C}}, {K::in, {N, C}}, {K::in, {N, C}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) { d.add(a[0], a[1], a[2]); }},
      {"accumulate", {{K::accum, {N, C}}, {K::in, {N, C}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) { d.accumulate(a[0], a[1]); }},
      {"scale", {{K::accum, {N, C}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) { d.scale(a[0], 0.37); }},
      {"embedding_forward", {{K::out, {N, C}}, {K::in, {V, C}}, {K::in, {T, C}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor& tok) { d.embedding_forward(a[0], tok, a[1], a[2], T); }},
      {"embedding_backward", {{K::accum_f32, {V, C}}, {K::accum_f32, {T, C}}, {K::in, {N, C}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor& tok) { d.embedding_backward(a[0], a[1], a[2], tok, T); }},
      {"layernorm_forward", {{K::out, {N, C}}, {K::out, {N}}, {K::out, {N}}, {K::in, {N, C}}, {K::in, {C}}, {K::in, {C}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) { d.layernorm_forward(a[0], a[1], a[2], a[3], a[4], a[5]); }},
      {"layernorm_backward",
       {{K::accum, {N, C}}, {K::accum_f32, {C}}, {K::accum_f32, {C}}, {K::in, {N, C}}, {K::in, {N, C}}, {K::in, {C}},
        {K::in, {N}}, {K::in, {N}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) {
         d.layernorm_backward(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
       }},
      {"attention_forward (GQA)", {{K::out, {B, T, C}}, {K::stat_out, {B, NH, T}}, {K::in, {B, T, (NH + 2 * KVH) * HD}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) { d.attention_forward(a[0], a[1], a[2], NH, KVH); }},
      {"attention_backward (GQA)",
       {{K::accum, {B, T, (NH + 2 * KVH) * HD}}, {K::in, {B, T, C}}, {K::in, {B, T, (NH + 2 * KVH) * HD}},
        {K::in, {B, T, C}}, {K::stat_in, {B, NH, T}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) {
         d.attention_backward(a[0], a[1], a[2], a[3], a[4], NH, KVH);
       }},
      {"rmsnorm_forward", {{K::out, {N, C}}, {K::out, {N}}, {K::in, {N, C}}, {K::in, {C}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) { d.rmsnorm_forward(a[0], a[1], a[2], a[3], 1e-5); }},
      {"rmsnorm_backward",
       {{K::accum, {N, C}}, {K::accum_f32, {C}}, {K::in, {N, C}}, {K::in, {N, C}}, {K::in, {C}}, {K::in, {N}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) { d.rmsnorm_backward(a[0], a[1], a[2], a[3], a[4], a[5]); }},
      {"swiglu_forward", {{K::out, {N, H}}, {K::in, {N, 2 * H}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) { d.swiglu_forward(a[0], a[1]); }},
      {"swiglu_backward", {{K::accum, {N, 2 * H}}, {K::in, {N, 2 * H}}, {K::in, {N, H}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) { d.swiglu_backward(a[0], a[1], a[2]); }},
      {"rope_forward", {{K::out, {N, 2 * C}}, {K::in, {N, 2 * C}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) { d.rope_forward(a[0], a[1], T, NH, HD, 10000.0); }},
      {"rope_backward", {{K::accum, {N, 2 * C}}, {K::in, {N, 2 * C}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) { d.rope_backward(a[0], a[1], T, NH, HD, 10000.0); }},
      {"gelu_forward", {{K::out, {N, C}}, {K::in, {N, C}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) { d.gelu_forward(a[0], a[1]); }},
      {"gelu_backward", {{K::accum, {N, C}}, {K::in, {N, C}}, {K::in, {N, C}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor&) { d.gelu_backward(a[0], a[1], a[2]); }},
      {"softmax_cross_entropy_forward", {{K::out, {N}}, {K::out, {N, V}}, {K::in, {N, V}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor& tok) { d.softmax_cross_entropy_forward(a[0], a[1], a[2], tok); }},
      {"softmax_cross_entropy_backward", {{K::accum, {N, V}}, {K::in, {N, V}}},
       [](nn::Device& d, const std::vector<Tensor>& a, const Tensor& tok) { d.softmax_cross_entropy_backward(a[0], a[1], tok, 0.1); }},
  };
}

// f32 values the low type holds exactly.
Tensor representable(nn::Device& dev, DType low, const Shape& shape, uint64_t seed) {
  Tensor x = test::random_tensor(dev, DType::f32, shape, seed);
  Tensor l = Tensor::empty(dev, low, shape);
  dev.cast(l, x);
  dev.cast(x, l);
  return x;
}

Tensor as(nn::Device& dev, DType t, const Tensor& x) {
  Tensor y = Tensor::empty(dev, t, x.shape());
  dev.cast(y, x);
  return y;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_op_rounds_the_f32_result_once) {
  nn::CpuDevice dev(size_t{1} << 26);
  Tensor tokens = Tensor::empty(dev, DType::i32, {N});
  for (int64_t i = 0; i < N; ++i) tokens.data_as<int32_t>()[i] = static_cast<int32_t>((i * 7 + 3) % V);
  for (DType low : {DType::bf16, DType::f16}) {
    for (bool mixed : {false, true}) {
      for (const Case& c : cases()) {
        BOOST_TEST_CONTEXT(c.name << " in " << nn::dtype_name(low) << (mixed ? ", weight gradients f32" : "")) {
          std::vector<Tensor> ref, lowp;
          uint64_t seed = 100;
          for (const Arg& a : c.args) {
            const bool out = a.kind == Kind::out || a.kind == Kind::stat_out;
            const Tensor x = out ? test::zeros(dev, DType::f32, a.shape) : representable(dev, low, a.shape, ++seed);
            ref.push_back(as(dev, DType::f32, x));
            const bool f32 = (mixed && a.kind == Kind::accum_f32) || a.kind == Kind::stat_out || a.kind == Kind::stat_in;
            lowp.push_back(as(dev, f32 ? DType::f32 : low, x));
          }
          c.run(dev, ref, tokens);
          c.run(dev, lowp, tokens);
          for (size_t i = 0; i < c.args.size(); ++i) {
            if (c.args[i].kind == Kind::in || c.args[i].kind == Kind::stat_in) continue;
            const bool stays_f32 = lowp[i].dtype() == DType::f32;
            const Tensor want = stays_f32 ? ref[i] : as(dev, DType::f32, as(dev, low, ref[i]));
            const Tensor got = as(dev, DType::f32, lowp[i]);
            int64_t bad = 0;
            for (int64_t k = 0; k < got.numel(); ++k) {
              const float g = got.data_as<float>()[k], w = want.data_as<float>()[k];
              if (std::memcmp(&g, &w, 4) != 0 || !std::isfinite(g)) ++bad;
            }
            BOOST_TEST(bad == 0, "output " << i << ": " << bad << " of " << got.numel() << " elements differ");
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(f16_rounds_to_nearest_even_and_overflows_to_infinity) {
  BOOST_TEST(nn::f16_to_f32(nn::f32_to_f16(65504.0f)) == 65504.0f);  // the largest finite half
  BOOST_TEST(std::isinf(nn::f16_to_f32(nn::f32_to_f16(65520.0f))));  // rounds past it
  BOOST_TEST(std::isinf(nn::f16_to_f32(nn::f32_to_f16(-1e6f))));
  BOOST_TEST(nn::f16_to_f32(nn::f32_to_f16(0x1.0p-24f)) == 0x1.0p-24f);  // the smallest subnormal
  BOOST_TEST(nn::f16_to_f32(nn::f32_to_f16(0x1.0p-26f)) == 0.0f);        // below half of it: zero
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even one, 1.
  BOOST_TEST(nn::f16_to_f32(nn::f32_to_f16(1.0f + 0x1.0p-11f)) == 1.0f);
  BOOST_TEST(std::isnan(nn::f16_to_f32(nn::f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
}

BOOST_AUTO_TEST_CASE(widening_scratch_stays_outside_the_arena) {
  nn::CpuDevice dev(size_t{1} << 20);
  const Tensor a = as(dev, DType::bf16, test::random_tensor(dev, DType::f32, {64, 64}, 1));
  const Tensor b = as(dev, DType::bf16, test::random_tensor(dev, DType::f32, {64, 64}, 2));
  const Tensor c = Tensor::empty(dev, DType::bf16, {64, 64});
  dev.reset_peak();
  const size_t before = dev.memory().in_use;
  dev.gemm(c, a, false, b, false, 1.0, 0.0);
  BOOST_TEST(dev.memory().peak == before);  // three f32 copies were made, none in the budget
  BOOST_CHECK_THROW(dev.gemm(Tensor::empty(dev, DType::f64, {64, 64}), a, false, b, false, 1.0, 0.0),
                    std::invalid_argument);  // f64 never mixes
}
