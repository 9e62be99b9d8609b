// NF4 with double quantization (nn/nf4.h) against bitsandbytes 0.50.2, bit for bit, on the
// fixtures in tests/data/nf4/ (scripts/peft_fixtures/make_nf4_fixtures.py; formats in
// tests/data/peft/README.md section (h)):
// - the NF4 table and the 8-bit dynamic code equal bitsandbytes' tables;
// - for [60, 88], [7, 13] (odd) and [130, 140] (two nested blocks): packed bytes, float32
//   absmax, 8-bit absmax codes, nested absmax, offset, dequantized absmax and dequantized
//   values equal bitsandbytes', with and without double quantization, with the stored offset
//   and code and with ferry's own;
// - the rules no fixture value reaches (a value on a midpoint, the short block's division,
//   the 8-bit code's lookup table near a code midpoint) are pinned on constructed values;
// - a state read from the file dequantizes as bitsandbytes did, any range as the whole;
// - the round trip error stays within half the NF4 table's largest gap of each block's scale;
// - empty, tiny and all-zero tensors, and nonsense refused by name;
// - transformers' saved 4-bit Llama (llama3-nf4/): every quantized projection is ferry's
//   quantization of the base weight, with bitsandbytes' offset, and ferry's forward on the
//   dequantized weights gives the logits bitsandbytes' model gave.
#define BOOST_TEST_MODULE nf4
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "error_of.h"
#include "nn/cpu_device.h"
#include "nn/nf4.h"
#include "runtime/ckpt/safetensors.h"
#include "runtime/hf/hf_weights.h"
#include "runtime/train/trainer.h"
#include "test_util.h"

using namespace ferry;
using nlohmann::json;
namespace fs = std::filesystem;
using ferry::test::error_of;
using ferry::test::has;

namespace {

const std::string kNf4 = std::string(FERRY_SOURCE_DIR) + "/tests/data/nf4/";
const std::string kHf = std::string(FERRY_SOURCE_DIR) + "/tests/data/hf/";
const char* const kCases[] = {"w60x88", "w7x13", "w130x140"};

struct Raw {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<char> bytes;
};
using Tensors = std::map<std::string, Raw>;

// Every tensor of the .safetensors files given (a folder's weights, or one file).
Tensors read_tensors(const std::vector<std::string>& files) {
  Tensors out;
  for (const std::string& f : files) {
    runtime::SafetensorsReader r(f);
    for (const auto& e : r.entries()) out[e.name] = {e.dtype, e.shape, r.read(e)};
  }
  return out;
}

Tensors folder_weights(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (f.ends_with(".safetensors") && f != "expected.safetensors")
      files.push_back(e.path().string());
  }
  return read_tensors(files);
}

const Raw& at(const Tensors& t, const std::string& name) {
  const auto it = t.find(name);
  if (it == t.end()) throw std::runtime_error("fixture has no tensor " + name);
  return it->second;
}

std::vector<float> f32(const Tensors& t, const std::string& name) {
  const Raw& r = at(t, name);
  BOOST_REQUIRE_EQUAL(r.dtype, "F32");
  std::vector<float> v(r.bytes.size() / 4);
  std::memcpy(v.data(), r.bytes.data(), r.bytes.size());
  return v;
}

std::vector<uint8_t> u8(const Tensors& t, const std::string& name) {
  const Raw& r = at(t, name);
  BOOST_REQUIRE_EQUAL(r.dtype, "U8");
  return std::vector<uint8_t>(r.bytes.begin(), r.bytes.end());
}

// The first index where the two differ in any bit (or in length: the shorter's size); -1
// when they are the same bits.
template <class T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  return a.size() == b.size() ? -1 : static_cast<int64_t>(n);
}

uint32_t bits(float f) {
  return std::bit_cast<uint32_t>(f);
}

std::vector<float> dequantize(const nn::Nf4Tensor& q) {
  std::vector<float> out(static_cast<size_t>(q.numel));
  nn::nf4_dequantize(q, out.data());
  return out;
}

std::vector<float> block_scales(const nn::Nf4Tensor& q) {
  std::vector<float> s(static_cast<size_t>(q.blocks()));
  for (int64_t b = 0; b < q.blocks(); ++b) s[static_cast<size_t>(b)] = nn::nf4_block_scale(q, b);
  return s;
}

// A fixture case's state as bitsandbytes saved it (nothing recomputed).
nn::Nf4Tensor stored_state(const Tensors& t, const std::string& c, bool double_quant) {
  nn::Nf4Tensor q;
  q.numel = static_cast<int64_t>(f32(t, c + ".input").size());
  q.packed = u8(t, c + ".packed");
  q.double_quant = double_quant;
  if (double_quant) {
    q.absmax_code = u8(t, c + ".absmax");
    q.nested_absmax = f32(t, c + ".nested_absmax");
    q.offset = f32(t, c + ".offset").at(0);
    q.code = f32(t, c + ".nested_quant_map");
  } else {
    q.absmax = f32(t, c + ".plain.absmax");
  }
  nn::nf4_check(q);
  return q;
}

std::vector<float> normal_values(int64_t n, uint64_t seed, float sigma = 0.1f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(g);
  return v;
}

