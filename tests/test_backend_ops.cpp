// Backend ops: every op of every available device against the CPU device's f64 oracle, on
// fresh random inputs with odd shapes.
//
// Each case runs twice per device: "f32" (every float tensor f32) and "bf16" (the dtypes a
// bf16 model hands the op: activations and weights bf16; statistics, probabilities,
// losses and weight gradients f32). Inputs are drawn in f64, rounded to the dtype under
// test, and the oracle computes in f64 from those same rounded values, so the differences
// measure the op, not the inputs. Checks per output:
// - values: |got - want| <= tol * (|want| + max|want|), tol 1e-5 (f32) or 1e-2 (bf16);
// - finite: inputs are finite, so a NaN or inf is a bug (outputs an op writes without
//   reading start as NaN bytes, so an element it forgets shows up here too);
// - guard: 64 bytes after each output are filled with a pattern that must come back.
// Accumulating outputs (the *_backward gradients, gemm with beta) start from random
// values, which checks the "add into" contract.
// Devices: the CPU device always; the cuda device when cuda_status() finds a GPU; its
// cases are skipped (with the reason) otherwise. test_backend_ops_emulated builds this
// file against the cuda device's own sources run by the CPU emulation
// (testing/cuda_emulation.h), so the cuda cases run on every machine.
#define BOOST_TEST_MODULE backend_ops
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_precondition.h"
#include "nn/counting_device.h"
#include "nn/cpu_device.h"
#include "nn/cuda_device.h"
#include "nn/dropout_mask.h"
#ifdef FERRY_CUDA_EMULATION
#include "nn/cuda_kernels.h"
#include "testing/emu_cuda_api.h"  // ferry_emu::compute_major
#endif
#include "nn/gpt.h"
#include "nn/ledger_device.h"
#include "nn/linear.h"
#include "nn/linear_cross_entropy.h"
#include "nn/rng.h"
#include "staged_comparison.h"
#include "testing/reference_attention.h"

using namespace ferry;
using nn::DType;
using nn::Tensor;

