// NF4 quantization (nn/nf4.h). Every float operation below is one of bitsandbytes' (or
// torch's) float32 operations in the same order, so that the results are bit for bit
// theirs; the function comments name the code each one follows.

// a * b + c must round twice (bitsandbytes and torch multiply, then add). GCC fuses it into
// an FMA under -march=native by default (-ffp-contract=fast, even across statements), which
// changes last bits: turn contraction off for this file.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "nn/nf4.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <string>

namespace ferry::nn {

namespace {

// bitsandbytes scales by 1 / max(absmax, 1e-38) so that a zero block gives zeros, not NaN
// (the float32 rounding of the double 1e-38, a subnormal).
const float kMinScale = static_cast<float>(1e-38);

// The message is built only on failure: the checks run per element and per call.
template <class Message>
void require(bool ok, const char* fn, Message&& what) {
  if (!ok) throw std::invalid_argument(std::string(fn) + ": " + what());
}

int64_t nested_blocks(int64_t blocks) {
  return (blocks + kNf4NestedBlockSize - 1) / kNf4NestedBlockSize;
}

// torch.bucketize's boundaries: the float32 midpoints (t[i] + t[i+1]) / 2.
constexpr std::array<float, 15> kMid = [] {
  std::array<float, 15> m{};
  for (size_t i = 0; i < m.size(); ++i) m[i] = (kNf4Table[i] + kNf4Table[i + 1]) / 2.0f;
  return m;
}();

// The index of the nearest table value: the number of midpoints below v, so a value on a
// midpoint takes the lower index (bucketize, right=False). Counted without branches: the
// loop vectorizes.
inline uint8_t nf4_index(float v) {
  int idx = 0;
  for (float m : kMid) idx += m < v ? 1 : 0;
  return static_cast<uint8_t>(idx);
}

// aten/src/ATen/native/cpu/SumKernel.cpp multi_row_sum: `size` rows of `width` contiguous
// floats summed into 4 levels of accumulators (a cascade: each level holds the sum of
// 2^level_power of the one below).
std::vector<float> multi_row_sum(const float* rows, int64_t size, int64_t width) {
  constexpr int kLevels = 4;
  const int ceil_log2 =
      size <= 2 ? 1 : static_cast<int>(std::bit_width(static_cast<uint64_t>(size - 1)));
  const int level_power = std::max(4, ceil_log2 / kLevels);
  const int64_t level_step = int64_t{1} << level_power;
  const int64_t level_mask = level_step - 1;
  std::vector<float> acc(static_cast<size_t>(kLevels * width), 0.0f);
  const auto add = [width](float* dst, const float* src) {
    for (int64_t w = 0; w < width; ++w) dst[w] = dst[w] + src[w];
  };
  float* const a = acc.data();
  int64_t i = 0;
  while (i + level_step <= size) {
    for (int64_t k = 0; k < level_step; ++k, ++i) add(a, rows + i * width);
    for (int j = 1; j < kLevels; ++j) {
      add(a + j * width, a + (j - 1) * width);
      std::fill(a + (j - 1) * width, a + j * width, 0.0f);
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < size; ++i) add(a, rows + i * width);
  for (int j = 1; j < kLevels; ++j) add(a, a + j * width);
  acc.resize(static_cast<size_t>(width));
  return acc;
}

// SumKernel.cpp row_sum: 4 interleaved partial sums (ilp_factor 4) over rows of `width`
// floats, then the rows left over, then the partials in order.
std::vector<float> row_sum(const float* items, int64_t size, int64_t width) {
  const int64_t size_ilp = size / 4;
  std::vector<float> partial(static_cast<size_t>(4 * width), 0.0f);
  if (size_ilp > 0) partial = multi_row_sum(items, size_ilp, 4 * width);
  for (int64_t i = size_ilp * 4; i < size; ++i)
    for (int64_t w = 0; w < width; ++w) partial[w] = partial[w] + items[i * width + w];
  for (int64_t k = 1; k < 4; ++k)
    for (int64_t w = 0; w < width; ++w) partial[w] = partial[w] + partial[k * width + w];
  partial.resize(static_cast<size_t>(width));
  return partial;
}

// torch.linspace(start, end, steps, dtype=float32) on the CPU (RangeFactoriesKernel.cpp):
// step = (end - start) / (steps - 1) in float32; element i is start + i*step in the first
// half and end - (steps-1-i)*step after. The script evaluates each with one exact product and
// one rounding to double, then to float32 (what torch's vectorized FMA kernel gave on all 256
// code values); here the product of a float and an integer below 2^7 is exact in double, so
// a double add then a cast is that same computation.
std::vector<float> linspace_f32(float start, float end, int steps) {
  const float step = (end - start) / static_cast<float>(steps - 1);
  std::vector<float> out(static_cast<size_t>(steps));
  const int half = steps / 2;
  for (int i = 0; i < steps; ++i) {
    const double v = i < half
                         ? static_cast<double>(step) * i + static_cast<double>(start)
                         : static_cast<double>(-step) * (steps - 1 - i) + static_cast<double>(end);
    out[static_cast<size_t>(i)] = static_cast<float>(v);
  }
  return out;
}

// bitsandbytes functional.py create_dynamic_map(signed=True, max_exponent_bits=7,
// total_bits=8): for exponent i, 2^i means of a linspace(0.1, 1) scaled by 10^(i-6) (the
// Python number cast to float32 before the float32 multiply), both signs; then 0 and 1.
std::array<float, 256> build_dynamic_code() {
  constexpr int kExponentBits = 7;
  // 10 ** (-(7 - 1) + i) as Python computes it (pow, correctly rounded): these literals.
  constexpr double kScale[kExponentBits] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  std::vector<float> data;
  for (int i = 0; i < kExponentBits; ++i) {
    const std::vector<float> b = linspace_f32(static_cast<float>(0.1), 1.0f, (1 << i) + 1);
    const float scale = static_cast<float>(kScale[i]);
    std::vector<float> means(b.size() - 1);
    for (size_t k = 0; k + 1 < b.size(); ++k) means[k] = (b[k] + b[k + 1]) / 2.0f;
    for (float m : means) data.push_back(scale * m);
    for (float m : means) data.push_back(-scale * m);
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  std::sort(data.begin(), data.end());
  std::array<float, 256> code{};
  if (data.size() != code.size())
    throw std::logic_error("nf4: the dynamic code has " + std::to_string(data.size()));
  std::copy(data.begin(), data.end(), code.begin());
  return code;
}

void require_code(const float* code, const char* fn) {
  for (int i = 0; i < 256; ++i) {
    require(std::isfinite(code[i]), fn,
            [&] { return "code[" + std::to_string(i) + "] is not finite"; });
    require(i == 0 || code[i - 1] <= code[i], fn,
            [&] { return "the code is not ascending at " + std::to_string(i); });
  }
}

// csrc/cpu_ops.cpp quantize_cpu_impl<float> (bitsandbytes' CPU quantize_blockwise, through
// build_quantize_lut): per 256 values an absmax (0: every code 0); v = clamp(x * (1/absmax),
// -1, 1) picks LUT entry (uint16)((v + 1) * 0.5 * 65535 + 0.5), and LUT entry i is the number
// of code midpoints 0.5 * (code[j] + code[j+1]) below -1 + 2i/65535. The entry is computed
// here when needed (a binary search) instead of tabulated: the same numbers.
void quantize_absmax_8bit(const std::vector<float>& centred, const std::vector<float>& code,
                          std::vector<uint8_t>& codes, std::vector<float>& nested) {
  std::array<float, 255> mid{};
  for (size_t j = 0; j < mid.size(); ++j) mid[j] = 0.5f * (code[j] + code[j + 1]);
  const int64_t n = static_cast<int64_t>(centred.size());
  codes.assign(centred.size(), 0);
  nested.assign(static_cast<size_t>(nested_blocks(n)), 0.0f);
  for (int64_t s = 0, nb = 0; s < n; s += kNf4NestedBlockSize, ++nb) {
    const int64_t e = std::min(n, s + kNf4NestedBlockSize);
    float am = 0.0f;
    for (int64_t i = s; i < e; ++i) am = std::max(am, std::fabs(centred[i]));
    nested[nb] = am;
    if (am == 0.0f) continue;
    const float inv = 1.0f / am;
    for (int64_t i = s; i < e; ++i) {
      float v = centred[i] * inv;
      // 0 * inf, only when am is a subnormal below 1/FLT_MAX: undefined in bitsandbytes;
      // here the code of 0 rather than a NaN cast to an integer.
      if (std::isnan(v)) v = 0.0f;
      v = std::clamp(v, -1.0f, 1.0f);
      const float t = (v + 1.0f) * 0.5f * 65535.0f + 0.5f;
      const auto entry = static_cast<uint16_t>(t);
      const float lut_val = -1.0f + (2.0f * static_cast<float>(entry)) / 65535.0f;
      codes[i] =
          static_cast<uint8_t>(std::lower_bound(mid.begin(), mid.end(), lut_val) - mid.begin());
    }
  }
}

// Sizes only (O(1)): what dequantization needs to stay inside the vectors.
void require_sizes(const Nf4Tensor& q, const char* fn) {
  require(q.numel >= 0, fn, [&] { return "numel " + std::to_string(q.numel) + " is negative"; });
  const int64_t blocks = q.blocks();
  require(static_cast<int64_t>(q.packed.size()) == (q.numel + 1) / 2, fn, [&] {
    return std::to_string(q.packed.size()) + " packed bytes for " + std::to_string(q.numel) +
           " values";
  });
  if (!q.double_quant) {
    require(static_cast<int64_t>(q.absmax.size()) == blocks, fn, [&] {
      return std::to_string(q.absmax.size()) + " absmax for " + std::to_string(blocks) + " blocks";
    });
    require(q.absmax_code.empty() && q.nested_absmax.empty(), fn, [&] {
      return std::string("absmax codes or nested absmax without double quantization");
    });
    return;
  }
  require(q.absmax.empty(), fn,
          [&] { return std::string("a float32 absmax beside double quantization"); });
  require(static_cast<int64_t>(q.absmax_code.size()) == blocks, fn, [&] {
    return std::to_string(q.absmax_code.size()) + " absmax codes for " + std::to_string(blocks) +
           " blocks";
  });
  require(static_cast<int64_t>(q.nested_absmax.size()) == nested_blocks(blocks), fn, [&] {
    return std::to_string(q.nested_absmax.size()) + " nested absmax for " + std::to_string(blocks) +
           " blocks";
  });
  require(q.code.size() == 256, fn,
          [&] { return "the code has " + std::to_string(q.code.size()) + " values, not 256"; });
}

// Block b's scale, b in range (checked by the callers). Double quantized: bitsandbytes'
// dequantize_blockwise (code[q] * absmax2[b / 256], cpu_ops.cpp) then `absmax += offset`:
// two float32 roundings.
inline float block_scale(const Nf4Tensor& q, int64_t b) {
  if (!q.double_quant) return q.absmax[static_cast<size_t>(b)];
  return nf4_double_quant_scale(q.code[q.absmax_code[static_cast<size_t>(b)]],
                                q.nested_absmax[static_cast<size_t>(b / kNf4NestedBlockSize)], q.offset);
}

}  // namespace

float nf4_double_quant_scale(float code, float nested_absmax, float offset) {
  const float scaled = code * nested_absmax;
  return scaled + offset;
}

const std::array<float, 256>& nf4_dynamic_code() {
  static const std::array<float, 256> code = build_dynamic_code();
  return code;
}

float nf4_torch_mean(const float* x, int64_t n) {
  require(n > 0 && x != nullptr, "nf4_torch_mean",
          [&] { return "needs n > 0 values, got " + std::to_string(n); });
  // SumKernel.cpp cascade_sum, vectorized_inner_sum: row_sum over the whole vectors of 8
  // floats, then a scalar sum of the tail, then the vector's lanes in order; fewer than 8
  // values: a scalar row_sum. Then sum / n in float32 (torch's mean).
  constexpr int64_t kLanes = 8;
  float s = 0.0f;
  if (n >= kLanes) {
    const int64_t nv = n / kLanes;
    const std::vector<float> vec = row_sum(x, nv, kLanes);
    for (int64_t i = nv * kLanes; i < n; ++i) s = s + x[i];
    for (float v : vec) s = s + v;
  } else {
    s = row_sum(x, n, 1)[0];
  }
  return s / static_cast<float>(n);
}

// bitsandbytes/backends/default/ops.py quantize_4bit (0.50.2; the CPU uses it) and
// functional.py quantize_4bit(compress_statistics=True).
Nf4Tensor nf4_quantize(const float* x, int64_t n, bool double_quant, const float* offset_override,
                       const float* code_override) {
  const char* fn = "nf4_quantize";
  require(n >= 0, fn, [&] { return "n " + std::to_string(n) + " is negative"; });
  require(n == 0 || x != nullptr, fn,
          [&] { return "no input for " + std::to_string(n) + " values"; });
  require(double_quant || (offset_override == nullptr && code_override == nullptr), fn,
          [&] { return std::string("an offset or code without double quantization"); });
  for (int64_t i = 0; i < n; ++i)
    require(std::isfinite(x[i]), fn,
            [&] { return "element " + std::to_string(i) + " is " + std::to_string(x[i]); });
  if (offset_override != nullptr)
    require(std::isfinite(*offset_override), fn,
            [&] { return std::string("the offset is not finite"); });
  if (code_override != nullptr) require_code(code_override, fn);

  Nf4Tensor q;
  q.numel = n;
  q.double_quant = double_quant;
  const int64_t blocks = q.blocks();
  std::vector<float> absmax(static_cast<size_t>(blocks));
  q.packed.assign(static_cast<size_t>((n + 1) / 2), 0);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t s = b * kNf4BlockSize;
    const int64_t len = std::min(kNf4BlockSize, n - s);
    float am = 0.0f;
    for (int64_t i = s; i < s + len; ++i) am = std::max(am, std::fabs(x[i]));
    std::array<uint8_t, kNf4BlockSize> idx{};
    if (len == kNf4BlockSize) {
      // A full block: x * (1 / absmax), a float32 reciprocal; absmax stored as it is.
      const float inv = 1.0f / std::max(am, kMinScale);
      for (int64_t k = 0; k < len; ++k) idx[k] = nf4_index(std::clamp(x[s + k] * inv, -1.0f, 1.0f));
    } else {
      // The short last block: x / absmax, the clamped absmax stored.
      am = std::max(am, kMinScale);
      for (int64_t k = 0; k < len; ++k) idx[k] = nf4_index(std::clamp(x[s + k] / am, -1.0f, 1.0f));
    }
    absmax[b] = am;
    // Element 2k in the high nibble of byte k (blocks have an even size, so a block starts
    // on a byte boundary).
    for (int64_t k = 0; k < len; ++k) {
      uint8_t& byte = q.packed[static_cast<size_t>((s + k) / 2)];
      byte = static_cast<uint8_t>(((s + k) & 1) ? (byte | idx[k]) : (idx[k] << 4));
    }
  }
  // An odd count: the pad is a scaled 0, index 7.
  if (n % 2 == 1) q.packed.back() = static_cast<uint8_t>(q.packed.back() | nf4_index(0.0f));

  if (!double_quant) {
    q.absmax = std::move(absmax);
    return q;
  }
  const auto& dyn = nf4_dynamic_code();
  q.code.assign(dyn.begin(), dyn.end());
  if (code_override != nullptr) q.code.assign(code_override, code_override + 256);
  q.offset = offset_override != nullptr ? *offset_override
             : blocks > 0               ? nf4_torch_mean(absmax.data(), blocks)
                                        : 0.0f;
  std::vector<float> centred(absmax.size());
  for (size_t b = 0; b < absmax.size(); ++b) centred[b] = absmax[b] - q.offset;
  quantize_absmax_8bit(centred, q.code, q.absmax_code, q.nested_absmax);
  return q;
}

void nf4_check(const Nf4Tensor& q) {
  const char* fn = "nf4_check";
  require_sizes(q, fn);
  const auto finite = [fn](const std::vector<float>& v, const char* what) {
    for (size_t i = 0; i < v.size(); ++i)
      require(std::isfinite(v[i]), fn,
              [&] { return std::string(what) + "[" + std::to_string(i) + "] is not finite"; });
  };
  finite(q.absmax, "absmax");
  finite(q.nested_absmax, "nested_absmax");
  finite(q.code, "code");
  require(std::isfinite(q.offset), fn, [&] { return std::string("the offset is not finite"); });
}

float nf4_block_scale(const Nf4Tensor& q, int64_t b) {
  require_sizes(q, "nf4_block_scale");
  require(b >= 0 && b < q.blocks(), "nf4_block_scale",
          [&] { return "block " + std::to_string(b) + " of " + std::to_string(q.blocks()); });
  return block_scale(q, b);
}

void nf4_dequantize(const Nf4Tensor& q, float* out) {
  nf4_check(q);
  nf4_dequantize_range(q, 0, q.numel, out);
}

// csrc/cpu_ops.cpp dequantizeBlockwise4bitCpu (scalar branch), backends/default/ops.py
// _dequantize_4bit_impl: out[i] = table[nibble_i] * absmax[i / 64], one float32 multiply,
// done once per (block, index) and looked up: the same bits.
void nf4_dequantize_range(const Nf4Tensor& q, int64_t begin, int64_t n, float* out) {
  const char* fn = "nf4_dequantize_range";
  require_sizes(q, fn);
  require(begin >= 0 && n >= 0 && begin <= q.numel && n <= q.numel - begin, fn, [&] {
    return "range [" + std::to_string(begin) + ", +" + std::to_string(n) + ") outside " +
           std::to_string(q.numel) + " values";
  });
  require(n == 0 || out != nullptr, fn,
          [&] { return "no output for " + std::to_string(n) + " values"; });
  const uint8_t* packed = q.packed.data();
  const int64_t end = begin + n;
  for (int64_t i = begin; i < end;) {
    const int64_t b = i / kNf4BlockSize;
    const int64_t block_end = std::min(end, (b + 1) * kNf4BlockSize);
    const float scale = block_scale(q, b);
    std::array<float, 16> w{};
    for (size_t k = 0; k < w.size(); ++k) w[k] = kNf4Table[k] * scale;
    float* o = out + (i - begin);  // o[k] is element i + k
    int64_t k = 0;
    const int64_t len = block_end - i;
    if (i & 1) {
      o[0] = w[packed[i >> 1] & 15];
      k = 1;
    }
    for (; k + 1 < len; k += 2) {
      const uint8_t byte = packed[(i + k) >> 1];
      o[k] = w[byte >> 4];
      o[k + 1] = w[byte & 15];
    }
    if (k < len) o[k] = w[packed[(i + k) >> 1] >> 4];
    i = block_end;
  }
}

double nf4_bytes_per_parameter(bool double_quant) {
  const double scales = double_quant
                            ? 1.0 / kNf4BlockSize + 4.0 / (kNf4BlockSize * kNf4NestedBlockSize)
                            : 4.0 / kNf4BlockSize;
  return 0.5 + scales;
}

int64_t nf4_storage_bytes(int64_t n, bool double_quant) {
  require(n >= 0, "nf4_storage_bytes", [&] { return "n " + std::to_string(n) + " is negative"; });
  const int64_t blocks = (n + kNf4BlockSize - 1) / kNf4BlockSize;
  const int64_t scales = double_quant ? blocks + 4 * nested_blocks(blocks) + 4 : 4 * blocks;
  return (n + 1) / 2 + scales;
}

}  // namespace ferry::nn