// Half the largest gap between neighbouring NF4 values: the most a value in [-1, 1] is
// from its nearest table value.
float half_max_gap() {
  float gap = 0;
  for (size_t i = 0; i + 1 < nn::kNf4Table.size(); ++i)
    gap = std::max(gap, nn::kNf4Table[i + 1] - nn::kNf4Table[i]);
  return gap / 2;
}

// Checks |w - x| <= scale error + absmax * half_max_gap() for every element, with the
// block's true absmax (max |x|) and its stored scale (equal without double quantization).
// Returns the largest |w - x| / bound seen.
double check_round_trip(const std::vector<float>& x, const nn::Nf4Tensor& q) {
  const std::vector<float> w = dequantize(q);
  const float half_gap = half_max_gap();
  double worst = 0;
  int64_t failures = 0;
  for (int64_t b = 0; b < q.blocks(); ++b) {
    const int64_t s = b * nn::kNf4BlockSize, e = std::min(q.numel, s + nn::kNf4BlockSize);
    double absmax = 0;
    for (int64_t i = s; i < e; ++i) absmax = std::max(absmax, std::abs(static_cast<double>(x[i])));
    const double scale = nn::nf4_block_scale(q, b);
    // |t s - x| <= |t| |s - absmax| + |t absmax - x|, |t| <= 1; plus a few float32 roundings.
    const double bound =
        std::abs(scale - absmax) + absmax * half_gap + 4e-7 * std::max(absmax, scale) + 1e-37;
    for (int64_t i = s; i < e; ++i) {
      const double err = std::abs(static_cast<double>(w[i]) - x[i]);
      worst = std::max(worst, err / bound);
      if (err > bound && ++failures <= 3)
        BOOST_ERROR("element " << i << ": |" << w[i] << " - " << x[i] << "| = " << err << " > "
                               << bound);
    }
  }
  BOOST_TEST(failures == 0);
  return worst;
}

json doc(const std::string& folder) {
  return {{"model", {{"init_from", folder}, {"block_size", 16}}},
          {"data", {{"path", std::string(FERRY_SOURCE_DIR) + "/tests/data/kjv-64k.txt"}}},
          {"device", {{"memory", "256MiB"}, {"threads", 1}}},
          {"train_micro_batch_size_per_gpu", 2},
          {"optimizer", {{"params", {{"lr", 0.001}}}}},
          {"train", {{"steps", 0}, {"eval_every", 0}, {"eval_batches", 1}, {"sample_tokens", 0}}}};
}