namespace {

// What a buffer is to the op: decides its dtype in the bf16 mode and how it starts.
enum class Role { act, weight, stat, wgrad, ids };

struct Buf {
  Role role;
  nn::Shape shape;
  bool output = false;
  bool accumulates = false;  // output read before written (+=)
  double lo = -1, hi = 1;    // range of the random values (ids: [0, hi))
  // Elements before the view in its allocation: a view that starts off the 16-byte
  // boundary its allocation has (the vectorised kernels must take their scalar path).
  int64_t offset = 0;
};

struct OpCase {
  std::string name;
  std::vector<Buf> bufs;
  // Runs the op; returns a scalar result for ops that return one (sum_squares), else NaN.
  std::function<double(nn::Device&, const std::vector<Tensor>&)> run;
};

constexpr size_t kGuardBytes = 64;
constexpr uint8_t kGuard = 0xA5;

DType dtype_for(Role r, bool low, bool oracle) {
  if (r == Role::ids) return DType::i32;
  if (oracle) return DType::f64;
  if (low && (r == Role::act || r == Role::weight)) return DType::bf16;
  return DType::f32;
}

double round_to(DType t, double v) {
  switch (t) {
    case DType::f32:
      return static_cast<float>(v);
    case DType::bf16:
      return nn::bf16_to_f32(nn::f32_to_bf16(static_cast<float>(v)));
    case DType::f16:
      return nn::f16_to_f32(nn::f32_to_f16(static_cast<float>(v)));
    default:
      return v;
  }
}

void encode(DType t, double v, unsigned char* out) {
  switch (t) {
    case DType::f32: {
      const float f = static_cast<float>(v);
      std::memcpy(out, &f, 4);
      return;
    }
    case DType::f64:
      std::memcpy(out, &v, 8);
      return;
    case DType::bf16: {
      const uint16_t h = nn::f32_to_bf16(static_cast<float>(v));
      std::memcpy(out, &h, 2);
      return;
    }
    case DType::f16: {
      const uint16_t h = nn::f32_to_f16(static_cast<float>(v));
      std::memcpy(out, &h, 2);
      return;
    }
    case DType::i32: {
      const int32_t i = static_cast<int32_t>(v);
      std::memcpy(out, &i, 4);
      return;
    }
  }
}

double decode(DType t, const unsigned char* in) {
  switch (t) {
    case DType::f32: {
      float f;
      std::memcpy(&f, in, 4);
      return f;
    }
    case DType::f64: {
      double d;
      std::memcpy(&d, in, 8);
      return d;
    }
    case DType::bf16:
    case DType::f16: {
      uint16_t h;
      std::memcpy(&h, in, 2);
      return t == DType::bf16 ? nn::bf16_to_f32(h) : nn::f16_to_f32(h);
    }
    case DType::i32: {
      int32_t i;
      std::memcpy(&i, in, 4);
      return i;
    }
  }
  return 0;
}

struct Result {
  std::vector<std::vector<double>> outputs;  // per buffer (empty for inputs)
  std::vector<bool> guard_ok;
  double scalar = NAN;
};

// Runs `c` on `dev` with the given values (already rounded for the dtypes in use).
Result run_case(nn::Device& dev, const OpCase& c, const std::vector<std::vector<double>>& values,
                bool low, bool oracle) {
  std::vector<Tensor> views, whole;
  for (size_t i = 0; i < c.bufs.size(); ++i) {
    const Buf& b = c.bufs[i];
    const DType t = dtype_for(b.role, low, oracle);
    const size_t es = nn::dtype_size(t);
    const int64_t n = nn::shape_numel(b.shape);
    const int64_t guard_elems = static_cast<int64_t>(kGuardBytes / es);
    Tensor all = Tensor::empty(dev, t, {b.offset + n + guard_elems});
    std::vector<unsigned char> bytes(static_cast<size_t>(b.offset + n + guard_elems) * es, kGuard);
    unsigned char* at = bytes.data() + b.offset * es;
    if (b.output && !b.accumulates) {
      std::memset(at, 0xFF, static_cast<size_t>(n) * es);  // NaN in every float format
    } else {
      for (int64_t k = 0; k < n; ++k) encode(t, values[i][static_cast<size_t>(k)], at + k * es);
    }
    dev.copy_from_host(all, bytes.data());
    whole.push_back(all);
    views.push_back(all.view(b.offset, b.shape));
  }
  Result r;
  r.scalar = c.run(dev, views);
  dev.synchronize();
  r.outputs.resize(c.bufs.size());
  r.guard_ok.assign(c.bufs.size(), true);
  for (size_t i = 0; i < c.bufs.size(); ++i) {
    if (!c.bufs[i].output) continue;
    const Tensor& all = whole[i];
    const size_t es = nn::dtype_size(all.dtype());
    std::vector<unsigned char> bytes(all.nbytes());
    dev.copy_to_host(bytes.data(), all);
    const int64_t n = views[i].numel();
    const size_t from = static_cast<size_t>(c.bufs[i].offset) * es, to = from + static_cast<size_t>(n) * es;
    for (size_t k = from; k < to; k += es) r.outputs[i].push_back(decode(all.dtype(), bytes.data() + k));
    for (size_t k = 0; k < bytes.size(); ++k) {  // before the view and after it
      if ((k < from || k >= to) && bytes[k] != kGuard) r.guard_ok[i] = false;
    }
  }
  return r;
}

void check_case(nn::Device& dev, const OpCase& c, bool low, uint64_t seed) {
  nn::CpuDevice oracle(size_t{1} << 30);
  nn::Rng rng(seed);
  std::vector<std::vector<double>> values;
  for (const Buf& b : c.bufs) {
    const DType t = dtype_for(b.role, low, false);
    std::vector<double> v(static_cast<size_t>(nn::shape_numel(b.shape)));
    for (double& x : v) {
      // ids in [lo, hi): lo -1 mixes in kIgnoreTarget
      x = b.role == Role::ids ? static_cast<double>(rng.below(static_cast<uint64_t>(b.hi - b.lo))) + b.lo
                              : round_to(t, b.lo + (b.hi - b.lo) * rng.uniform());
    }
    values.push_back(std::move(v));
  }
  const Result want = run_case(oracle, c, values, low, true);
  const Result got = run_case(dev, c, values, low, false);
  const double tol = low ? 1e-2 : 1e-5;
  const std::string where = c.name + (low ? " [bf16]" : " [f32]") + " on " + dev.name();
  if (!std::isnan(want.scalar)) {
    BOOST_TEST(std::abs(got.scalar - want.scalar) <= tol * std::abs(want.scalar),
               where << ": " << got.scalar << " vs " << want.scalar);
  }
  for (size_t i = 0; i < c.bufs.size(); ++i) {
    if (!c.bufs[i].output) continue;
    BOOST_TEST(got.guard_ok[i],
               where << ": output " << i << " wrote outside its view (guard bytes changed)");
    double scale = 0;
    for (double w : want.outputs[i]) scale = std::max(scale, std::abs(w));
    size_t bad = 0, nonfinite = 0;
    double worst = 0;
    for (size_t k = 0; k < want.outputs[i].size(); ++k) {
      const double g = got.outputs[i][k], w = want.outputs[i][k];
      if (!std::isfinite(g)) {
        ++nonfinite;
        continue;
      }
      const double err = std::abs(g - w) / (std::abs(w) + scale + 1e-30);
      worst = std::max(worst, err);
      if (err > tol) ++bad;
    }
    BOOST_TEST(nonfinite == 0u,
               where << ": output " << i << " has " << nonfinite << " NaN/inf elements");
    BOOST_TEST(bad == 0u, where << ": output " << i << " has " << bad
                                << " elements off by more than " << tol << " (worst " << worst
                                << ")");
    BOOST_TEST_MESSAGE(where << ": output " << i << " worst relative error " << worst);
  }
}

// ---- the cases: odd shapes everywhere --------------------------------------------------

constexpr int64_t B = 3, T = 7, NH = 3, HS = 6, C = NH * HS, V = 37, H = 11, N = B * T;

std::vector<OpCase> all_cases() {
  using D = nn::Device;
  using Ts = std::vector<Tensor>;
  std::vector<OpCase> cs;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int64_t M = 13, Nn = 5, K = 9;
      for (int acc = 0; acc < 2; ++acc) {
        // beta = 0: forward activations (bf16 out); beta = 1: a weight gradient (f32 out).
        cs.push_back({"gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                          (acc ? " beta=1" : " beta=0"),
                      {{acc ? Role::wgrad : Role::act, {M, Nn}, true, acc == 1},
                       {Role::act, ta ? nn::Shape{K, M} : nn::Shape{M, K}},
                       {Role::weight, tb ? nn::Shape{Nn, K} : nn::Shape{K, Nn}}},
                      [ta, tb, acc](D& d, const Ts& t) {
                        d.gemm(t[0], t[1], ta, t[2], tb, 0.75, acc ? 1.0 : 0.0);
                        return NAN;
                      }});
      }
    }
  }
  cs.push_back(
      {"add_bias", {{Role::act, {N, C}, true, true}, {Role::weight, {C}}}, [](D& d, const Ts& t) {
         d.add_bias(t[0], t[1]);
         return NAN;
       }});
  cs.push_back({"bias_backward",
                {{Role::wgrad, {C}, true, true}, {Role::act, {N, C}}},
                [](D& d, const Ts& t) {
                  d.bias_backward(t[0], t[1]);
                  return NAN;
                }});
  cs.push_back({"add",
                {{Role::act, {N, C}, true}, {Role::act, {N, C}}, {Role::act, {N, C}}},
                [](D& d, const Ts& t) {
                  d.add(t[0], t[1], t[2]);
                  return NAN;
                }});
  cs.push_back({"accumulate",
                {{Role::wgrad, {N, C}, true, true}, {Role::wgrad, {N, C}}},
                [](D& d, const Ts& t) {
                  d.accumulate(t[0], t[1]);
                  return NAN;
                }});
  cs.push_back({"scale", {{Role::act, {N, C}, true, true}}, [](D& d, const Ts& t) {
                  d.scale(t[0], -0.375);
                  return NAN;
                }});
  cs.push_back({"cast", {{Role::act, {N, C}, true}, {Role::wgrad, {N, C}}}, [](D& d, const Ts& t) {
                  d.cast(t[0], t[1]);
                  return NAN;
                }});
  cs.push_back({"fill", {{Role::act, {N, C}, true}}, [](D& d, const Ts& t) {
                  d.fill(t[0], 0.625);
                  return NAN;
                }});
  cs.push_back({"sum_squares", {{Role::act, {N, C}}}, [](D& d, const Ts& t) {
                  return d.sum_squares(t[0]);
                }});
  cs.push_back({"embedding_forward",
                {{Role::act, {N, C}, true},
                 {Role::ids, {N}, false, false, 0, V},
                 {Role::weight, {V, C}},
                 {Role::weight, {T + 2, C}}},
                [](D& d, const Ts& t) {
                  d.embedding_forward(t[0], t[1], t[2], t[3], T);
                  return NAN;
                }});
  cs.push_back({"embedding_backward",
                {{Role::wgrad, {V, C}, true, true},
                 {Role::wgrad, {T + 2, C}, true, true},
                 {Role::act, {N, C}},
                 {Role::ids, {N}, false, false, 0, 5}},  // few distinct tokens: rows collide
                [](D& d, const Ts& t) {
                  d.embedding_backward(t[0], t[1], t[2], t[3], T);
                  return NAN;
                }});
  // Tall inputs: the column reductions split their rows into several chunks (64 rows per
  // chunk at 64 threads, 256 at 256) whose partial sums a second pass adds.
  constexpr int64_t Tall = 43 * T;  // 301 rows
  cs.push_back({"bias_backward (tall)",
                {{Role::wgrad, {C}, true, true}, {Role::act, {Tall, C}}},
                [](D& d, const Ts& t) {
                  d.bias_backward(t[0], t[1]);
                  return NAN;
                }});
  cs.push_back({"embedding_backward (tall)",
                {{Role::wgrad, {V, C}, true, true},
                 {Role::wgrad, {T + 2, C}, true, true},
                 {Role::act, {Tall, C}},
                 {Role::ids, {Tall}, false, false, 0, V}},
                [](D& d, const Ts& t) {
                  d.embedding_backward(t[0], t[1], t[2], t[3], T);
                  return NAN;
                }});
  cs.push_back({"layernorm_backward (tall)",
                {{Role::act, {Tall, C}, true, true},
                 {Role::wgrad, {C}, true, true},
                 {Role::wgrad, {C}, true, true},
                 {Role::act, {Tall, C}},
                 {Role::act, {Tall, C}},
                 {Role::weight, {C}},
                 {Role::stat, {Tall}, false, false, -0.2, 0.2},
                 {Role::stat, {Tall}, false, false, 0.5, 2}},
                [](D& d, const Ts& t) {
                  d.layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
                  return NAN;
                }});
  cs.push_back({"rmsnorm_backward (tall)",
                {{Role::act, {Tall, C}, true, true},
                 {Role::wgrad, {C}, true, true},
                 {Role::act, {Tall, C}},
                 {Role::act, {Tall, C}},
                 {Role::weight, {C}},
                 {Role::stat, {Tall}, false, false, 0.5, 2}},
                [](D& d, const Ts& t) {
                  d.rmsnorm_backward(t[0], t[1], t[2], t[3], t[4], t[5]);
                  return NAN;
                }});
  cs.push_back({"layernorm_forward",
                {{Role::act, {N, C}, true},
                 {Role::stat, {N}, true},
                 {Role::stat, {N}, true},
                 {Role::act, {N, C}},
                 {Role::weight, {C}},
                 {Role::weight, {C}}},
                [](D& d, const Ts& t) {
                  d.layernorm_forward(t[0], t[1], t[2], t[3], t[4], t[5]);
                  return NAN;
                }});
  cs.push_back({"layernorm_backward",
                {{Role::act, {N, C}, true, true},
                 {Role::wgrad, {C}, true, true},
                 {Role::wgrad, {C}, true, true},
                 {Role::act, {N, C}},
                 {Role::act, {N, C}},
                 {Role::weight, {C}},
                 {Role::stat, {N}, false, false, -0.2, 0.2},
                 {Role::stat, {N}, false, false, 0.5, 2}},
                [](D& d, const Ts& t) {
                  d.layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
                  return NAN;
                }});
  cs.push_back({"rmsnorm_forward",
                {{Role::act, {N, C}, true},
                 {Role::stat, {N}, true},
                 {Role::act, {N, C}},
                 {Role::weight, {C}}},
                [](D& d, const Ts& t) {
                  d.rmsnorm_forward(t[0], t[1], t[2], t[3], 1e-5);
                  return NAN;
                }});
  cs.push_back({"rmsnorm_backward",
                {{Role::act, {N, C}, true, true},
                 {Role::wgrad, {C}, true, true},
                 {Role::act, {N, C}},
                 {Role::act, {N, C}},
                 {Role::weight, {C}},
                 {Role::stat, {N}, false, false, 0.5, 2}},
                [](D& d, const Ts& t) {
                  d.rmsnorm_backward(t[0], t[1], t[2], t[3], t[4], t[5]);
                  return NAN;
                }});
  for (int64_t kvh : {NH, int64_t{1}}) {
    const int64_t W = (NH + 2 * kvh) * HS;
    const std::string tag = " kv_heads=" + std::to_string(kvh);
    cs.push_back(
        {"attention_forward" + tag,
         {{Role::act, {B, T, C}, true}, {Role::stat, {B, NH, T}, true}, {Role::act, {B, T, W}}},
         [kvh](D& d, const Ts& t) {
           d.attention_forward(t[0], t[1], t[2], NH, kvh);
           return NAN;
         }});
    // Backward reads forward's output and log-sum-exps, so they come from forward on the
    // same device.
    cs.push_back({"attention_backward" + tag,
                  {{Role::act, {B, T, W}, true, true},
                   {Role::act, {B, T, C}},
                   {Role::act, {B, T, W}},
                   {Role::stat, {B, NH, T}, true},
                   {Role::act, {B, T, C}, true}},
                  [kvh](D& d, const Ts& t) {
                    d.attention_forward(t[4], t[3], t[2], NH, kvh);
                    d.attention_backward(t[0], t[1], t[2], t[4], t[3], NH, kvh);
                    return NAN;
                  }});
  }
  cs.push_back({"swiglu_forward",
                {{Role::act, {N, H}, true}, {Role::act, {N, 2 * H}, false, false, -3, 3}},
                [](D& d, const Ts& t) {
                  d.swiglu_forward(t[0], t[1]);
                  return NAN;
                }});
  cs.push_back({"swiglu_backward",
                {{Role::act, {N, 2 * H}, true, true},
                 {Role::act, {N, 2 * H}, false, false, -3, 3},
                 {Role::act, {N, H}}},
                [](D& d, const Ts& t) {
                  d.swiglu_backward(t[0], t[1], t[2]);
                  return NAN;
                }});
  // Rows of 2 rotated heads of 6 plus 5 pass-through columns.
  cs.push_back(
      {"rope_forward", {{Role::act, {N, 17}, true}, {Role::act, {N, 17}}}, [](D& d, const Ts& t) {
         d.rope_forward(t[0], t[1], T, 2, 6, 10000.0);
         return NAN;
       }});
  cs.push_back({"rope_backward",
                {{Role::act, {N, 17}, true, true}, {Role::act, {N, 17}}},
                [](D& d, const Ts& t) {
                  d.rope_backward(t[0], t[1], T, 2, 6, 10000.0);
                  return NAN;
                }});
  cs.push_back({"gelu_forward",
                {{Role::act, {N, H}, true}, {Role::act, {N, H}, false, false, -4, 4}},
                [](D& d, const Ts& t) {
                  d.gelu_forward(t[0], t[1]);
                  return NAN;
                }});
  cs.push_back({"gelu_backward",
                {{Role::act, {N, H}, true, true},
                 {Role::act, {N, H}, false, false, -4, 4},
                 {Role::act, {N, H}}},
                [](D& d, const Ts& t) {
                  d.gelu_backward(t[0], t[1], t[2]);
                  return NAN;
                }});
  cs.push_back({"softmax_cross_entropy_forward",
                {{Role::stat, {N}, true},
                 {Role::stat, {N, V}, true},
                 {Role::act, {N, V}, false, false, -6, 6},
                 {Role::ids, {N}, false, false, 0, V}},
                [](D& d, const Ts& t) {
                  d.softmax_cross_entropy_forward(t[0], t[1], t[2], t[3]);
                  return NAN;
                }});
  cs.push_back({"softmax_cross_entropy_backward",
                {{Role::act, {N, V}, true, true},
                 {Role::stat, {N, V}, false, false, 0, 0.1},
                 {Role::ids, {N}, false, false, 0, V}},
                [](D& d, const Ts& t) {
                  d.softmax_cross_entropy_backward(t[0], t[1], t[2], 1.0 / N);
                  return NAN;
                }});
  // Targets kIgnoreTarget (-1) among the others: loss 0 and no gradient on those rows.
  cs.push_back({"softmax_cross_entropy_forward (ignored targets)",
                {{Role::stat, {N}, true},
                 {Role::stat, {N, V}, true},
                 {Role::act, {N, V}, false, false, -6, 6},
                 {Role::ids, {N}, false, false, -1, V}},
                [](D& d, const Ts& t) {
                  d.softmax_cross_entropy_forward(t[0], t[1], t[2], t[3]);
                  return NAN;
                }});
  cs.push_back({"softmax_cross_entropy_backward (ignored targets)",
                {{Role::act, {N, V}, true, true},
                 {Role::stat, {N, V}, false, false, 0, 0.1},
                 {Role::ids, {N}, false, false, -1, 4}},  // most rows ignored
                [](D& d, const Ts& t) {
                  d.softmax_cross_entropy_backward(t[0], t[1], t[2], 1.0 / N);
                  return NAN;
                }});
  // The fused head (nn/linear_cross_entropy.h), forward and backward, with targets drawn
  // from [lo, vocab) (lo -1: kIgnoreTarget among them) and weights from [-w, w]. `small`
  // cuts the scratch budget to 600 bytes: every device goes through several chunks of rows
  // and a shorter last one (the CPU device 2 rows at a time, at 6 or 8 bytes of scratch per
  // score).
  struct SmallChunks {
    explicit SmallChunks(bool on) : on_(on) {
      if (on_) nn::set_linear_cross_entropy_scratch_bytes(600);
    }
    ~SmallChunks() {
      if (on_) nn::set_linear_cross_entropy_scratch_bytes(0);
    }
    bool on_;
  };
  const auto fused_head = [&cs](const std::string& tag, int64_t lo, int64_t vocab, double w, bool small) {
    cs.push_back({"linear_cross_entropy_forward" + tag,
                  {{Role::stat, {N}, true},
                   {Role::act, {N, C}},
                   {Role::weight, {vocab, C}, false, false, -w, w},
                   {Role::ids, {N}, false, false, static_cast<double>(lo), static_cast<double>(vocab)}},
                  [small](D& d, const Ts& t) {
                    const SmallChunks chunks(small);
                    d.linear_cross_entropy_forward(t[0], t[1], t[2], t[3]);
                    return NAN;
                  }});
    cs.push_back({"linear_cross_entropy_backward" + tag,
                  {{Role::act, {N, C}, true, true},
                   {Role::wgrad, {vocab, C}, true, true},
                   {Role::act, {N, C}},
                   {Role::weight, {vocab, C}, false, false, -w, w},
                   {Role::ids, {N}, false, false, static_cast<double>(lo), static_cast<double>(vocab)}},
                  [small](D& d, const Ts& t) {
                    const SmallChunks chunks(small);
                    d.linear_cross_entropy_backward(t[0], t[1], t[2], t[3], t[4], 0.5);
                    return NAN;
                  }});
  };
  for (const int64_t lo : {int64_t{0}, int64_t{-1}}) {
    fused_head(lo < 0 ? " (ignored targets)" : "", lo, V, 1, /*small=*/true);
  }
  cs.push_back({"adamw",
                {{Role::wgrad, {1031}, true, true},
                 {Role::wgrad, {1031}},
                 {Role::wgrad, {1031}, true, true},
                 {Role::wgrad, {1031}, true, true, 0, 1e-3}},
                [](D& d, const Ts& t) {
                  d.adamw(t[0], t[1], t[2], t[3], {7, 3e-3, 0.9, 0.95, 1e-8, 0.1, 0.5});
                  return NAN;
                }});
  // Shapes for the vectorised kernels (16-byte chunks: 8 bf16 or 4 f32 elements): rows a
  // multiple of 8 wide, and views that start off the 16-byte boundary (scalar path).
  constexpr int64_t CV = 40;
  cs.push_back({"add_bias (rows of 8s)",
                {{Role::act, {N, CV}, true, true}, {Role::weight, {CV}}},
                [](D& d, const Ts& t) {
                  d.add_bias(t[0], t[1]);
                  return NAN;
                }});
  cs.push_back({"add_bias (misaligned out)",
                {{Role::act, {N, CV}, true, true, -1, 1, 3}, {Role::weight, {CV}}},
                [](D& d, const Ts& t) {
                  d.add_bias(t[0], t[1]);
                  return NAN;
                }});
  cs.push_back({"accumulate (misaligned src)",
                {{Role::wgrad, {N, CV}, true, true}, {Role::wgrad, {N, CV}, false, false, -1, 1, 5}},
                [](D& d, const Ts& t) {
                  d.accumulate(t[0], t[1]);
                  return NAN;
                }});
  cs.push_back({"cast (misaligned dst)",
                {{Role::act, {N, CV}, true, false, -1, 1, 1}, {Role::wgrad, {N, CV}}},
                [](D& d, const Ts& t) {
                  d.cast(t[0], t[1]);
                  return NAN;
                }});
  cs.push_back({"scale (misaligned)", {{Role::act, {N, CV}, true, true, -1, 1, 2}}, [](D& d, const Ts& t) {
                  d.scale(t[0], 1.75);
                  return NAN;
                }});
  constexpr int64_t HV = 16;
  cs.push_back({"swiglu_forward (rows of 8s)",
                {{Role::act, {N, HV}, true}, {Role::act, {N, 2 * HV}, false, false, -3, 3}},
                [](D& d, const Ts& t) {
                  d.swiglu_forward(t[0], t[1]);
                  return NAN;
                }});
  cs.push_back({"swiglu_backward (rows of 8s)",
                {{Role::act, {N, 2 * HV}, true, true},
                 {Role::act, {N, 2 * HV}, false, false, -3, 3},
                 {Role::act, {N, HV}}},
                [](D& d, const Ts& t) {
                  d.swiglu_backward(t[0], t[1], t[2]);
                  return NAN;
                }});
  cs.push_back({"gelu_backward (misaligned inp)",
                {{Role::act, {N, HV}, true, true},
                 {Role::act, {N, HV}, false, false, -4, 4, 3},
                 {Role::act, {N, HV}}},
                [](D& d, const Ts& t) {
                  d.gelu_backward(t[0], t[1], t[2]);
                  return NAN;
                }});
  // The norms' typed kernels: 8 lanes per row (rows of 40), a warp per row (rows of 264), a
  // block per row (rows of 1048: more than a warp holds), and a misaligned view (the
  // generic kernel).
  for (const auto& [tag, rows, width, offset] :
       {std::tuple<const char*, int64_t, int64_t, int64_t>{" (rows of 8s)", N, CV, 0},
        {" (warp rows)", N, 264, 0},
        {" (wide rows)", 5, 1048, 0},
        {" (misaligned inp)", N, CV, 1}}) {
    const int64_t R = rows, W = width, O = offset;
    cs.push_back({std::string("layernorm_forward") + tag,
                  {{Role::act, {R, W}, true},
                   {Role::stat, {R}, true},
                   {Role::stat, {R}, true},
                   {Role::act, {R, W}, false, false, -1, 1, O},
                   {Role::weight, {W}},
                   {Role::weight, {W}}},
                  [](D& d, const Ts& t) {
                    d.layernorm_forward(t[0], t[1], t[2], t[3], t[4], t[5]);
                    return NAN;
                  }});
    cs.push_back({std::string("layernorm_backward") + tag,
                  {{Role::act, {R, W}, true, true},
                   {Role::wgrad, {W}, true, true},
                   {Role::wgrad, {W}, true, true},
                   {Role::act, {R, W}},
                   {Role::act, {R, W}, false, false, -1, 1, O},
                   {Role::weight, {W}},
                   {Role::stat, {R}, false, false, -0.2, 0.2},
                   {Role::stat, {R}, false, false, 0.5, 2}},
                  [](D& d, const Ts& t) {
                    d.layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
                    return NAN;
                  }});
    cs.push_back({std::string("rmsnorm_forward") + tag,
                  {{Role::act, {R, W}, true},
                   {Role::stat, {R}, true},
                   {Role::act, {R, W}, false, false, -1, 1, O},
                   {Role::weight, {W}}},
                  [](D& d, const Ts& t) {
                    d.rmsnorm_forward(t[0], t[1], t[2], t[3], 1e-5);
                    return NAN;
                  }});
    cs.push_back({std::string("rmsnorm_backward") + tag,
                  {{Role::act, {R, W}, true, true},
                   {Role::wgrad, {W}, true, true},
                   {Role::act, {R, W}},
                   {Role::act, {R, W}, false, false, -1, 1, O},
                   {Role::weight, {W}},
                   {Role::stat, {R}, false, false, 0.5, 2}},
                  [](D& d, const Ts& t) {
                    d.rmsnorm_backward(t[0], t[1], t[2], t[3], t[4], t[5]);
                    return NAN;
                  }});
  }
  constexpr int64_t VV = 64;
  for (int64_t O : {int64_t{0}, int64_t{3}}) {
    const std::string tag = O ? " (misaligned logits)" : " (rows of 8s)";
    cs.push_back({"softmax_cross_entropy_forward" + tag,
                  {{Role::stat, {N}, true},
                   {Role::stat, {N, VV}, true},
                   {Role::act, {N, VV}, false, false, -6, 6, O},
                   {Role::ids, {N}, false, false, -1, VV}},
                  [](D& d, const Ts& t) {
                    d.softmax_cross_entropy_forward(t[0], t[1], t[2], t[3]);
                    return NAN;
                  }});
    cs.push_back({"softmax_cross_entropy_backward" + tag,
                  {{Role::act, {N, VV}, true, true, -1, 1, O},
                   {Role::stat, {N, VV}, false, false, 0, 0.1},
                   {Role::ids, {N}, false, false, -1, VV}},
                  [](D& d, const Ts& t) {
                    d.softmax_cross_entropy_backward(t[0], t[1], t[2], 1.0 / N);
                    return NAN;
                  }});
  }
  // The fused head's row kernels in 16-byte vectors (V a multiple of 8): the online max and
  // sum across several vectors per thread, then the ignored and in-range targets.
  for (const int64_t lo : {int64_t{0}, int64_t{-1}}) {
    fused_head(lo < 0 ? " (rows of 8s, ignored targets)" : " (rows of 8s)", lo, VV, 3, /*small=*/false);
  }
  // dwte in 16-byte vectors of a row (C a multiple of 8), tall enough for several tiles of
  // tokens per block, with few distinct tokens (one token's rows run long in one block).
  cs.push_back({"embedding_backward (rows of 8s, tall)",
                {{Role::wgrad, {V, CV}, true, true},
                 {Role::wgrad, {T + 2, CV}, true, true},
                 {Role::act, {Tall, CV}},
                 {Role::ids, {Tall}, false, false, 0, 3}},
                [](D& d, const Ts& t) {
                  d.embedding_backward(t[0], t[1], t[2], t[3], T);
                  return NAN;
                }});
  cs.push_back({"adamw (misaligned grad)",
                {{Role::wgrad, {1031}, true, true},
                 {Role::wgrad, {1031}, false, false, -1, 1, 1},
                 {Role::wgrad, {1031}, true, true},
                 {Role::wgrad, {1031}, true, true, 0, 1e-3}},
                [](D& d, const Ts& t) {
                  d.adamw(t[0], t[1], t[2], t[3], {7, 3e-3, 0.9, 0.95, 1e-8, 0.1, 0.5});
                  return NAN;
                }});
  // In place, as a model rotates q and k: rotary pairs read before either half is written.
  cs.push_back({"rope_forward (in place)", {{Role::act, {N, 17}, true, true}}, [](D& d, const Ts& t) {
                  d.rope_forward(t[0], t[0], T, 2, 6, 10000.0);
                  return NAN;
                }});
  cs.push_back({"embedding_forward (rows of 8s)",
                {{Role::act, {N, CV}, true},
                 {Role::ids, {N}, false, false, 0, V},
                 {Role::weight, {V, CV}},
                 {Role::weight, {T + 2, CV}}},
                [](D& d, const Ts& t) {
                  d.embedding_forward(t[0], t[1], t[2], t[3], T);
                  return NAN;
                }});
  cs.push_back({"embedding_forward (misaligned out)",
                {{Role::act, {N, CV}, true, false, -1, 1, 3},
                 {Role::ids, {N}, false, false, 0, V},
                 {Role::weight, {V, CV}},
                 {Role::weight, {T + 2, CV}}},
                [](D& d, const Ts& t) {
                  d.embedding_forward(t[0], t[1], t[2], t[3], T);
                  return NAN;
                }});
  cs.push_back({"sum_squares (misaligned)", {{Role::act, {N, CV}, false, false, -1, 1, 1}},
                [](D& d, const Ts& t) { return d.sum_squares(t[0]); }});
  // Low-rank adapters on pieces of a packed projection (nn/linear.h), appended here so that
  // the cases above keep their seeds. The packed output has LO = 23 rows, q [0, 11), k
  // [11, 16) and v [16, 23), from LI = 13 inputs; adapters of rank LR = 3 on N = 21 rows.
  // In bf16 mode an act c is bf16 beside bf16 operands, a wgrad c f32 beside them.
  constexpr int64_t LO = 23, LI = 13, LR = 3;
  for (int f32_c = 0; f32_c < 2; ++f32_c) {
    // Forward: y[:, 16:23] += s u b^T, a window that ends at the row's last column.
    cs.push_back({std::string("gemm_cols c window (forward") + (f32_c ? ", f32 c)" : ")"),
                  {{f32_c ? Role::wgrad : Role::act, {N, LO}, true, true},
                   {Role::act, {N, LR}},
                   {Role::weight, {7, LR}}},
                  [](D& d, const Ts& t) {
                    d.gemm_cols(t[0], 16, 7, t[1], 0, LR, false, t[2], true, 0.75, 1.0);
                    return NAN;
                  }});
  }
  // Backward: db[5, r] += s dy[:, 11:16]^T u (f32 c in bf16 mode), du = s dy[:, 11:16] b
  // (beta 0: c starts as NaN and must not be read).
  cs.push_back({"gemm_cols a window transposed (db)",
                {{Role::wgrad, {5, LR}, true, true}, {Role::act, {N, LO}}, {Role::act, {N, LR}}},
                [](D& d, const Ts& t) {
                  d.gemm_cols(t[0], 0, LR, t[1], 11, 5, true, t[2], false, 0.75, 1.0);
                  return NAN;
                }});
  cs.push_back({"gemm_cols a window (du)",
                {{Role::act, {N, LR}, true}, {Role::act, {N, LO}}, {Role::weight, {5, LR}}},
                [](D& d, const Ts& t) {
                  d.gemm_cols(t[0], 0, LR, t[1], 11, 5, false, t[2], false, 0.75, 0.0);
                  return NAN;
                }});
  // Windows in c and a at once, in every transposition, beta neither 0 nor 1: c [13, 12]
  // columns [4, 9), a [13, 16] columns [6, 15) or, transposed, [9, 17] columns [3, 16).
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int64_t M = 13, Nn = 5, K = 9;
      cs.push_back({"gemm_cols both windows ta=" + std::to_string(ta) + " tb=" + std::to_string(tb),
                    {{Role::act, {M, 12}, true, true},
                     {Role::act, ta ? nn::Shape{K, 17} : nn::Shape{M, 16}},
                     {Role::weight, tb ? nn::Shape{Nn, K} : nn::Shape{K, Nn}}},
                    [ta, tb](D& d, const Ts& t) {
                      d.gemm_cols(t[0], 4, Nn, t[1], ta ? 3 : 6, ta ? M : K, ta, t[2], tb, -1.25, 0.5);
                      return NAN;
                    }});
    }
  }
  // The layer: two adapters on q's and v's rows of one packed weight (scales 2 and 0.5), a
  // bias, forward with and without GELU; backward with w frozen (no dw) and trained.
  // Buffers 2..7: w, bias, q's a and b, v's a and b.
  const std::vector<Buf> layer = {{Role::weight, {LO, LI}}, {Role::weight, {LO}},     {Role::weight, {LR, LI}},
                                  {Role::weight, {11, LR}}, {Role::weight, {LR, LI}}, {Role::weight, {7, LR}}};
  const auto lora_layer = [](const Ts& t, const Tensor& dw, const Tensor& db, const Tensor& da_q, const Tensor& db_q,
                             const Tensor& da_v, const Tensor& db_v) {
    nn::Linear l{t[2], t[3], dw, db, {}};
    l.lora.push_back({t[4], t[5], da_q, db_q, 0, 11, 2.0});
    l.lora.push_back({t[6], t[7], da_v, db_v, 16, 7, 0.5});
    return l;
  };
  for (int gelu = 0; gelu < 2; ++gelu) {
    std::vector<Buf> bufs = {{Role::act, {N, LO}, true}, {Role::act, {N, LI}}};
    bufs.insert(bufs.end(), layer.begin(), layer.end());
    if (gelu) bufs.push_back({Role::act, {N, LO}, true});  // pre
    cs.push_back({std::string("linear_forward (two adapters on row windows, bias") + (gelu ? ", GELU)" : ")"),
                  bufs, [gelu, lora_layer](D& d, const Ts& t) {
                    nn::linear_forward(d, lora_layer(t, {}, {}, {}, {}, {}, {}), t[0], t[1], gelu ? t[8] : Tensor{});
                    return NAN;
                  }});
  }
  for (int trained = 0; trained < 2; ++trained) {
    // 0 dx (overwritten), 1 dy, 2..7 the layer, 8 dbias, 9..12 da_q db_q da_v db_v, 13 dw.
    std::vector<Buf> bufs = {{Role::act, {N, LI}, true}, {Role::act, {N, LO}}};
    bufs.insert(bufs.end(), layer.begin(), layer.end());
    bufs.push_back({Role::wgrad, {LO}, true, true});
    for (size_t k : {size_t{2}, size_t{3}, size_t{4}, size_t{5}}) {
      bufs.push_back({Role::wgrad, layer[k].shape, true, true});  // the adapters' gradients
    }
    if (trained) bufs.push_back({Role::wgrad, {LO, LI}, true, true});
    bufs.push_back({Role::act, {N, LI}});  // x, last
    cs.push_back({std::string("linear_backward (two adapters on row windows, bias, ") +
                      (trained ? "trained w)" : "frozen w)"),
                  bufs, [trained, lora_layer](D& d, const Ts& t) {
                    const nn::Linear l = lora_layer(t, trained ? t[13] : Tensor{}, t[8], t[9], t[10], t[11], t[12]);
                    nn::linear_backward(d, l, t[0], t[1], t.back());
                    return NAN;
                  }});
  }
  // dropout_rows (PEFT's lora_dropout), appended to keep the seeds above: odd rows (the
  // scalar path), rows of 8s (the vector path), in place, a misaligned view, a large row0.
  cs.push_back({"dropout_rows", {{Role::act, {N, C}, true}, {Role::act, {N, C}}}, [](D& d, const Ts& t) {
                  d.dropout_rows(t[0], t[1], 0.3, 0x5eed, 17);
                  return NAN;
                }});
  cs.push_back({"dropout_rows (rows of 8s)",
                {{Role::act, {N, CV}, true}, {Role::act, {N, CV}}},
                [](D& d, const Ts& t) {
                  d.dropout_rows(t[0], t[1], 0.45, 0xfeedface12345ull, int64_t{1} << 40);
                  return NAN;
                }});
  cs.push_back({"dropout_rows (in place)", {{Role::act, {N, CV}, true, true}}, [](D& d, const Ts& t) {
                  d.dropout_rows(t[0], t[0], 0.1, 3, 0);
                  return NAN;
                }});
  cs.push_back({"dropout_rows (misaligned)",
                {{Role::act, {N, CV}, true, false, -1, 1, 1}, {Role::act, {N, CV}, false, false, -1, 1, 3}},
                [](D& d, const Ts& t) {
                  d.dropout_rows(t[0], t[1], 0.7, 99, 5);
                  return NAN;
                }});
  // The LoRA layer with dropout on both adapters' input (each its own key, rows from global
  // row 40): forward with GELU, backward with w frozen.
  const auto with_dropout = [](nn::Linear l) {
    for (size_t k = 0; k < l.lora.size(); ++k) {
      l.lora[k].dropout = 0.25;
      l.lora[k].dropout_key = 1000 + k;
      l.lora[k].dropout_row0 = 40;
    }
    return l;
  };
  {
    std::vector<Buf> bufs = {{Role::act, {N, LO}, true}, {Role::act, {N, LI}}};
    bufs.insert(bufs.end(), layer.begin(), layer.end());
    bufs.push_back({Role::act, {N, LO}, true});  // pre
    cs.push_back({"linear_forward (two adapters with dropout, bias, GELU)", bufs,
                  [lora_layer, with_dropout](D& d, const Ts& t) {
                    nn::linear_forward(d, with_dropout(lora_layer(t, {}, {}, {}, {}, {}, {})), t[0], t[1], t[8]);
                    return NAN;
                  }});
  }
  {
    std::vector<Buf> bufs = {{Role::act, {N, LI}, true}, {Role::act, {N, LO}}};
    bufs.insert(bufs.end(), layer.begin(), layer.end());
    bufs.push_back({Role::wgrad, {LO}, true, true});
    for (size_t k : {size_t{2}, size_t{3}, size_t{4}, size_t{5}}) {
      bufs.push_back({Role::wgrad, layer[k].shape, true, true});
    }
    bufs.push_back({Role::act, {N, LI}});  // x, last
    cs.push_back({"linear_backward (two adapters with dropout, bias, frozen w)", bufs,
                  [lora_layer, with_dropout](D& d, const Ts& t) {
                    const nn::Linear l = with_dropout(lora_layer(t, Tensor{}, t[8], t[9], t[10], t[11], t[12]));
                    nn::linear_backward(d, l, t[0], t[1], t.back());
                    return NAN;
                  }});
  }
  return cs;
}

// adamw's tensors are f32 on every device: the oracle runs it in f32 too.
bool oracle_in_f32(const OpCase& c) {
  return c.name.rfind("adamw", 0) == 0;
}

// Runs the cases `only` accepts (all by default); seeds follow the full list either way.
void check_device(nn::Device& dev,
                  const std::function<bool(const std::string&)>& only = nullptr) {
  uint64_t seed = 1;
  for (const OpCase& c : all_cases()) {
    if (only && !only(c.name)) {
      seed += oracle_in_f32(c) ? 1 : 2;
      continue;
    }
    for (bool low : {false, true}) {
      if (oracle_in_f32(c)) {
        if (low) continue;
        nn::CpuDevice ref(size_t{1} << 30);
        nn::Rng rng(seed);
        std::vector<std::vector<double>> values;
        for (const Buf& b : c.bufs) {
          std::vector<double> v(static_cast<size_t>(nn::shape_numel(b.shape)));
          for (double& x : v) x = static_cast<float>(b.lo + (b.hi - b.lo) * rng.uniform());
          values.push_back(std::move(v));
        }
        const Result want = run_case(ref, c, values, false, false);
        const Result got = run_case(dev, c, values, false, false);
        for (size_t i = 0; i < c.bufs.size(); ++i) {
          if (!c.bufs[i].output) continue;
          BOOST_TEST(got.guard_ok[i],
                     "adamw on " << dev.name() << ": output " << i << " guard bytes changed");
          for (size_t k = 0; k < want.outputs[i].size(); ++k) {
            const double w = want.outputs[i][k], g = got.outputs[i][k];
            BOOST_TEST(std::abs(g - w) <= 1e-6 * (std::abs(w) + 1e-6),
                       "adamw on " << dev.name() << ": output " << i << "[" << k << "] " << g
                                   << " vs " << w);
          }
        }
        ++seed;
        continue;
      }
      check_case(dev, c, low, seed++);
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(cpu_device_ops_match_the_f64_oracle) {
  nn::CpuDevice dev(size_t{1} << 30);
  check_device(dev);
}

BOOST_AUTO_TEST_CASE(cuda_device_ops_match_the_cpu_device,
                     *boost::unit_test::precondition(test::CudaPresent{})) {
  auto dev = nn::make_cuda_device(size_t{1} << 30);
  check_device(*dev);
}

#ifdef FERRY_CUDA_EMULATION
// The emulation runs 64-thread blocks by default; a GPU build runs 256 (attention: 128),
// which changes the in-block summation orders and the column reductions' chunking. One
// case per kernel family at the GPU's sizes.
BOOST_AUTO_TEST_CASE(cuda_kernels_at_the_gpu_block_sizes) {
  struct Restore {
    ~Restore() { nn::cuda::set_emulated_block_threads(64, 64); }
  } restore;
  nn::cuda::set_emulated_block_threads(256, 128);
  const std::vector<std::string> names = {"gemm ta=1 tb=0 beta=1",
                                          "add_bias",
                                          "bias_backward (tall)",
                                          "add",
                                          "cast",
                                          "fill",
                                          "sum_squares",
                                          "embedding_forward",
                                          "embedding_backward (tall)",
                                          "layernorm_forward",
                                          "layernorm_backward (tall)",
                                          "rmsnorm_forward",
                                          "rmsnorm_backward (tall)",
                                          "layernorm_forward (rows of 8s)",
                                          "layernorm_backward (wide rows)",
                                          "rmsnorm_forward (wide rows)",
                                          "rmsnorm_backward (rows of 8s)",
                                          "layernorm_backward (warp rows)",
                                          "rmsnorm_forward (warp rows)",
                                          "add_bias (rows of 8s)",
                                          "swiglu_backward (rows of 8s)",
                                          "softmax_cross_entropy_forward (rows of 8s)",
                                          "softmax_cross_entropy_backward (rows of 8s)",
                                          "embedding_forward (rows of 8s)",
                                          "embedding_backward (rows of 8s, tall)",
                                          "linear_cross_entropy_forward (rows of 8s)",
                                          "linear_cross_entropy_backward (rows of 8s, ignored targets)",
                                          "rope_forward (in place)",
                                          "attention_forward kv_heads=1",
                                          "attention_backward kv_heads=1",
                                          "swiglu_backward",
                                          "rope_backward",
                                          "gelu_backward",
                                          "softmax_cross_entropy_forward",
                                          "softmax_cross_entropy_backward (ignored targets)",
                                          "dropout_rows",
                                          "dropout_rows (rows of 8s)",
                                          "adamw"};
  auto dev = nn::make_cuda_device(size_t{1} << 30);
  size_t ran = 0;
  check_device(*dev, [&](const std::string& name) {
    const bool in = std::find(names.begin(), names.end(), name) != names.end();
    ran += in;
    return in;
  });
  BOOST_TEST(ran == names.size());  // a renamed case must not drop out silently
  BOOST_CHECK_THROW(nn::cuda::set_emulated_block_threads(97, 128), std::invalid_argument);
}

// The attention kernels' shared memory depends on the head size alone: a head above 256
// channels is refused before anything is launched, naming it; any T is accepted (no
// shared-memory limit on T remains: contexts of 60,000 tokens pass the same check).
BOOST_AUTO_TEST_CASE(attention_refuses_only_heads_above_its_limit) {
  auto dev = nn::make_cuda_device(size_t{1} << 20);  // the emulated GPU exists
  const nn::cuda::Arr none{nullptr, DType::f32};
  auto names_head = [](const std::invalid_argument& e) {
    BOOST_TEST_MESSAGE(e.what());
    return std::string(e.what()).find("head size 320") != std::string::npos;
  };
  // C = 320 with one head: hs = 320. Null arrays: nothing may touch them.
  BOOST_CHECK_EXCEPTION(nn::cuda::attention_forward(nullptr, none, none, none, 1, 60000, 320, 1, 1, nullptr),
                        std::invalid_argument, names_head);
  BOOST_CHECK_EXCEPTION(nn::cuda::attention_backward(nullptr, none, none, none, none, none, 1, 60000, 320, 1, 1,
                                                     nullptr, nullptr),
                        std::invalid_argument, names_head);
}
#endif

// Without a GPU the cuda device must say so, not crash or pretend.
BOOST_AUTO_TEST_CASE(cuda_device_reports_why_it_is_unavailable) {
  const nn::CudaStatus s = nn::cuda_status();
  if (s.available()) {
    BOOST_TEST(s.gpus > 0);
    return;
  }
  BOOST_TEST(!s.reason.empty());
  try {
    nn::make_cuda_device(size_t{1} << 20);
    BOOST_FAIL("make_cuda_device succeeded without a GPU");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(std::string(e.what()).find(s.reason) != std::string::npos, e.what());
  }
}

// Values that depend on data, not shapes, are checked on every device: a token outside
// the vocabulary is an error naming it, not a wild read.
BOOST_AUTO_TEST_CASE(out_of_vocabulary_ids_are_reported) {
  std::vector<std::unique_ptr<nn::Device>> devs;
  devs.push_back(std::make_unique<nn::CpuDevice>(size_t{1} << 24));
  if (nn::cuda_status().available()) devs.push_back(nn::make_cuda_device(size_t{1} << 24));
  for (auto& d : devs) {
    const Tensor out = Tensor::empty(*d, DType::f32, {4, 3});
    const Tensor ids = Tensor::empty(*d, DType::i32, {4});
    const Tensor wte = Tensor::empty(*d, DType::f32, {5, 3});
    const Tensor wpe = Tensor::empty(*d, DType::f32, {2, 3});
    const int32_t host[4] = {0, 4, 9, 1};
    d->copy_from_host(ids, host);
    d->fill(wte, 1);
    d->fill(wpe, 1);
    // The CPU device throws at once; the cuda device records the error on the device and
    // throws it at the next check, host read or synchronisation (review F7), once.
    auto names_token = [](const std::out_of_range& e) {
      return std::string(e.what()).find("token 9 at position 2") != std::string::npos;
    };
    BOOST_CHECK_EXCEPTION((d->embedding_forward(out, ids, wte, wpe, 2), d->check_errors()), std::out_of_range,
                          names_token);
    BOOST_CHECK_NO_THROW(d->check_errors());
    if (d->kind() == nn::DeviceKind::cpu) continue;
    d->embedding_forward(out, ids, wte, wpe, 2);
    float back[12];
    BOOST_CHECK_EXCEPTION(d->copy_to_host(back, out), std::out_of_range, names_token);
    const Tensor logits = Tensor::empty(*d, DType::f32, {4, 5}), probs = Tensor::empty(*d, DType::f32, {4, 5}),
                 losses = Tensor::empty(*d, DType::f32, {4});
    d->fill(logits, 0.5);
    d->softmax_cross_entropy_forward(losses, probs, logits, ids);  // target 9 of 5 classes
    BOOST_CHECK_EXCEPTION(d->synchronize(), std::out_of_range, [](const std::out_of_range& e) {
      return std::string(e.what()).find("target 9 at row 2 is outside [0, 5)") != std::string::npos;
    });
  }
}

namespace {

// The log-sum-exp of each row's scaled scores, f64: lse[b, h, i] over the keys row i sees
// (causal, from its document's start when starts is not null).
std::vector<double> reference_lse(const std::vector<double>& qkv, const int32_t* starts, int64_t B, int64_t T,
                                  int64_t NH, int64_t KVH, int64_t hs) {
  const int64_t W = (NH + 2 * KVH) * hs;
  std::vector<double> lse(static_cast<size_t>(B * NH * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t kv = h / (NH / KVH), j0 = starts ? starts[b * T + i] : 0;
        double mx = -INFINITY;
        std::vector<double> sc;
        for (int64_t j = j0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hs; ++d)
            dot += qkv[static_cast<size_t>((b * T + i) * W + h * hs + d)] *
                   qkv[static_cast<size_t>((b * T + j) * W + (NH + kv) * hs + d)];
          sc.push_back(dot / std::sqrt(static_cast<double>(hs)));
          mx = std::max(mx, sc.back());
        }
        double sum = 0;
        for (double x : sc) sum += std::exp(x - mx);
        lse[static_cast<size_t>((b * NH + h) * T + i)] = mx + std::log(sum);
      }
  return lse;
}

float round_f32(double v) {
  return static_cast<float>(v);
}
float round_bf16(double v) {
  return nn::bf16_to_f32(nn::f32_to_bf16(static_cast<float>(v)));
}

struct AttentionShape {
  int64_t B, T, NH, KVH, hs;
  bool docs;
  int64_t W() const { return (NH + 2 * KVH) * hs; }
  int64_t C() const { return NH * hs; }
};

// Random inputs, already rounded to the dtype under test (`round`), and the f64 reference
// of the quadratic kernels ferry ran before the flash ones (testing/reference_attention.h).
// Documents: a new one starts at random positions (about one in doc_every) and at 64 and 65
// where there are that many (a boundary at a CPU tile's edge and one past it).
struct AttentionCase {
  AttentionShape sh;
  std::vector<double> qkv, dout, dq0, want_out, want_lse, want_dq;
  std::vector<int32_t> starts;
  const int32_t* docs() const { return sh.docs ? starts.data() : nullptr; }
};

AttentionCase attention_case(const AttentionShape& sh, uint64_t seed, uint64_t doc_every, float (*round)(double)) {
  const int64_t B = sh.B, T = sh.T, NH = sh.NH, KVH = sh.KVH;
  AttentionCase c{sh, {}, {}, {}, {}, {}, {}, std::vector<int32_t>(static_cast<size_t>(B * T), 0)};
  nn::Rng rng(seed);
  c.qkv.resize(static_cast<size_t>(B * T * sh.W()));
  c.dout.resize(static_cast<size_t>(B * T * sh.C()));
  c.dq0.resize(c.qkv.size());
  for (double& v : c.qkv) v = round(2 * rng.normal());
  for (double& v : c.dout) v = round(rng.normal());
  for (double& v : c.dq0) v = round(rng.normal());
  for (int64_t b = 0; sh.docs && b < B; ++b) {
    int32_t cur = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (t > 0 && (rng.below(doc_every) == 0 || t == 64 || t == 65)) cur = static_cast<int32_t>(t);
      c.starts[static_cast<size_t>(b * T + t)] = cur;
    }
  }
  std::vector<double> att(static_cast<size_t>(B * NH * T * T));
  c.want_out.resize(c.dout.size());
  c.want_dq = c.dq0;
  testing::reference::attention_forward<double>(c.want_out.data(), att.data(), c.qkv.data(), B, T, sh.C(), NH, KVH,
                                                c.docs());
  testing::reference::attention_backward<double>(c.want_dq.data(), c.dout.data(), c.qkv.data(), att.data(), B, T,
                                                 sh.C(), NH, KVH);
  c.want_lse = reference_lse(c.qkv, c.docs(), B, T, NH, KVH, sh.hs);
  return c;
}

float round_f16(double v) {
  return nn::f16_to_f32(nn::f32_to_f16(static_cast<float>(v)));
}

Tensor upload(nn::Device& d, DType t, const std::vector<double>& v, nn::Shape shape) {
  const Tensor x = Tensor::empty(d, t, shape);
  if (t == DType::bf16 || t == DType::f16) {
    std::vector<uint16_t> bits(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      bits[i] = t == DType::bf16 ? nn::f32_to_bf16(static_cast<float>(v[i])) : nn::f32_to_f16(static_cast<float>(v[i]));
    d.copy_from_host(x, bits.data());
  } else {
    const std::vector<float> f(v.begin(), v.end());
    d.copy_from_host(x, f.data());
  }
  return x;
}

std::vector<float> download(nn::Device& d, const Tensor& t) {
  std::vector<float> got(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::bf16 || t.dtype() == DType::f16) {
    std::vector<uint16_t> bits(got.size());
    d.copy_to_host(bits.data(), t);
    for (size_t i = 0; i < got.size(); ++i)
      got[i] = t.dtype() == DType::bf16 ? nn::bf16_to_f32(bits[i]) : nn::f16_to_f32(bits[i]);
  } else {
    d.copy_to_host(got.data(), t);
  }
  return got;
}

// What check_attention allows. Outputs and gradients are stored in the activation dtype,
// which rounds each by up to half an ulp (`stored`, relative to the value: 2^-8 for bf16,
// 2^-11 for f16, 2^-24 for f32); what the kernel adds beyond that must stay under `out`
// of the largest reference output, and `grad` of the largest gradient (dqkv's reference less the
// random values it was added into). lse is f32 everywhere: absolute `lse`.
struct AttentionTolerance {
  double stored, out, grad, lse;
};

// Runs d's attention forward, then backward into dq0, with activations of dtype `act` (lse
// f32), and checks out, lse and dqkv against the reference (every value finite; the worst
// errors printed, with `who`).
void check_attention(nn::Device& d, DType act, const AttentionCase& c, const AttentionTolerance& tol,
                     const std::string& who) {
  const AttentionShape& sh = c.sh;
  const Tensor q = upload(d, act, c.qkv, {sh.B, sh.T, sh.W()}), g = upload(d, act, c.dout, {sh.B, sh.T, sh.C()});
  const Tensor dq = upload(d, act, c.dq0, {sh.B, sh.T, sh.W()});
  const Tensor o = Tensor::empty(d, act, {sh.B, sh.T, sh.C()}), lse = Tensor::empty(d, DType::f32, {sh.B, sh.NH, sh.T});
  Tensor docs;
  if (sh.docs) {
    docs = Tensor::empty(d, DType::i32, {sh.B * sh.T});
    d.copy_from_host(docs, c.starts.data());
  }
  d.attention_forward(o, lse, q, sh.NH, sh.KVH, docs);
  d.attention_backward(dq, g, q, o, lse, sh.NH, sh.KVH, docs);
  // The worst excess of |got - want| over the storage rounding, relative to `scale`
  // (absolute where scale is 0).
  auto worst = [&](const char* what, const std::vector<float>& got, const std::vector<double>& want, double stored,
                   double scale) {
    double w = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      BOOST_TEST_REQUIRE(std::isfinite(got[i]), what << "[" << i << "] is " << got[i]);
      const double excess = std::max(0.0, std::abs(got[i] - want[i]) - stored * std::abs(want[i]));
      w = std::max(w, scale > 0 ? excess / scale : excess);
    }
    BOOST_TEST_MESSAGE(who << " T=" << sh.T << " hs=" << sh.hs << " " << what << ": worst error " << w);
    return w;
  };
  double out_scale = 0, grad_scale = 0;
  for (double v : c.want_out) out_scale = std::max(out_scale, std::abs(v));
  for (size_t i = 0; i < c.want_dq.size(); ++i) grad_scale = std::max(grad_scale, std::abs(c.want_dq[i] - c.dq0[i]));
  const double e_out = worst("out", download(d, o), c.want_out, tol.stored, out_scale);
  const double e_lse = worst("lse", download(d, lse), c.want_lse, 0, 0);
  const double e_dq = worst("dqkv", download(d, dq), c.want_dq, tol.stored, grad_scale);
  BOOST_TEST(e_out < tol.out, "out: worst error " << e_out << " of the largest output");
  BOOST_TEST(e_lse < tol.lse, "lse: worst absolute error " << e_lse);
  BOOST_TEST(e_dq < tol.grad, "dqkv: worst error " << e_dq << " of the largest gradient");
}

std::string describe(const AttentionShape& sh) {
  return "B=" + std::to_string(sh.B) + " T=" + std::to_string(sh.T) + " NH=" + std::to_string(sh.NH) +
         " KVH=" + std::to_string(sh.KVH) + " hs=" + std::to_string(sh.hs) + (sh.docs ? " documents" : "");
}

}  // namespace

// The flash kernels of every device against the quadratic kernels ferry ran before them
// (testing/reference_attention.h, in f64): outputs, log-sum-exps and gradients (added into
// random dqkv), causal, grouped-query heads, odd head sizes, T of one position, T not a
// multiple of any tile, several tiles, and packed documents whose boundaries fall inside
// and across tiles. f32 within 2e-5 of (|want| + max|want|).
BOOST_AUTO_TEST_CASE(flash_attention_matches_the_reference_kernels) {
  const AttentionShape shapes[] = {{1, 1, 1, 1, 1, false},   {2, 37, 3, 1, 5, false}, {2, 150, 4, 2, 16, false},
                                   {2, 150, 4, 2, 16, true}, {1, 70, 2, 2, 72, true}, {1, 33, 2, 1, 33, true}};
  std::vector<std::unique_ptr<nn::Device>> devs;
  devs.push_back(std::make_unique<nn::CpuDevice>(size_t{1} << 28));
  if (nn::cuda_status().available()) devs.push_back(nn::make_cuda_device(size_t{1} << 28));
  for (const AttentionShape& sh : shapes) {
    const AttentionCase c = attention_case(sh, static_cast<uint64_t>(sh.T * 131 + sh.hs), 23, round_f32);
    for (auto& d : devs) {
      BOOST_TEST_CONTEXT(d->name() << " " << describe(sh)) {
        check_attention(*d, DType::f32, c, {std::ldexp(1.0, -24), 2e-5, 2e-5, 1e-5}, d->name());
      }
    }
  }
}

// Packed documents: with doc_start, each document of a row attends only within itself, so
// its outputs are those of the document alone in a row of its own (checked on every
// device, grouped-query heads, against the CPU f64 run of the separate document), and
// attention_backward's gradients agree across devices. A start outside [0, t] is refused.
BOOST_AUTO_TEST_CASE(packed_documents_attend_only_within_themselves) {
  constexpr int64_t B = 2, T = 9, NH = 4, KVH = 2, hs = 3, W = (NH + 2 * KVH) * hs, C = NH * hs;
  // Row 0: documents [0, 4) and [4, 9); row 1: [0, 2), [2, 3), [3, 9).
  const std::vector<int32_t> starts = {0, 0, 0, 0, 4, 4, 4, 4, 4, 0, 0, 2, 3, 3, 3, 3, 3, 3};
  std::vector<double> qkv(static_cast<size_t>(B * T * W));
  nn::Rng rng(11);
  for (double& v : qkv) v = rng.normal();
  nn::CpuDevice oracle(size_t{1} << 26);
  // The reference: every document alone, f64.
  std::vector<double> want(static_cast<size_t>(B * T * C));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t0 = 0; t0 < T;) {
      int64_t t1 = t0 + 1;
      while (t1 < T && starts[static_cast<size_t>(b * T + t1)] == t0) ++t1;
      const int64_t L = t1 - t0;
      const Tensor q = Tensor::empty(oracle, DType::f64, {1, L, W}), o = Tensor::empty(oracle, DType::f64, {1, L, C});
      const Tensor a = Tensor::empty(oracle, DType::f64, {1, NH, L});
      oracle.copy_from_host(q, qkv.data() + (b * T + t0) * W);
      oracle.attention_forward(o, a, q, NH, KVH);
      oracle.copy_to_host(want.data() + (b * T + t0) * C, o);
      t0 = t1;
    }
  }
  std::vector<std::unique_ptr<nn::Device>> devs;
  devs.push_back(std::make_unique<nn::CpuDevice>(size_t{1} << 26));
  if (nn::cuda_status().available()) devs.push_back(nn::make_cuda_device(size_t{1} << 26));
  std::vector<std::vector<float>> grads;
  std::vector<float> g(static_cast<size_t>(B * T * C));
  for (float& v : g) v = static_cast<float>(rng.normal());
  for (auto& d : devs) {
    BOOST_TEST_CONTEXT(d->name()) {
      const Tensor q = Tensor::empty(*d, DType::f32, {B, T, W}), o = Tensor::empty(*d, DType::f32, {B, T, C});
      const Tensor a = Tensor::empty(*d, DType::f32, {B, NH, T}), ds = Tensor::empty(*d, DType::i32, {B * T});
      const std::vector<float> q32(qkv.begin(), qkv.end());
      d->copy_from_host(q, q32.data());
      d->copy_from_host(ds, starts.data());
      d->attention_forward(o, a, q, NH, KVH, ds);
      std::vector<float> got(static_cast<size_t>(B * T * C));
      d->copy_to_host(got.data(), o);
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
      BOOST_TEST(worst < 1e-5);
      const Tensor dout = Tensor::empty(*d, DType::f32, {B, T, C}), dq = Tensor::empty(*d, DType::f32, {B, T, W});
      d->copy_from_host(dout, g.data());
      d->fill(dq, 0.0);
      d->attention_backward(dq, dout, q, o, a, NH, KVH, ds);
      grads.emplace_back(static_cast<size_t>(B * T * W));
      d->copy_to_host(grads.back().data(), dq);
      const std::vector<int32_t> bad = {0, 0, 0, 0, 4, 4, 4, 4, 9, 0, 0, 2, 3, 3, 3, 3, 3, 3};  // 9 > 8
      d->copy_from_host(ds, bad.data());
      if (d->host_accessible()) {
        BOOST_CHECK_THROW(d->attention_forward(o, a, q, NH, KVH, ds), std::invalid_argument);
        BOOST_CHECK_THROW(d->attention_backward(dq, dout, q, o, a, NH, KVH, ds), std::invalid_argument);
      }
    }
  }
  for (size_t k = 1; k < grads.size(); ++k)
    for (size_t i = 0; i < grads[0].size(); ++i) BOOST_TEST(std::abs(grads[k][i] - grads[0][i]) < 1e-4);
}