// The logits ferry's forward gives for `ids` [2, 16] with the weights of an HF folder.
std::vector<float> ferry_logits(const std::string& folder, const std::vector<int32_t>& ids) {
  nn::CpuDevice dev(size_t{256} << 20, 1);
  const runtime::Config c = runtime::config_from_json(doc(folder), "test.json", "", {}, 1);
  std::unique_ptr<nn::Model> model = runtime::make_model(c, dev);
  nn::ResidentUnits units(dev, nn::DType::f32, model->units());
  runtime::HfWeights w(c.init_from, c.resolved.at("model"), model->units());
  for (int u = 0; u < model->num_units(); ++u) {
    const nn::Tensor& t = units.weights[static_cast<size_t>(u)];
    w.fill(u, 0, t.numel(), t.data_as<float>());
  }
  const nn::Tensor tokens =
      nn::Tensor::empty(dev, nn::DType::i32, {static_cast<int64_t>(ids.size())});
  std::memcpy(tokens.data(), ids.data(), ids.size() * 4);
  model->forward(units, tokens, nn::Tensor{}, 2, 16);
  const nn::Tensor& logits = model->logits();
  return std::vector<float>(logits.data_as<float>(), logits.data_as<float>() + logits.numel());
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

// A quantized projection of llama3-nf4/model.safetensors: its stored state and the
// quant_state JSON transformers wrote beside it.
struct StoredLinear {
  std::string module;  // "model.layers.0.self_attn.q_proj"
  std::vector<int64_t> shape;
  nn::Nf4Tensor q;
};

std::vector<StoredLinear> stored_linears(const Tensors& t) {
  const std::string suffix = ".weight.quant_state.bitsandbytes__nf4";
  std::vector<StoredLinear> out;
  for (const auto& [name, raw] : t) {
    if (!name.ends_with(suffix)) continue;
    StoredLinear l;
    l.module = name.substr(0, name.size() - suffix.size());
    const json qs = json::parse(std::string(raw.bytes.begin(), raw.bytes.end()));
    BOOST_TEST_CONTEXT(l.module << ": " << qs.dump()) {
      BOOST_TEST(qs.at("quant_type") == "nf4");
      BOOST_TEST(qs.at("blocksize") == nn::kNf4BlockSize);
      BOOST_TEST(qs.at("nested_blocksize") == nn::kNf4NestedBlockSize);
      BOOST_TEST(qs.at("dtype") == "float32");
    }
    l.shape = qs.at("shape").get<std::vector<int64_t>>();
    const std::string w = l.module + ".weight";
    l.q.numel = l.shape.at(0) * l.shape.at(1);
    l.q.packed = u8(t, w);
    l.q.double_quant = true;
    l.q.absmax_code = u8(t, w + ".absmax");
    l.q.nested_absmax = f32(t, w + ".nested_absmax");
    l.q.code = f32(t, w + ".nested_quant_map");
    // A float32 printed by Python as a double: it converts back to the same float.
    l.q.offset = static_cast<float>(qs.at("nested_offset").get<double>());
    BOOST_TEST(
        f32(t, w + ".quant_map") == std::vector<float>(nn::kNf4Table.begin(), nn::kNf4Table.end()),
        boost::test_tools::per_element());
    nn::nf4_check(l.q);
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_nf4_table_and_dynamic_code_are_bitsandbytes) {
  const Tensors t = read_tensors({kNf4 + "nf4.safetensors"});
  const std::vector<float> table(nn::kNf4Table.begin(), nn::kNf4Table.end());
  const std::vector<float> code(nn::nf4_dynamic_code().begin(), nn::nf4_dynamic_code().end());
  BOOST_TEST(first_difference(table, f32(t, "nf4_table")) == -1);
  // create_dynamic_map() rebuilt with torch.linspace's rounding: every one of the 256 values.
  BOOST_TEST(first_difference(code, f32(t, "dynamic_code")) == -1);
  for (const char* c : kCases) {
    BOOST_TEST_CONTEXT(c) {
      BOOST_TEST(first_difference(table, f32(t, std::string(c) + ".quant_map")) == -1);
      BOOST_TEST(first_difference(code, f32(t, std::string(c) + ".nested_quant_map")) == -1);
    }
  }
  BOOST_TEST(code.front() == -0.99296874f);
  BOOST_TEST(code.back() == 1.0f);
}

BOOST_AUTO_TEST_CASE(plain_quantization_is_bitsandbytes_bit_for_bit) {
  const Tensors t = read_tensors({kNf4 + "nf4.safetensors"});
  for (const std::string c : kCases) {
    BOOST_TEST_CONTEXT(c) {
      const std::vector<float> x = f32(t, c + ".input");
      const nn::Nf4Tensor q =
          nn::nf4_quantize(x.data(), static_cast<int64_t>(x.size()), false, nullptr, nullptr);
      BOOST_TEST(first_difference(q.packed, u8(t, c + ".packed")) == -1);
      BOOST_TEST(first_difference(q.absmax, f32(t, c + ".plain.absmax")) == -1);
      BOOST_TEST(first_difference(dequantize(q), f32(t, c + ".plain.dequantized")) == -1);
      BOOST_TEST(q.absmax_code.empty());
      BOOST_TEST(q.nested_absmax.empty());
      BOOST_TEST(q.code.empty());
    }
  }
}

BOOST_AUTO_TEST_CASE(double_quantization_is_bitsandbytes_bit_for_bit) {
  const Tensors t = read_tensors({kNf4 + "nf4.safetensors"});
  for (const std::string c : kCases) {
    const std::vector<float> x = f32(t, c + ".input");
    const float offset = f32(t, c + ".offset").at(0);
    const std::vector<float> code = f32(t, c + ".nested_quant_map");
    const nn::Nf4Tensor given =
        nn::nf4_quantize(x.data(), static_cast<int64_t>(x.size()), true, &offset, code.data());
    const nn::Nf4Tensor own =
        nn::nf4_quantize(x.data(), static_cast<int64_t>(x.size()), true, nullptr, nullptr);
    for (const auto& [how, q] :
         {std::pair<const char*, const nn::Nf4Tensor&>{"stored offset and code", given},
          std::pair<const char*, const nn::Nf4Tensor&>{"ferry's offset and code", own}}) {
      BOOST_TEST_CONTEXT(c << ", " << how) {
        BOOST_TEST_INFO(q.offset << " vs bitsandbytes' " << offset);
        BOOST_TEST(bits(q.offset) == bits(offset));
        BOOST_TEST(first_difference(q.code, code) == -1);
        BOOST_TEST(first_difference(q.packed, u8(t, c + ".packed")) == -1);
        BOOST_TEST(first_difference(q.absmax_code, u8(t, c + ".absmax")) == -1);
        BOOST_TEST(first_difference(q.nested_absmax, f32(t, c + ".nested_absmax")) == -1);
        BOOST_TEST(first_difference(block_scales(q), f32(t, c + ".absmax_dequantized")) == -1);
        BOOST_TEST(first_difference(dequantize(q), f32(t, c + ".dequantized")) == -1);
        BOOST_TEST(q.absmax.empty());
      }
    }
  }
  // w60x88's offset is torch's float32 mean, 1 ulp below the correctly rounded mean: ferry's
  // transcription of torch's cascade sum gets it, a double sum would not.
  const std::vector<float> absmax = f32(t, "w60x88.plain.absmax");
  double sum = 0;
  for (float a : absmax) sum += a;
  const float rounded = static_cast<float>(sum / static_cast<double>(absmax.size()));
  BOOST_TEST(rounded == 0.2584508955478668f);
  BOOST_TEST(nn::nf4_torch_mean(absmax.data(), static_cast<int64_t>(absmax.size())) ==
             0.25845086574554443f);
  BOOST_TEST(bits(rounded) == bits(0.25845086574554443f) + 1);
}

// Three rules of the transcription that the fixtures' values never reach (no value on a
// midpoint, no tail value where the two scalings differ, no absmax within 1.5e-5 of a code
// midpoint): each pinned here on a constructed value, so that a change to one is seen.
BOOST_AUTO_TEST_CASE(rules_the_fixtures_do_not_reach_follow_the_transcription) {
  // (a) A scaled value exactly on a midpoint takes the lower index (bucketize, right=False).
  for (int k = 0; k < 15; ++k) {
    const float m = (nn::kNf4Table[k] + nn::kNf4Table[k + 1]) / 2.0f;
    // absmax 1: the reciprocal is 1 and x * 1 = x, so the scaled values are these exactly.
    const float x[] = {1.0f, m, std::nextafter(m, 2.0f), 0.0f};
    std::vector<float> block(64, 0.0f);
    std::copy(std::begin(x), std::end(x), block.begin());
    const nn::Nf4Tensor q = nn::nf4_quantize(block.data(), 64, false, nullptr, nullptr);
    BOOST_TEST_CONTEXT("midpoint " << k << " " << m) {
      BOOST_TEST((q.packed[0] & 15) == k);
      BOOST_TEST((q.packed[1] >> 4) == k + 1);
    }
  }
  // (b) Full blocks scale by x * (1 / absmax), the short last block by x / absmax: a value
  // where the two fall on different sides of a midpoint takes each block's own index.
  int found = 0;
  for (int k = 0; k < 15 && found < 3; ++k) {
    const float m = (nn::kNf4Table[k] + nn::kNf4Table[k + 1]) / 2.0f;
    for (float am : {0.3f, 0.7f, 0.11f, 0.93f, 0.47f}) {
      const float inv = 1.0f / am;
      float x = m * am;
      for (int step = -40; step < 0; ++step) x = std::nextafter(x, -1.0f);
      for (int step = 0; step < 80; ++step, x = std::nextafter(x, 2.0f)) {
        const bool by_division = x / am > m, by_reciprocal = x * inv > m;
        if (by_division == by_reciprocal || std::abs(x) >= am) continue;
        std::vector<float> v(66, 0.0f);  // a full block [am, x, 0...], a tail [am, x]
        v[0] = v[64] = am;
        v[1] = v[65] = x;
        const nn::Nf4Tensor q = nn::nf4_quantize(v.data(), 66, false, nullptr, nullptr);
        BOOST_TEST_CONTEXT("x " << x << ", absmax " << am << ", midpoint " << k) {
          BOOST_TEST((q.packed[0] & 15) == k + (by_reciprocal ? 1 : 0));
          BOOST_TEST((q.packed[32] & 15) == k + (by_division ? 1 : 0));
        }
        ++found;
        break;
      }
    }
  }
  BOOST_TEST(found >= 3);
  // (c) The 8-bit absmax code is bitsandbytes' CPU lookup: entry round((v + 1) / 2 * 65535)
  // of a grid of 65536 points, each holding the code the grid point is nearest to. Just
  // above a code midpoint whose nearest grid point is below it, that is the lower code,
  // where the exact nearest code (bitsandbytes' CUDA kernel) is the upper one.
  const std::array<float, 256>& code = nn::nf4_dynamic_code();
  int lut_cases = 0;
  for (int k = 128; k < 255 && lut_cases < 5; ++k) {
    const float m = 0.5f * (code[k] + code[k + 1]);
    float v = m;
    for (int step = 0; step < 400; ++step) {
      v = std::nextafter(v, 2.0f);
      const double t = (static_cast<double>(v) + 1.0) * 0.5 * 65535.0 + 0.5;
      const double frac = t - std::floor(t);
      const double grid = -1.0 + 2.0 * std::floor(t) / 65535.0;
      if (frac < 0.01 || frac > 0.99 || grid >= m - 1e-9) continue;
      // Two blocks of absmax 1 and v, offset 0: the nested absmax is 1, block 1's value v.
      std::vector<float> x(128, 0.0f);
      x[0] = 1.0f;
      x[64] = v;
      const float zero = 0.0f;
      const nn::Nf4Tensor q = nn::nf4_quantize(x.data(), 128, true, &zero, nullptr);
      BOOST_TEST_CONTEXT("absmax " << v << " just above midpoint " << k << " " << m) {
        BOOST_TEST(q.nested_absmax == std::vector<float>{1.0f}, boost::test_tools::per_element());
        BOOST_TEST(q.absmax_code[1] == k);  // the nearest code is k + 1
        BOOST_TEST(v - code[k] > code[k + 1] - v);
      }
      ++lut_cases;
      break;
    }
  }
  BOOST_TEST(lut_cases == 5);
}

BOOST_AUTO_TEST_CASE(a_stored_state_dequantizes_as_bitsandbytes) {
  const Tensors t = read_tensors({kNf4 + "nf4.safetensors"});
  for (const std::string c : kCases) {
    BOOST_TEST_CONTEXT(c) {
      const nn::Nf4Tensor dq = stored_state(t, c, true);
      BOOST_TEST(first_difference(block_scales(dq), f32(t, c + ".absmax_dequantized")) == -1);
      BOOST_TEST(first_difference(dequantize(dq), f32(t, c + ".dequantized")) == -1);
      const nn::Nf4Tensor plain = stored_state(t, c, false);
      BOOST_TEST(first_difference(dequantize(plain), f32(t, c + ".plain.dequantized")) == -1);
    }
  }
  // README's worked numbers: w60x88 byte 0 is 0x75 (x[0] -> index 7, x[1] -> index 5), block
  // 0's code 50 -> -0.28984373807907104 x 0.15967270731925964 + offset = 0.21217073500156403;
  // w7x13's last byte 0x27 (the pad, index 7, in the low nibble).
  const nn::Nf4Tensor w = stored_state(t, "w60x88", true);
  BOOST_TEST(w.packed.at(0) == 0x75);
  BOOST_TEST(w.absmax_code.at(0) == 50);
  BOOST_TEST(w.code.at(50) == -0.28984373807907104f);
  BOOST_TEST(w.nested_absmax.at(0) == 0.15967270731925964f);
  BOOST_TEST(nn::nf4_block_scale(w, 0) == 0.21217073500156403f);
  BOOST_TEST(dequantize(w).at(1) == nn::kNf4Table[5] * 0.21217073500156403f);
  BOOST_TEST(u8(t, "w7x13.packed").back() == 0x27);
  const std::vector<float> x = f32(t, "w7x13.input");
  BOOST_TEST(nn::nf4_quantize(x.data(), 91, false, nullptr, nullptr).packed.back() == 0x27);
}

BOOST_AUTO_TEST_CASE(any_range_dequantizes_as_the_whole) {
  const Tensors t = read_tensors({kNf4 + "nf4.safetensors"});
  std::vector<nn::Nf4Tensor> states;
  for (const std::string c : kCases) {
    states.push_back(stored_state(t, c, true));
    states.push_back(stored_state(t, c, false));
  }
  for (int64_t n : {1, 2, 3, 63, 64, 65, 129, 256 * 64 + 1, 300 * 64 + 37}) {
    const std::vector<float> x = normal_values(n, static_cast<uint64_t>(n));
    states.push_back(nn::nf4_quantize(x.data(), n, true, nullptr, nullptr));
    states.push_back(nn::nf4_quantize(x.data(), n, false, nullptr, nullptr));
  }
  std::mt19937_64 g(7);
  int64_t ranges = 0;
  for (const nn::Nf4Tensor& q : states) {
    BOOST_TEST_CONTEXT(q.numel << " values, double quantized " << q.double_quant) {
      const std::vector<float> whole = dequantize(q);
      std::vector<std::pair<int64_t, int64_t>> picks = {{0, q.numel}, {q.numel, 0}, {0, 0}};
      if (q.numel <= 130) {  // every range of a small tensor
        for (int64_t b = 0; b <= q.numel; ++b)
          for (int64_t n = 0; b + n <= q.numel; ++n) picks.emplace_back(b, n);
      }
      for (int k = 0; k < 2000; ++k) {
        const int64_t b = static_cast<int64_t>(g() % static_cast<uint64_t>(q.numel + 1));
        const int64_t rest = q.numel - b;
        // Short ranges (inside a block, across one boundary) as often as long ones.
        const int64_t cap = k % 2 ? std::min<int64_t>(rest, 130) : rest;
        picks.emplace_back(b, static_cast<int64_t>(g() % static_cast<uint64_t>(cap + 1)));
      }
      int64_t failures = 0;
      for (const auto& [b, n] : picks) {
        // Guard words on both sides catch a write outside [begin, begin + n).
        std::vector<float> out(static_cast<size_t>(n + 2), -7.0f);
        nn::nf4_dequantize_range(q, b, n, out.data() + 1);
        bool ok = out.front() == -7.0f && out.back() == -7.0f;
        for (int64_t i = 0; i < n && ok; ++i) ok = bits(out[i + 1]) == bits(whole[b + i]);
        if (!ok && ++failures <= 3)
          BOOST_ERROR("range [" << b << ", +" << n << ") differs from the whole");
        ++ranges;
      }
      BOOST_TEST(failures == 0);
    }
  }
  BOOST_TEST_MESSAGE(ranges << " ranges over " << states.size() << " tensors");
}

BOOST_AUTO_TEST_CASE(the_round_trip_error_is_within_half_the_largest_table_gap) {
  const Tensors t = read_tensors({kNf4 + "nf4.safetensors"});
  BOOST_TEST(half_max_gap() == (nn::kNf4Table[1] - nn::kNf4Table[0]) / 2);  // -1 .. -0.696
  for (const std::string c : kCases) {
    BOOST_TEST_CONTEXT(c) {
      const std::vector<float> x = f32(t, c + ".input");
      const int64_t n = static_cast<int64_t>(x.size());
      const double plain =
          check_round_trip(x, nn::nf4_quantize(x.data(), n, false, nullptr, nullptr));
      const double dq = check_round_trip(x, nn::nf4_quantize(x.data(), n, true, nullptr, nullptr));
      BOOST_TEST_MESSAGE(c << ": largest |w - x| / bound " << plain << " (fp32 absmax), " << dq
                           << " (double quant)");
    }
  }
  // Other sizes and spreads: heavy tails (a block's absmax far above its other values),
  // values spanning magnitudes, a constant tensor, one with zero blocks.
  std::mt19937_64 g(11);
  for (int64_t n : {1, 5, 64, 65, 1000, 256 * 64, 257 * 64 + 9, 100000}) {
    BOOST_TEST_CONTEXT(n << " values") {
      std::vector<float> x = normal_values(n, static_cast<uint64_t>(n) + 99, 0.02f);
      std::cauchy_distribution<float> heavy(0.0f, 0.01f);
      for (int64_t i = 0; i < n; i += 7) x[i] = heavy(g);
      for (int64_t i = 0; i < n; i += 13) x[i] *= std::ldexp(1.0f, static_cast<int>(g() % 40) - 20);
      check_round_trip(x, nn::nf4_quantize(x.data(), n, false, nullptr, nullptr));
      check_round_trip(x, nn::nf4_quantize(x.data(), n, true, nullptr, nullptr));
      std::vector<float> holes = x;
      for (int64_t i = 64; i < std::min<int64_t>(n, 192); ++i) holes[i] = 0.0f;
      check_round_trip(holes, nn::nf4_quantize(holes.data(), n, true, nullptr, nullptr));
      const std::vector<float> flat(static_cast<size_t>(n), -0.25f);
      check_round_trip(flat, nn::nf4_quantize(flat.data(), n, true, nullptr, nullptr));
    }
  }
}

BOOST_AUTO_TEST_CASE(empty_tiny_and_zero_tensors) {
  for (bool dq : {false, true}) {
    BOOST_TEST_CONTEXT("double quantized " << dq) {
      const nn::Nf4Tensor e = nn::nf4_quantize(nullptr, 0, dq, nullptr, nullptr);
      BOOST_TEST(e.numel == 0);
      BOOST_TEST(e.blocks() == 0);
      BOOST_TEST(e.packed.empty());
      BOOST_TEST(e.absmax.empty());
      BOOST_TEST(e.absmax_code.empty());
      BOOST_TEST(e.nested_absmax.empty());
      BOOST_TEST(e.offset == 0.0f);
      nn::nf4_dequantize(e, nullptr);
      nn::nf4_dequantize_range(e, 0, 0, nullptr);

      // One value: one byte, the pad (7) low; with double quantization the offset is the
      // only absmax, so the scale is exact and the value comes back (+-1 x absmax).
      const float one = -0.3f;
      const nn::Nf4Tensor q = nn::nf4_quantize(&one, 1, dq, nullptr, nullptr);
      BOOST_TEST(q.packed == std::vector<uint8_t>{0x07}, boost::test_tools::per_element());
      BOOST_TEST(dequantize(q).at(0) == one);
      if (dq) {
        BOOST_TEST(q.offset == 0.3f);
        BOOST_TEST(q.nested_absmax == std::vector<float>{0.0f}, boost::test_tools::per_element());
        BOOST_TEST(q.absmax_code == std::vector<uint8_t>{0}, boost::test_tools::per_element());
      }
      // Two values: both nibbles used, no pad.
      const float two[] = {0.5f, -0.04f};
      BOOST_TEST(
          nn::nf4_quantize(two, 2, dq, nullptr, nullptr).packed == std::vector<uint8_t>{0xF6},
          boost::test_tools::per_element());

      // All zeros, full blocks and a short one: index 7 everywhere, zeros back.
      const std::vector<float> zeros(131, 0.0f);
      const nn::Nf4Tensor z = nn::nf4_quantize(zeros.data(), 131, dq, nullptr, nullptr);
      BOOST_TEST(z.packed == std::vector<uint8_t>(66, 0x77), boost::test_tools::per_element());
      BOOST_TEST(dequantize(z) == zeros, boost::test_tools::per_element());
      if (!dq) BOOST_TEST(z.absmax[0] == 0.0f);
      // -0.0 is a zero too.
      const std::vector<float> neg(64, -0.0f);
      BOOST_TEST(nn::nf4_quantize(neg.data(), 64, dq, nullptr, nullptr).packed ==
                     std::vector<uint8_t>(32, 0x77),
                 boost::test_tools::per_element());
    }
  }
  BOOST_TEST(nn::nf4_storage_bytes(0, true) == 4);
  BOOST_TEST(nn::nf4_storage_bytes(91, false) == 46 + 2 * 4);
  BOOST_TEST(nn::nf4_storage_bytes(18200, true) == 9100 + 285 + 2 * 4 + 4);
  BOOST_TEST(nn::nf4_bytes_per_parameter(false) == 0.5625);
  BOOST_TEST(nn::nf4_bytes_per_parameter(true) == 0.515869140625);
}

BOOST_AUTO_TEST_CASE(nonsense_is_refused_by_name) {
  using E = std::invalid_argument;
  const std::vector<float> x = normal_values(100, 1);
  const float nan = std::nanf(""), inf = INFINITY, offset = 0.1f;
  BOOST_TEST(has(error_of<E>([&] { nn::nf4_quantize(x.data(), -1, false, nullptr, nullptr); }),
                 "negative"));
  BOOST_TEST(
      has(error_of<E>([&] { nn::nf4_quantize(nullptr, 3, false, nullptr, nullptr); }), "no input"));
  std::vector<float> bad = x;
  bad[42] = nan;
  BOOST_TEST(has(error_of<E>([&] { nn::nf4_quantize(bad.data(), 100, true, nullptr, nullptr); }),
                 "element 42"));
  bad[42] = -inf;
  BOOST_TEST(has(error_of<E>([&] { nn::nf4_quantize(bad.data(), 100, false, nullptr, nullptr); }),
                 "element 42"));
  BOOST_TEST(has(error_of<E>([&] { nn::nf4_quantize(x.data(), 100, false, &offset, nullptr); }),
                 "without double quantization"));
  BOOST_TEST(
      has(error_of<E>([&] { nn::nf4_quantize(x.data(), 100, true, &inf, nullptr); }), "offset"));
  std::vector<float> code(nn::nf4_dynamic_code().begin(), nn::nf4_dynamic_code().end());
  std::swap(code[10], code[11]);
  BOOST_TEST(has(error_of<E>([&] { nn::nf4_quantize(x.data(), 100, true, nullptr, code.data()); }),
                 "not ascending at 11"));

  const nn::Nf4Tensor q = nn::nf4_quantize(x.data(), 100, true, nullptr, nullptr);
  std::vector<float> out(100);
  BOOST_TEST(
      has(error_of<E>([&] { nn::nf4_dequantize_range(q, 90, 11, out.data()); }), "outside 100"));
  BOOST_TEST(has(error_of<E>([&] { nn::nf4_dequantize_range(q, -1, 2, out.data()); }), "outside"));
  BOOST_TEST(has(error_of<E>([&] { nn::nf4_dequantize_range(q, 0, 1, nullptr); }), "no output"));
  BOOST_TEST(has(error_of<E>([&] { nn::nf4_block_scale(q, 2); }), "block 2 of 2"));
  const auto broken = [&](const std::function<void(nn::Nf4Tensor&)>& edit) {
    nn::Nf4Tensor b = q;
    edit(b);
    return error_of<E>([&] { nn::nf4_dequantize(b, out.data()); });
  };
  BOOST_TEST(
      has(broken([](nn::Nf4Tensor& b) { b.packed.pop_back(); }), "49 packed bytes for 100 values"));
  BOOST_TEST(has(broken([](nn::Nf4Tensor& b) { b.absmax_code.push_back(0); }),
                 "3 absmax codes for 2 blocks"));
  BOOST_TEST(has(broken([](nn::Nf4Tensor& b) { b.nested_absmax.clear(); }), "0 nested absmax"));
  BOOST_TEST(has(broken([](nn::Nf4Tensor& b) { b.code.resize(16); }), "16 values, not 256"));
  BOOST_TEST(has(broken([&](nn::Nf4Tensor& b) { b.offset = nan; }), "offset"));
  BOOST_TEST(has(broken([&](nn::Nf4Tensor& b) { b.nested_absmax[0] = inf; }), "nested_absmax[0]"));
  BOOST_TEST(has(broken([](nn::Nf4Tensor& b) {
                   b.absmax = {1.0f, 1.0f};
                 }),
                 "float32 absmax beside"));
  BOOST_TEST(
      has(broken([](nn::Nf4Tensor& b) { b.double_quant = false; }), "0 absmax for 2 blocks"));
  BOOST_TEST(has(broken([](nn::Nf4Tensor& b) { b.numel = -2; }), "negative"));
  BOOST_TEST(has(error_of<E>([&] { nn::nf4_torch_mean(x.data(), 0); }), "n > 0"));
  BOOST_TEST(has(error_of<E>([&] { nn::nf4_storage_bytes(-1, true); }), "negative"));
}

BOOST_AUTO_TEST_CASE(transformers_saved_states_are_ferry_quantization_of_the_base) {
  const Tensors saved = read_tensors({kNf4 + "llama3-nf4/model.safetensors"});
  const Tensors base = folder_weights(kHf + "llama3");
  const std::vector<StoredLinear> linears = stored_linears(saved);
  BOOST_TEST(linears.size() == 21u);  // q/k/v/o/gate/up/down_proj of 3 layers
  for (const StoredLinear& l : linears) {
    BOOST_TEST_CONTEXT(l.module) {
      const std::vector<float> w = f32(base, l.module + ".weight");
      BOOST_TEST_REQUIRE(static_cast<int64_t>(w.size()) == l.q.numel);
      // ferry's own offset (its transcription of torch's mean) is the saved nested_offset.
      const nn::Nf4Tensor q = nn::nf4_quantize(w.data(), l.q.numel, true, nullptr, nullptr);
      BOOST_TEST_INFO(q.offset << " vs " << l.q.offset);
      BOOST_TEST(bits(q.offset) == bits(l.q.offset));
      BOOST_TEST(first_difference(q.packed, l.q.packed) == -1);
      BOOST_TEST(first_difference(q.absmax_code, l.q.absmax_code) == -1);
      BOOST_TEST(first_difference(q.nested_absmax, l.q.nested_absmax) == -1);
      BOOST_TEST(first_difference(q.code, l.q.code) == -1);
      BOOST_TEST(first_difference(dequantize(q), dequantize(l.q)) == -1);
      check_round_trip(w, l.q);
    }
  }
  // README's example: q_proj of layer 0, [60, 60], 57 blocks, nested_offset 0.3325163722038269.
  const auto q_proj = std::find_if(linears.begin(), linears.end(), [](const StoredLinear& l) {
    return l.module == "model.layers.0.self_attn.q_proj";
  });
  BOOST_TEST_REQUIRE((q_proj != linears.end()));
  BOOST_TEST(q_proj->shape == (std::vector<int64_t>{60, 60}), boost::test_tools::per_element());
  BOOST_TEST(q_proj->q.offset == 0.3325163722038269f);
  BOOST_TEST(q_proj->q.blocks() == 57);
}

BOOST_AUTO_TEST_CASE(the_dequantized_model_gives_bitsandbytes_logits) {
  // A float32 Hugging Face folder holding the saved model's float32 tensors and every
  // quantized projection dequantized by ferry from the saved state; ferry's forward on it
  // against the logits of bitsandbytes' model (matmul_4bit = dequantize_4bit + a float32
  // matmul) and of the float32 model holding bitsandbytes' dequantized weights.
  const Tensors saved = read_tensors({kNf4 + "llama3-nf4/model.safetensors"});
  const Tensors expected = read_tensors({kNf4 + "llama3-nf4/expected.safetensors"});
  test::TempDir dir("nf4_llama3");
  for (const auto& e : fs::directory_iterator(kHf + "llama3")) {
    const std::string f = e.path().filename().string();
    if (!f.ends_with(".safetensors") && f != "model.safetensors.index.json")
      fs::copy_file(e.path(), dir.path / f);
  }
  std::vector<runtime::SafetensorsEntry> entries;
  std::vector<std::vector<char>> data;
  for (const auto& [name, raw] : saved)
    if (raw.dtype == "F32" && name.find(".weight.") == std::string::npos) {
      entries.push_back({name, "F32", raw.shape, 0, 0});
      data.push_back(raw.bytes);
    }
  for (const StoredLinear& l : stored_linears(saved)) {
    const std::vector<float> w = dequantize(l.q);
    entries.push_back({l.module + ".weight", "F32", l.shape, 0, 0});
    data.emplace_back(reinterpret_cast<const char*>(w.data()),
                      reinterpret_cast<const char*>(w.data() + w.size()));
  }
  BOOST_TEST(entries.size() == 21u + 9u);  // + embeddings, head, final norm, 2 norms x 3 layers
  runtime::SafetensorsWriter out((dir.path / "model.safetensors").string(), entries,
                                 {{"format", "pt"}});
  for (size_t i = 0; i < data.size(); ++i) out.write(i, data[i].data(), data[i].size());
  out.finish();

  const Raw& input_ids = at(expected, "input_ids");
  BOOST_REQUIRE_EQUAL(input_ids.dtype, "I32");
  std::vector<int32_t> ids(input_ids.bytes.size() / 4);
  std::memcpy(ids.data(), input_ids.bytes.data(), input_ids.bytes.size());
  const std::vector<float> got = ferry_logits(dir.path.string(), ids);
  const std::vector<float> bnb = f32(expected, "logits");
  const std::vector<float> bnb_fp32 = f32(expected, "logits_dequantized_fp32");
  const std::vector<float> unquantized =
      f32(read_tensors({kHf + "llama3/expected.safetensors"}), "logits");
  double scale = 0;
  for (float v : bnb) scale = std::max(scale, std::abs(static_cast<double>(v)));
  const double err = max_abs_difference(got, bnb);
  const double quantization = max_abs_difference(unquantized, bnb);
  BOOST_TEST_MESSAGE("llama3-nf4: max |ferry - bitsandbytes| logit "
                     << err << " (largest " << scale << "); quantization itself moves them by "
                     << quantization);
  BOOST_TEST(max_abs_difference(bnb, bnb_fp32) == 0.0);
  BOOST_TEST(err <= 1e-4 * scale);  // test_hf's tolerance for ferry's forward vs transformers'
  BOOST_TEST(quantization > 100 * err);
}

BOOST_AUTO_TEST_CASE(throughput_is_reported) {
  const int64_t n = int64_t{4096} * 1024;
  const std::vector<float> x = normal_values(n, 5);
  std::vector<float> out(static_cast<size_t>(n));
  using clock = std::chrono::steady_clock;
  for (bool dq : {false, true}) {
    const auto t0 = clock::now();
    const nn::Nf4Tensor q = nn::nf4_quantize(x.data(), n, dq, nullptr, nullptr);
    const auto t1 = clock::now();
    nn::nf4_dequantize(q, out.data());
    const auto t2 = clock::now();
    const double qs = std::chrono::duration<double>(t1 - t0).count();
    const double ds = std::chrono::duration<double>(t2 - t1).count();
    BOOST_TEST_MESSAGE((dq ? "double quantized" : "fp32 absmax")
                       << ", " << n << " values: quantize " << qs * 1e3 << " ms (" << n / qs / 1e6
                       << " M/s), dequantize " << ds * 1e3 << " ms (" << n / ds / 1e6 << " M/s)");
    BOOST_TEST(out[0] == nn::kNf4Table[q.packed[0] >> 4] * nn::nf4_block_scale(q, 0));
  }
}