#ifdef FERRY_CUDA_EMULATION
// Restores the emulated GPU (block sizes, opt-in shared memory) however a test ends.
struct RestoreEmulatedGpu {
  ~RestoreEmulatedGpu() {
    nn::cuda::set_emulated_block_threads(64, 64);
    ferry_emu::shared_optin = ferry_emu::Emulator::kSharedOptin;
    ferry_emu::compute_major = 9;
  }
};
#endif

// Both attention kernels of the cuda device in bf16 and f16 (q, k, v, dO, outputs and dqkv
// in that dtype; f32 log-sum-exps), each chosen explicitly so that neither can stand in for
// the other, against the f64 reference computed from the same rounded inputs: beyond the
// rounding of what is stored, outputs within 4e-3 (f16: 1e-3) of the largest output,
// gradients (added into random dqkv) within 2e-2 (5e-3) of the largest gradient, lse within
// 1e-4 absolute. Head
// sizes 5 to 128 (the tensor cores' padding to 16 and their largest head; 16-byte and
// element-wise tile loads), T not a multiple of a tile, grouped-query heads, documents.
// Under the emulation the tensor-core case also runs at the GPU's 4 warps per block.
BOOST_AUTO_TEST_CASE(both_cuda_attention_kernels_match_the_reference_in_16_bits,
                     *boost::unit_test::precondition(test::CudaPresent{})) {
#ifdef FERRY_CUDA_EMULATION
  RestoreEmulatedGpu restore;
#endif
  const AttentionShape shapes[] = {{1, 1, 1, 1, 16, false}, {2, 37, 3, 1, 5, false}, {2, 150, 4, 2, 16, true},
                                   {1, 70, 2, 2, 72, true}, {1, 33, 2, 1, 33, true}, {1, 130, 2, 1, 128, false}};
  for (const DType act : {DType::bf16, DType::f16}) {
    // Measured on the emulation: bf16 out 6.7e-4 (tensor cores: probabilities rounded to
    // bf16 for P V; SIMT 6e-8), gradients 6.2e-3 (the bf16 output in D = rowsum(dO O));
    // f16 9.3e-5 and 1.2e-3; lse 2e-6 and 6e-6.
    const AttentionTolerance tol = act == DType::bf16 ? AttentionTolerance{std::ldexp(1.0, -8), 4e-3, 2e-2, 1e-4}
                                                      : AttentionTolerance{std::ldexp(1.0, -11), 1e-3, 5e-3, 1e-4};
    for (const nn::AttentionKernel kernel : {nn::AttentionKernel::simt, nn::AttentionKernel::tensor_cores}) {
      auto d = nn::make_cuda_device(size_t{1} << 28, 0, kernel);
      const std::string who = std::string(nn::dtype_name(act)) + " " + std::string(nn::attention_kernel_name(kernel));
      for (const AttentionShape& sh : shapes) {
        const AttentionCase c = attention_case(sh, static_cast<uint64_t>(sh.T * 7 + sh.hs), 19,
                                               act == DType::bf16 ? round_bf16 : round_f16);
        std::vector<int> block_threads = {64};
#ifdef FERRY_CUDA_EMULATION
        if (kernel == nn::AttentionKernel::tensor_cores && sh.T > 64) block_threads.push_back(128);
#endif
        for (const int threads : block_threads) {
#ifdef FERRY_CUDA_EMULATION
          nn::cuda::set_emulated_block_threads(64, threads);
#endif
          BOOST_TEST_CONTEXT(who << " " << threads << " threads " << describe(sh)) {
            check_attention(*d, act, c, tol, who);
          }
        }
      }
    }
  }
}

#ifdef FERRY_CUDA_EMULATION
// A tensor-core pass whose shared memory does not fit the GPU at 4 warps runs with fewer:
// the emulated GPU given an A100's opt-in limit (dK/dV at head size 128: 2 warps) and an
// RTX 4090's (1 warp), the results as on the H100.
BOOST_AUTO_TEST_CASE(tensor_core_passes_shrink_their_blocks_to_the_gpus_shared_memory) {
  RestoreEmulatedGpu restore;
  nn::cuda::set_emulated_block_threads(64, 128);
  const AttentionShape sh{1, 100, 2, 1, 128, true};
  const AttentionCase c = attention_case(sh, 5, 19, round_bf16);
  auto d = nn::make_cuda_device(size_t{1} << 28, 0, nn::AttentionKernel::tensor_cores);
  for (const size_t limit : {size_t{166912}, size_t{101376}}) {
    ferry_emu::shared_optin = limit;
    BOOST_TEST_CONTEXT("opt-in limit " << limit) {
      check_attention(*d, DType::bf16, c, {std::ldexp(1.0, -8), 4e-3, 2e-2, 1e-4}, "limit " + std::to_string(limit));
    }
  }
  ferry_emu::shared_optin = 48 * 1024;  // not even one warp of the dK/dV pass at head size 128
  std::string why;
  BOOST_TEST(nn::cuda_attention_kernel(*d, DType::bf16, 128, &why) == "simt");
  BOOST_TEST(why == "tensor cores need more shared memory per block than this GPU has");
}
#endif

// Tensor cores asked where they cannot run are refused naming what is missing, before
// anything is launched; automatic steps aside to the SIMT kernels there.
BOOST_AUTO_TEST_CASE(tensor_core_attention_is_refused_where_it_cannot_run,
                     *boost::unit_test::precondition(test::CudaPresent{})) {
  constexpr int64_t B = 1, T = 5, NH = 1, KVH = 1;
  auto refused = [](const std::string& needs) {
    return [needs](const std::invalid_argument& e) {
      BOOST_TEST_MESSAGE(e.what());
      const std::string m = e.what();
      return m.find("tensor_cores") != std::string::npos && m.find(needs) != std::string::npos;
    };
  };
  auto tc = nn::make_cuda_device(size_t{1} << 26, 0, nn::AttentionKernel::tensor_cores);
  auto automatic = nn::make_cuda_device(size_t{1} << 26, 0, nn::AttentionKernel::automatic);
  struct Case {
    DType act;
    int64_t hs;
    std::string needs;
  };
  const Case cases[] = {{DType::f32, 16, "bf16 or f16 activations"}, {DType::bf16, 136, "a head size of at most 128"}};
  for (const Case& c : cases) {
    const int64_t W = (NH + 2 * KVH) * c.hs, C = NH * c.hs;
    for (auto* d : {tc.get(), automatic.get()}) {
      const Tensor q = Tensor::empty(*d, c.act, {B, T, W}), o = Tensor::empty(*d, c.act, {B, T, C});
      const Tensor lse = Tensor::empty(*d, DType::f32, {B, NH, T}), g = Tensor::empty(*d, c.act, {B, T, C});
      const Tensor dq = Tensor::empty(*d, c.act, {B, T, W});
      d->fill(q, 0.5);
      d->fill(g, 1.0);
      d->fill(dq, 0.0);
      std::string why;
      BOOST_TEST(nn::cuda_attention_kernel(*d, c.act, c.hs, &why) == "simt");
      BOOST_TEST(why == "tensor cores need " + c.needs);
      if (d == tc.get()) {
        BOOST_CHECK_EXCEPTION(d->attention_forward(o, lse, q, NH, KVH), std::invalid_argument, refused(c.needs));
        d->fill(o, 0.5);
        d->fill(lse, 0.0);
        BOOST_CHECK_EXCEPTION(d->attention_backward(dq, g, q, o, lse, NH, KVH), std::invalid_argument,
                              refused(c.needs));
      } else {
        d->attention_forward(o, lse, q, NH, KVH);  // the SIMT kernels: equal keys, the mean of equal values
        std::vector<float> got(static_cast<size_t>(B * T * C));
        if (c.act == DType::f32) {
          d->copy_to_host(got.data(), o);
          for (float v : got) BOOST_TEST(v == 0.5f);
        }
      }
    }
  }
  // auto prefers the register-resident mma kernels where they run (nn/attention_kernel.h).
  BOOST_TEST(nn::cuda_attention_kernel(*automatic, DType::bf16, 128) == "mma");
#ifdef FERRY_CUDA_EMULATION
  RestoreEmulatedGpu restore;
  ferry_emu::compute_major = 7;  // a V100: no bf16 tensor cores
  auto old_gpu = nn::make_cuda_device(size_t{1} << 26, 0, nn::AttentionKernel::automatic);
  std::string why;
  BOOST_TEST(nn::cuda_attention_kernel(*old_gpu, DType::bf16, 64, &why) == "simt");
  BOOST_TEST(why == "tensor cores need a GPU of compute capability 8.0 or above");
#endif
}

// The ops composed: a GPT's forward, backward and device AdamW steps on the cuda device
// follow the CPU device's (f32 within 1e-5 over 3 steps); bf16 within 1e-2; and the model
// computing on the cuda device through StagedUnits from CPU-resident units gives the CPU
// device's gradients.
BOOST_AUTO_TEST_CASE(gpt_steps_on_the_cuda_device_follow_the_cpu_device,
                     *boost::unit_test::precondition(test::CudaPresent{})) {
  const nn::GPTConfig cfg{2, 2, 32, 64, 16};
  const int64_t Bt = 2, Tt = 16, Nt = Bt * Tt;
  std::vector<int32_t> ids(static_cast<size_t>(2 * Nt));
  nn::Rng rng(11);
  for (auto& x : ids) x = static_cast<int32_t>(rng.below(64));
  struct Side {
    std::unique_ptr<nn::Device> dev;
    std::unique_ptr<nn::GPT> model;
    std::unique_ptr<nn::ResidentUnits> units;
    std::vector<Tensor> m, v;
    Tensor tokens, targets;
  };
  auto make = [&](std::unique_ptr<nn::Device> dev, DType dtype) {
    Side s;
    s.dev = std::move(dev);
    s.model = std::make_unique<nn::GPT>(cfg, *s.dev, dtype);
    s.units = std::make_unique<nn::ResidentUnits>(*s.dev, dtype, s.model->units());
    for (int u = 0; u < s.model->num_units(); ++u) {
      s.model->init_unit(u, s.units->weights[static_cast<size_t>(u)], 5);
      for (auto* mv : {&s.m, &s.v}) {
        mv->push_back(
            Tensor::empty(*s.dev, DType::f32, s.units->weights[static_cast<size_t>(u)].shape()));
        s.dev->fill(mv->back(), 0);
      }
    }
    s.tokens = Tensor::empty(*s.dev, DType::i32, {Nt});
    s.targets = Tensor::empty(*s.dev, DType::i32, {Nt});
    s.dev->copy_from_host(s.tokens, ids.data());
    s.dev->copy_from_host(s.targets, ids.data() + Nt);
    return s;
  };
  auto step = [&](Side& s, int64_t t, bool update) {
    s.units->zero_grads();
    const double loss = s.model->forward(*s.units, s.tokens, s.targets, Bt, Tt);
    s.model->backward(*s.units);
    for (int u = 0; update && u < s.model->num_units(); ++u) {
      const auto k = static_cast<size_t>(u);
      s.dev->adamw(s.units->weights[k], s.units->grads[k], s.m[k], s.v[k],
                   {t, 3e-3, 0.9, 0.95, 1e-8, 0.1, 1.0});
    }
    return loss;
  };
  Side cpu = make(std::make_unique<nn::CpuDevice>(size_t{256} << 20, 1), DType::f32);
  Side gpu = make(nn::make_cuda_device(size_t{256} << 20), DType::f32);
  for (int64_t t = 1; t <= 3; ++t) {
    const double lc = step(cpu, t, true), lg = step(gpu, t, true);
    BOOST_TEST(std::abs(lg - lc) <= 1e-5 * lc,
               "f32 step " << t << ": cuda " << lg << ", cpu " << lc);
    // The margin a real GPU leaves (review Q2): read from --log_level=message on the first GPU run.
    BOOST_TEST_MESSAGE("gpt f32 step " << t << ": relative loss gap " << std::abs(lg - lc) / lc << " (tolerance 1e-5)");
  }
  Side cpu16 = make(std::make_unique<nn::CpuDevice>(size_t{256} << 20, 1), DType::bf16);
  Side gpu16 = make(nn::make_cuda_device(size_t{256} << 20), DType::bf16);
  const double lc = step(cpu16, 1, false), lg = step(gpu16, 1, false);
  BOOST_TEST(std::abs(lg - lc) <= 1e-2 * lc, "bf16: cuda " << lg << ", cpu " << lc);

  // StagedUnits: units in host memory, compute on the cuda device.
  auto dev = nn::make_cuda_device(size_t{256} << 20);
  const test::StagedComparison r = test::compare_staged(*dev, 1, Bt, Tt, 5, 11);
  const double la = r.direct_losses[0], lb = r.staged_losses[0];
  BOOST_TEST(std::abs(la - lb) <= 1e-5 * la);
  for (size_t u = 0; u < r.direct_grads.size(); ++u) {
    const std::vector<float>&hx = r.direct_grads[u], &hy = r.staged_grads[u];
    double scale = 0, worst = 0;
    for (size_t i = 0; i < hx.size(); ++i)
      scale = std::max(scale, std::abs(static_cast<double>(hx[i])));
    for (size_t i = 0; i < hx.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(hx[i]) - hy[i]));
    BOOST_TEST(worst <= 1e-4 * scale,
               "unit " << u << ": gradients differ by " << worst << " (scale " << scale << ")");
  }
}

// ---- gemm_cols beyond the oracle ----------------------------------------------------------
// The cases above compare every device with the CPU device's gemm_cols in f64, which would
// share a mistake of its own: these check it against gemm and a host product, and that
// every device refuses the same bad windows.

namespace {

// The CPU device, and the cuda device where cuda_status() finds one (always under the
// emulation).
std::vector<std::unique_ptr<nn::Device>> devices_under_test() {
  std::vector<std::unique_ptr<nn::Device>> devs;
  devs.push_back(std::make_unique<nn::CpuDevice>(size_t{1} << 24));
  if (nn::cuda_status().available()) devs.push_back(nn::make_cuda_device(size_t{1} << 24));
  return devs;
}

std::vector<unsigned char> bytes_of(nn::Device& d, const Tensor& t) {
  std::vector<unsigned char> b(t.nbytes());
  d.copy_to_host(b.data(), t);
  return b;
}

// n values in [-1, 1), rounded to t (upload stores them exactly).
std::vector<double> draw(nn::Rng& rng, DType t, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = round_to(t, 2 * rng.uniform() - 1);
  return v;
}

// The operand dtypes gemm_cols takes: one dtype, or f32 c with 16-bit a and b.
struct GemmColsDtypes {
  DType c, ab;
  const char* name;
};
const GemmColsDtypes kGemmColsDtypes[] = {
    {DType::f32, DType::f32, "f32"}, {DType::bf16, DType::bf16, "bf16"}, {DType::f32, DType::bf16, "f32 c, bf16 a b"}};

}  // namespace

// A window of all the columns is gemm itself, bit for bit, on every device.
BOOST_AUTO_TEST_CASE(gemm_cols_over_all_columns_is_gemm) {
  const int64_t M = 13, Nn = 5, K = 9;
  nn::Rng rng(71);
  for (auto& dev : devices_under_test()) {
    nn::Device& d = *dev;
    for (const GemmColsDtypes& dt : kGemmColsDtypes) {
      for (int ta = 0; ta < 2; ++ta) {
        for (int tb = 0; tb < 2; ++tb) {
          for (double beta : {0.0, 0.5}) {
            const Tensor a = upload(d, dt.ab, draw(rng, dt.ab, M * K), ta ? nn::Shape{K, M} : nn::Shape{M, K});
            const Tensor b = upload(d, dt.ab, draw(rng, dt.ab, K * Nn), tb ? nn::Shape{Nn, K} : nn::Shape{K, Nn});
            const std::vector<double> c0 = draw(rng, dt.c, M * Nn);
            const Tensor by_gemm = upload(d, dt.c, c0, {M, Nn}), by_cols = upload(d, dt.c, c0, {M, Nn});
            d.gemm(by_gemm, a, ta, b, tb, 0.75, beta);
            d.gemm_cols(by_cols, 0, Nn, a, 0, ta ? M : K, ta, b, tb, 0.75, beta);
            BOOST_TEST((bytes_of(d, by_cols) == bytes_of(d, by_gemm)),
                       d.name() << " " << dt.name << " ta=" << ta << " tb=" << tb << " beta=" << beta
                                << ": gemm_cols over all columns differs from gemm");
          }
        }
      }
    }
  }
}

// c [13, 12] columns [4, 9) = -1.25 op(a's columns) op(b) + 0.5 c against a product in
// double on the host from the same rounded inputs, and c's other columns unchanged, bit
// for bit (a bf16 c included: the CPU device widens whole rows and rounds them back).
BOOST_AUTO_TEST_CASE(gemm_cols_matches_a_host_product_and_leaves_the_other_columns) {
  const int64_t M = 13, Nn = 5, K = 9, CW = 12, c_col = 4;
  nn::Rng rng(72);
  for (auto& dev : devices_under_test()) {
    nn::Device& d = *dev;
    for (const GemmColsDtypes& dt : kGemmColsDtypes) {
      for (int ta = 0; ta < 2; ++ta) {
        for (int tb = 0; tb < 2; ++tb) {
          const int64_t AW = ta ? 17 : 16, a_col = ta ? 3 : 6, a_rows = ta ? K : M;
          const std::vector<double> av = draw(rng, dt.ab, a_rows * AW), bv = draw(rng, dt.ab, K * Nn),
                                    c0 = draw(rng, dt.c, M * CW);
          const Tensor a = upload(d, dt.ab, av, {a_rows, AW}), c = upload(d, dt.c, c0, {M, CW});
          const Tensor b = upload(d, dt.ab, bv, tb ? nn::Shape{Nn, K} : nn::Shape{K, Nn});
          d.gemm_cols(c, c_col, Nn, a, a_col, ta ? M : K, ta, b, tb, -1.25, 0.5);
          const std::vector<float> got = download(d, c);
          std::vector<double> want(static_cast<size_t>(M * Nn));
          double scale = 0;
          for (int64_t i = 0; i < M; ++i) {
            for (int64_t j = 0; j < Nn; ++j) {
              double s = 0;
              for (int64_t l = 0; l < K; ++l) {
                const double x = av[static_cast<size_t>(ta ? l * AW + a_col + i : i * AW + a_col + l)];
                s += x * (tb ? bv[static_cast<size_t>(j * K + l)] : bv[static_cast<size_t>(l * Nn + j)]);
              }
              double& w = want[static_cast<size_t>(i * Nn + j)];
              w = -1.25 * s + 0.5 * c0[static_cast<size_t>(i * CW + c_col + j)];
              scale = std::max(scale, std::abs(w));
            }
          }
          const double tol = dt.c == DType::bf16 ? 1e-2 : 1e-5;
          size_t bad = 0, moved = 0;
          for (int64_t i = 0; i < M; ++i) {
            for (int64_t j = 0; j < CW; ++j) {
              const double g = got[static_cast<size_t>(i * CW + j)];
              if (j < c_col || j >= c_col + Nn) {
                moved += g != c0[static_cast<size_t>(i * CW + j)];
              } else {
                const double w = want[static_cast<size_t>(i * Nn + j - c_col)];
                bad += !(std::abs(g - w) <= tol * (std::abs(w) + scale));
              }
            }
          }
          const std::string where =
              d.name() + " " + dt.name + " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb);
          BOOST_TEST(bad == 0u, where << ": " << bad << " elements of the window off by more than " << tol);
          BOOST_TEST(moved == 0u, where << ": " << moved << " elements outside the window changed");
        }
      }
    }
  }
}

// Windows past either edge of c or a, and shapes that do not chain, are programmer errors:
// std::invalid_argument naming the op, on every device and in both dtypes, before anything
// is written.
BOOST_AUTO_TEST_CASE(gemm_cols_refuses_bad_windows) {
  auto names_op = [](const std::invalid_argument& e) {
    BOOST_TEST_MESSAGE(e.what());
    return std::string(e.what()).find("gemm_cols") != std::string::npos;
  };
  nn::Rng rng(73);
  for (auto& dev : devices_under_test()) {
    nn::Device& d = *dev;
    for (DType t : {DType::f32, DType::bf16}) {
      // c [5, 8] columns [2, 5) = a [5, 10] columns [1, 5) @ b [4, 3] is the valid call.
      const Tensor c = upload(d, t, draw(rng, t, 40), {5, 8}), a = upload(d, t, draw(rng, t, 50), {5, 10});
      const Tensor b = upload(d, t, draw(rng, t, 12), {4, 3}), c6 = upload(d, t, draw(rng, t, 48), {6, 8});
      const Tensor flat = upload(d, t, draw(rng, t, 40), {40});
      const std::vector<unsigned char> before = bytes_of(d, c);
      const std::vector<std::pair<const char*, std::function<void()>>> bad = {
          {"c's window past its last column", [&] { d.gemm_cols(c, 6, 3, a, 1, 4, false, b, false, 1, 1); }},
          {"c's window before its first column", [&] { d.gemm_cols(c, -1, 3, a, 1, 4, false, b, false, 1, 1); }},
          {"c's window of negative width", [&] { d.gemm_cols(c, 5, -3, a, 1, 4, false, b, false, 1, 1); }},
          {"a's window past its last column", [&] { d.gemm_cols(c, 2, 3, a, 7, 4, false, b, false, 1, 1); }},
          {"a's window before its first column", [&] { d.gemm_cols(c, 2, 3, a, -2, 4, false, b, false, 1, 1); }},
          {"a's window transposed past its last column", [&] { d.gemm_cols(c, 2, 3, a, 6, 5, true, b, false, 1, 1); }},
          {"a's window not b's rows", [&] { d.gemm_cols(c, 2, 3, a, 1, 3, false, b, false, 1, 1); }},
          {"c's window not b's columns", [&] { d.gemm_cols(c, 2, 2, a, 1, 4, false, b, false, 1, 1); }},
          {"b transposed", [&] { d.gemm_cols(c, 2, 3, a, 1, 4, false, b, true, 1, 1); }},
          {"c's rows not a's", [&] { d.gemm_cols(c6, 2, 3, a, 1, 4, false, b, false, 1, 1); }},
          {"a 1-D c", [&] { d.gemm_cols(flat, 2, 3, a, 1, 4, false, b, false, 1, 1); }}};
      for (const auto& [what, call] : bad) {
        BOOST_TEST_CONTEXT(d.name() << " " << nn::dtype_name(t) << ": " << what) {
          BOOST_CHECK_EXCEPTION(call(), std::invalid_argument, names_op);
        }
      }
      BOOST_TEST((bytes_of(d, c) == before), d.name() << " " << nn::dtype_name(t) << ": a refused call wrote c");
      BOOST_CHECK_NO_THROW(d.gemm_cols(c, 2, 3, a, 1, 4, false, b, false, 1, 1));
      BOOST_TEST((bytes_of(d, c) != before), d.name() << " " << nn::dtype_name(t) << ": the valid call wrote nothing");
    }
  }
}

// ---- dropout_rows beyond the oracle ------------------------------------------------------
// The cases above compare each device with the CPU device in f64 within a tolerance; a mask
// must be equal bit for bit (backward recomputes forward's, resumed and resharded runs
// recompute a step's), and must be a fair coin: these check both.

namespace {

const DType kDropoutDtypes[] = {DType::f32, DType::bf16, DType::f16, DType::f64};

// What dropout_rows must write, bit for bit, from nn/dropout_mask.h: the product in f32
// (f64 for f64), rounded once to t; +0 where dropped.
std::vector<unsigned char> dropout_reference(DType t, const std::vector<double>& in, int64_t N, int64_t C, double p,
                                             uint64_t key, int64_t row0) {
  const size_t es = nn::dtype_size(t);
  std::vector<unsigned char> out(static_cast<size_t>(N * C) * es);
  const uint64_t threshold = nn::dropout_threshold(p);
  const double scale = nn::dropout_scale(p);
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < C; ++j) {
      const size_t k = static_cast<size_t>(i * C + j);
      double v = 0;
      if (nn::dropout_keep(key, row0 + i, j, threshold)) {
        v = t == DType::f64 ? in[k] * scale
                            : static_cast<double>(static_cast<float>(in[k]) * static_cast<float>(scale));
      }
      encode(t, v, out.data() + k * es);
    }
  }
  return out;
}

// An [N, C] view starting `offset` elements into its allocation, holding `v`.
Tensor upload_at(nn::Device& d, DType t, const std::vector<double>& v, int64_t N, int64_t C, int64_t offset) {
  const size_t es = nn::dtype_size(t);
  const Tensor all = Tensor::empty(d, t, {offset + N * C});
  std::vector<unsigned char> bytes(static_cast<size_t>(offset + N * C) * es, 0);
  for (size_t k = 0; k < v.size(); ++k) encode(t, v[k], bytes.data() + (static_cast<size_t>(offset) + k) * es);
  d.copy_from_host(all, bytes.data());
  return all.view(offset, {N, C});
}

// The mask dropout_rows gives an [N, C] tensor of ones on the CPU device (1: kept).
std::vector<uint8_t> cpu_mask(int64_t N, int64_t C, double p, uint64_t key, int64_t row0) {
  nn::CpuDevice d(size_t{1} << 28);
  const Tensor x = Tensor::empty(d, DType::f32, {N, C});
  d.fill(x, 1.0);
  d.dropout_rows(x, x, p, key, row0);
  std::vector<uint8_t> m(static_cast<size_t>(N * C));
  for (int64_t k = 0; k < N * C; ++k) m[static_cast<size_t>(k)] = x.data_as<float>()[k] != 0.0f;
  return m;
}

double kept_fraction(const std::vector<uint8_t>& m) {
  double kept = 0;
  for (uint8_t b : m) kept += b;
  return kept / static_cast<double>(m.size());
}

}  // namespace

// Every device writes the reference's bytes: every dtype, odd rows (the scalar path), rows
// of 8s (the vector path), a view off the 16-byte boundary, several p, keys and row0, out
// of place and in place; p = 0 is a copy and, in place, leaves the bytes as they are.
BOOST_AUTO_TEST_CASE(dropout_rows_writes_the_same_bits_on_every_device) {
  struct Shape {
    int64_t N, C, offset;
  };
  const Shape shapes[] = {{37, 29, 0}, {16, 64, 0}, {9, 40, 3}, {1, 1, 0}};
  const double ps[] = {0.0, 0.1, 0.3, 0.9};
  const std::pair<uint64_t, int64_t> masks[] = {{1, 0}, {0xdeadbeefcafef00dull, 1000003}, {0, int64_t{1} << 40}};
  nn::Rng rng(81);
  size_t compared = 0;
  for (auto& dev : devices_under_test()) {
    nn::Device& d = *dev;
    for (const DType t : kDropoutDtypes) {
      for (const Shape& sh : shapes) {
        for (const double p : ps) {
          for (const auto& [key, row0] : masks) {
            BOOST_TEST_CONTEXT(d.name() << " " << nn::dtype_name(t) << " [" << sh.N << ", " << sh.C << "] offset "
                                        << sh.offset << " p " << p << " key " << key << " row0 " << row0) {
              const std::vector<double> v = draw(rng, t, sh.N * sh.C);
              const std::vector<unsigned char> want =
                  p == 0.0 ? bytes_of(d, upload_at(d, t, v, sh.N, sh.C, 0))
                           : dropout_reference(t, v, sh.N, sh.C, p, key, row0);
              const Tensor in = upload_at(d, t, v, sh.N, sh.C, sh.offset);
              const Tensor out = upload_at(d, t, std::vector<double>(v.size(), NAN), sh.N, sh.C, sh.offset);
              d.dropout_rows(out, in, p, key, row0);
              BOOST_TEST((bytes_of(d, out) == want), "out of place differs from the reference");
              BOOST_TEST((bytes_of(d, in) == bytes_of(d, upload_at(d, t, v, sh.N, sh.C, 0))), "in was written");
              d.dropout_rows(in, in, p, key, row0);
              BOOST_TEST((bytes_of(d, in) == want), "in place differs from the reference");
              ++compared;
            }
          }
        }
      }
    }
  }
  BOOST_TEST(compared == (nn::cuda_status().available() ? 2u : 1u) * 4u * 4u * 4u * 3u);
}

// The mask of element (row, col) depends on (key, row, col) alone: a tensor's rows split in
// two calls at row0 and row0 + N1 give the whole tensor's mask; a taller tensor's first rows
// and a wider one's first columns are the smaller one's; every device agrees.
BOOST_AUTO_TEST_CASE(dropout_masks_depend_on_the_global_position_alone) {
  const int64_t N = 24, C = 40, R = 1000;
  const uint64_t key = 0x1234;
  const double p = 0.4;
  for (auto& dev : devices_under_test()) {
    nn::Device& d = *dev;
    for (const DType t : {DType::f32, DType::bf16}) {
      BOOST_TEST_CONTEXT(d.name() << " " << nn::dtype_name(t)) {
        nn::Rng rng(82);
        const std::vector<double> v = draw(rng, t, (N + 8) * (C + 8));
        // x [N, C] is the top-left corner of wide [N + 8, C + 8]'s values.
        std::vector<double> x(static_cast<size_t>(N * C));
        for (int64_t i = 0; i < N; ++i)
          for (int64_t j = 0; j < C; ++j)
            x[static_cast<size_t>(i * C + j)] = v[static_cast<size_t>(i * (C + 8) + j)];
        const Tensor whole = upload(d, t, x, {N, C});
        d.dropout_rows(whole, whole, p, key, R);
        const std::vector<unsigned char> want = bytes_of(d, whole);
        for (const int64_t N1 : {int64_t{1}, N / 2, N - 5}) {
          const Tensor split = upload(d, t, x, {N, C});
          d.dropout_rows(split.view(0, {N1, C}), split.view(0, {N1, C}), p, key, R);
          d.dropout_rows(split.view(N1 * C, {N - N1, C}), split.view(N1 * C, {N - N1, C}), p, key, R + N1);
          BOOST_TEST((bytes_of(d, split) == want), "rows split at " << N1 << " differ from the whole");
        }
        const Tensor big = upload(d, t, v, {N + 8, C + 8});
        d.dropout_rows(big, big, p, key, R);
        const std::vector<float> got = download(d, big), small = download(d, whole);
        size_t differ = 0;
        for (int64_t i = 0; i < N; ++i)
          for (int64_t j = 0; j < C; ++j)
            differ += got[static_cast<size_t>(i * (C + 8) + j)] != small[static_cast<size_t>(i * C + j)];
        BOOST_TEST(differ == 0u, differ << " elements differ between [N, C] and the corner of [N + 8, C + 8]");
      }
    }
  }
  // Against the CPU device's, the cuda device's [N, C] at row0 = 0 and its halves (the
  // first test compared each with the reference; this is the brief's split, whole).
  const std::vector<uint8_t> m = cpu_mask(N, C, p, key, 0), top = cpu_mask(N / 2, C, p, key, 0),
                             bottom = cpu_mask(N / 2, C, p, key, N / 2);
  std::vector<uint8_t> halves = top;
  halves.insert(halves.end(), bottom.begin(), bottom.end());
  BOOST_TEST((halves == m));
}

// A fair coin per element: the kept fraction of a [1024, 1024] tensor is 1 - p within 5
// standard deviations, in every row parity and column parity, for neighbours in a row and in
// a column (P(both kept) = (1 - p)^2: no correlation between adjacent elements), and kept
// values are exactly x / (1 - p) as f32 rounds it. Other keys and other rows give other masks
// (agreement p^2 + (1 - p)^2, as independent coins).
BOOST_AUTO_TEST_CASE(dropout_keeps_a_fraction_one_minus_p_independently) {
  const int64_t N = 1024, C = 1024;
  for (const double p : {0.05, 0.3, 0.5, 0.9}) {
    BOOST_TEST_CONTEXT("p " << p) {
      const std::vector<uint8_t> m = cpu_mask(N, C, p, 7, 0);
      const double q = 1 - p, n = static_cast<double>(N * C);
      const double sd = std::sqrt(p * q / n);
      BOOST_TEST(std::abs(kept_fraction(m) - q) <= 5 * sd, "kept " << kept_fraction(m) << ", want " << q);
      double parity[2][2] = {{0, 0}, {0, 0}}, right = 0, below = 0;
      for (int64_t i = 0; i < N; ++i) {
        for (int64_t j = 0; j < C; ++j) {
          const uint8_t b = m[static_cast<size_t>(i * C + j)];
          parity[i % 2][j % 2] += b;
          if (j + 1 < C) right += b & m[static_cast<size_t>(i * C + j + 1)];
          if (i + 1 < N) below += b & m[static_cast<size_t>((i + 1) * C + j)];
        }
      }
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b)
          BOOST_TEST(std::abs(parity[a][b] / (n / 4) - q) <= 5 * sd * 2, "rows " << a << " cols " << b);
      const double pairs = static_cast<double>(N * (C - 1)), sd2 = std::sqrt(q * q * (1 - q * q) / pairs);
      BOOST_TEST(std::abs(right / pairs - q * q) <= 5 * sd2, "neighbours in a row kept together " << right / pairs);
      BOOST_TEST(std::abs(below / pairs - q * q) <= 5 * sd2, "neighbours in a column kept together " << below / pairs);
      const double agree_want = p * p + q * q, sd3 = std::sqrt(agree_want * (1 - agree_want) / n);
      for (const auto& [key, row0] : {std::pair<uint64_t, int64_t>{8, 0}, {7, 1}, {7 ^ (uint64_t{1} << 63), 0}}) {
        const std::vector<uint8_t> other = cpu_mask(N, C, p, key, row0);
        double agree = 0;
        for (size_t k = 0; k < m.size(); ++k) agree += m[k] == other[k];
        BOOST_TEST(std::abs(agree / n - agree_want) <= 5 * sd3,
                   "key " << key << " row0 " << row0 << ": masks agree on " << agree / n << " of the elements");
      }
    }
  }
  // The kept value: 1 / (1 - p) as f32 rounds the product.
  nn::CpuDevice d(size_t{1} << 24);
  const Tensor x = Tensor::empty(d, DType::f32, {4, 64});
  d.fill(x, 0.75);
  d.dropout_rows(x, x, 0.3, 1, 0);
  const float kept = 0.75f * static_cast<float>(1.0 / 0.7);
  size_t other = 0;
  for (int64_t k = 0; k < x.numel(); ++k) other += x.data_as<float>()[k] != 0.0f && x.data_as<float>()[k] != kept;
  BOOST_TEST(other == 0u);
}

// The mask's definition pinned (nn/dropout_mask.h): changing the hash changes every run's
// masks, so a resumed run would no longer continue the one it resumes. Values computed
// from the definition when it was written.
BOOST_AUTO_TEST_CASE(dropout_mask_definition_is_pinned) {
  BOOST_TEST(nn::dropout_threshold(0.5) == uint64_t{1} << 63);
  BOOST_TEST(nn::dropout_threshold(0.0) == 0u);
  BOOST_TEST(nn::dropout_threshold(0.25) == uint64_t{1} << 62);
  BOOST_TEST(nn::dropout_word(nn::dropout_row_hash(0, 0), 0) == 0xa706dd2f4d197e6full);
  BOOST_TEST(nn::dropout_word(nn::dropout_row_hash(42, 7), 3) == 0x51b7c3520ac7a93full);
  // Key 42, p 0.5, rows 0-1 of 32 columns: 1 kept, 0 dropped.
  const std::vector<uint8_t> m = cpu_mask(2, 32, 0.5, 42, 0);
  std::string bits;
  for (uint8_t b : m) bits += b ? '1' : '0';
  BOOST_TEST(bits == "0111101011111110101101101010010101110001110101101110101111000110");
}

// Bad calls are programmer errors on every device: std::invalid_argument naming the op,
// before anything is written.
BOOST_AUTO_TEST_CASE(dropout_rows_refuses_bad_calls) {
  auto names_op = [](const std::invalid_argument& e) {
    BOOST_TEST_MESSAGE(e.what());
    return std::string(e.what()).find("dropout_rows") != std::string::npos;
  };
  auto devs = devices_under_test();
  devs.push_back(std::make_unique<nn::CountingDevice>("counting", size_t{1} << 24, true));
  for (auto& dev : devs) {
    nn::Device& d = *dev;
    const bool values = d.name().find("counting") == std::string::npos;  // the counting device holds none
    nn::Rng rng(83);
    const Tensor x = upload(d, DType::f32, draw(rng, DType::f32, 40), {5, 8});
    const Tensor y = upload(d, DType::f32, draw(rng, DType::f32, 40), {5, 8});
    const Tensor y16 = upload(d, DType::bf16, draw(rng, DType::bf16, 40), {5, 8});
    const Tensor wide = upload(d, DType::f32, draw(rng, DType::f32, 48), {6, 8});
    const Tensor flat = upload(d, DType::f32, draw(rng, DType::f32, 40), {40});
    const Tensor ids = Tensor::empty(d, DType::i32, {5, 8});
    const Tensor pool = upload(d, DType::f32, draw(rng, DType::f32, 48), {48});
    const std::vector<unsigned char> before = bytes_of(d, y);
    const std::vector<std::pair<const char*, std::function<void()>>> bad = {
        {"p = 1", [&] { d.dropout_rows(y, x, 1.0, 1, 0); }},
        {"p < 0", [&] { d.dropout_rows(y, x, -0.1, 1, 0); }},
        {"p NaN", [&] { d.dropout_rows(y, x, NAN, 1, 0); }},
        {"row0 < 0", [&] { d.dropout_rows(y, x, 0.5, 1, -1); }},
        {"shapes differ", [&] { d.dropout_rows(wide, x, 0.5, 1, 0); }},
        {"dtypes differ", [&] { d.dropout_rows(y16, x, 0.5, 1, 0); }},
        {"1-D", [&] { d.dropout_rows(flat, flat, 0.5, 1, 0); }},
        {"i32", [&] { d.dropout_rows(ids, ids, 0.5, 1, 0); }},
        {"out overlaps in", [&] { d.dropout_rows(pool.view(0, {5, 8}), pool.view(8, {5, 8}), 0.5, 1, 0); }}};
    for (const auto& [what, call] : bad) {
      BOOST_TEST_CONTEXT(d.name() << ": " << what) { BOOST_CHECK_EXCEPTION(call(), std::invalid_argument, names_op); }
    }
    if (values) BOOST_TEST((bytes_of(d, y) == before), d.name() << ": a refused call wrote out");
    BOOST_CHECK_NO_THROW(d.dropout_rows(y, x, 0.5, 1, 0));
  }
}

#ifdef FERRY_CUDA_EMULATION
// The ledger (nn/op_ledger.h) declares dropout_rows's launches as the cuda device issues
// them: a LoRA layer with dropout forward and backward, and dropout_rows at p = 0 (a copy,
// or nothing in place), launch on the emulation exactly what the ledger device records.
BOOST_AUTO_TEST_CASE(dropout_launches_are_the_ledgers) {
  const int64_t N = 21, IN = 13, OUT = 23, R = 3;
  auto run = [&](nn::Device& d) {
    auto t = [&](DType dt, nn::Shape s) {
      const Tensor x = Tensor::empty(d, dt, std::move(s));
      d.fill(x, 0.5);
      return x;
    };
    const Tensor x = t(DType::bf16, {N, IN}), y = t(DType::bf16, {N, OUT}), dy = t(DType::bf16, {N, OUT});
    const Tensor dx = t(DType::bf16, {N, IN});
    nn::Linear l{t(DType::bf16, {OUT, IN}), t(DType::bf16, {OUT}), Tensor{}, t(DType::f32, {OUT}), {}};
    l.lora.push_back({t(DType::bf16, {R, IN}), t(DType::bf16, {11, R}), t(DType::f32, {R, IN}), t(DType::f32, {11, R}),
                      0, 11, 2.0, 0.2, 5, 40});
    l.lora.push_back({t(DType::bf16, {R, IN}), t(DType::bf16, {7, R}), t(DType::f32, {R, IN}), t(DType::f32, {7, R}),
                      16, 7, 0.5, 0.2, 6, 40});
    d.synchronize();
    return std::function<void()>([=, &d] {
      nn::linear_forward(d, l, y, x);
      nn::linear_backward(d, l, dx, dy, x);
      d.dropout_rows(dx, x, 0.0, 1, 0);   // a copy
      d.dropout_rows(dx, dx, 0.0, 1, 0);  // nothing
      d.synchronize();
    });
  };
  nn::LedgerDevice ledger("ledger", size_t{1} << 30);
  const auto on_ledger = run(ledger);
  const int64_t before = ledger.ledger().launches();
  on_ledger();
  const int64_t declared = ledger.ledger().launches() - before;

  auto dev = nn::make_cuda_device(size_t{1} << 28);
  auto& emu = ferry_emu::emu();
  const auto on_cuda = run(*dev);
  emu.set_record_order(true);
  (void)emu.take_order();
  on_cuda();
  std::string kinds;
  int64_t issued = 0;
  for (const auto& o : emu.take_order()) {
    if (o.what.empty() || o.what.rfind("cudaFree", 0) == 0 || o.what.rfind("cudaMalloc", 0) == 0) continue;
    ++issued;
    kinds += " " + o.what;
  }
  emu.set_record_order(false);
  BOOST_TEST(issued == declared, "the emulation issued" << kinds);
}
#endif
