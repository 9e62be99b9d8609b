// NF4 blobs (nn/nf4_blob.h). A block's scale is nn/nf4.h's nf4_double_quant_scale (its
// roundings live there); a value is one multiply of the table by it.
#include "nn/nf4_blob.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>
#include <string>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "nn/dtype.h"

namespace ferry::nn {

namespace {

int64_t align16(int64_t n) { return (n + 15) / 16 * 16; }

void fail(const char* fn, const std::string& what) { throw std::invalid_argument(std::string(fn) + ": " + what); }

// Block b's absmax as the blob stores it (plain) or rebuilt from its codes (double quantized).
float block_scale(const uint8_t* blob, const Nf4Layout& l, int64_t b) {
  if (!l.double_quant) {
    float s;
    std::memcpy(&s, blob + l.absmax_at + 4 * b, 4);
    return s;
  }
  float code, nested, offset;
  std::memcpy(&code, blob + l.code_at + 4 * int64_t{blob[l.absmax_at + b]}, 4);
  std::memcpy(&nested, blob + l.nested_at + 4 * (b / kNf4NestedBlockSize), 4);
  std::memcpy(&offset, blob + l.offset_at, 4);
  return nf4_double_quant_scale(code, nested, offset);
}

std::string dims(const Nf4Layout& l) {
  std::string s = "[";
  s += std::to_string(l.rows);
  s += ", ";
  s += std::to_string(l.cols);
  s += "]";
  return s;
}

// The rectangle checks of both dequantizations: false when it is empty (nothing to do).
bool rect_to_do(const char* fn, const uint8_t* blob, const Nf4Layout& l, int64_t r0, int64_t R, int64_t c0, int64_t C,
                const void* out) {
  if (r0 < 0 || R < 0 || c0 < 0 || C < 0 || r0 + R > l.rows || c0 + C > l.cols) {
    fail(fn, "rows [" + std::to_string(r0) + ", +" + std::to_string(R) + ") x columns [" + std::to_string(c0) + ", +" +
                 std::to_string(C) + ") outside " + dims(l));
  }
  if (R * C == 0) return false;
  if (blob == nullptr || out == nullptr) fail(fn, "no blob or no output");
  return true;
}

}  // namespace

int64_t Nf4Layout::rect_bytes(int64_t r, int64_t c) const {
  const int64_t n = r * c;
  const int64_t blocks_read = std::min(blocks(), r * ((c + kNf4BlockSize - 1) / kNf4BlockSize + 1));
  return (n + 1) / 2 + blocks_read * (double_quant ? 1 : 4);
}

Nf4Layout nf4_layout(int64_t rows, int64_t cols, bool double_quant) {
  if (rows < 0 || cols < 0) {
    fail("nf4_layout", "a matrix of [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
  Nf4Layout l;
  l.rows = rows;
  l.cols = cols;
  l.double_quant = double_quant;
  const int64_t blocks = l.blocks();
  int64_t at = 0;
  if (double_quant) {
    l.code_at = at;
    at = align16(at + 256 * 4);
    l.offset_at = at;
    at = align16(at + 4);
    l.nested_at = at;
    at = align16(at + 4 * ((blocks + kNf4NestedBlockSize - 1) / kNf4NestedBlockSize));
    l.absmax_at = at;
    at = align16(at + blocks);
  } else {
    l.absmax_at = at;
    at = align16(at + 4 * blocks);
  }
  l.packed_at = at;
  l.bytes = align16(at + (l.numel() + 1) / 2);
  return l;
}

void nf4_write_blob(const Nf4Tensor& q, const Nf4Layout& l, uint8_t* blob) {
  nf4_check(q);
  if (q.numel != l.numel() || q.double_quant != l.double_quant) {
    fail("nf4_write_blob", "a state of " + std::to_string(q.numel) + " values (" +
                               (q.double_quant ? "double" : "plain") + ") for a blob of " + dims(l) + " (" +
                               (l.double_quant ? "double" : "plain") + ")");
  }
  if (blob == nullptr) fail("nf4_write_blob", "no blob");
  std::memset(blob, 0, static_cast<size_t>(l.bytes));
  if (l.double_quant) {
    std::memcpy(blob + l.code_at, q.code.data(), 256 * 4);
    std::memcpy(blob + l.offset_at, &q.offset, 4);
    std::memcpy(blob + l.nested_at, q.nested_absmax.data(), q.nested_absmax.size() * 4);
    std::memcpy(blob + l.absmax_at, q.absmax_code.data(), q.absmax_code.size());
  } else {
    std::memcpy(blob + l.absmax_at, q.absmax.data(), q.absmax.size() * 4);
  }
  std::memcpy(blob + l.packed_at, q.packed.data(), q.packed.size());
}

Nf4Tensor nf4_read_blob(const uint8_t* blob, const Nf4Layout& l) {
  if (blob == nullptr && l.bytes > 0) fail("nf4_read_blob", "no blob");
  Nf4Tensor q;
  q.numel = l.numel();
  q.double_quant = l.double_quant;
  const auto blocks = static_cast<size_t>(l.blocks());
  q.packed.assign(blob + l.packed_at, blob + l.packed_at + (q.numel + 1) / 2);
  if (l.double_quant) {
    q.code.resize(256);
    std::memcpy(q.code.data(), blob + l.code_at, 256 * 4);
    std::memcpy(&q.offset, blob + l.offset_at, 4);
    q.nested_absmax.resize((blocks + kNf4NestedBlockSize - 1) / kNf4NestedBlockSize);
    std::memcpy(q.nested_absmax.data(), blob + l.nested_at, q.nested_absmax.size() * 4);
    q.absmax_code.assign(blob + l.absmax_at, blob + l.absmax_at + blocks);
  } else {
    q.absmax.resize(blocks);
    std::memcpy(q.absmax.data(), blob + l.absmax_at, blocks * 4);
  }
  return q;
}

void nf4_dequantize_rect(const uint8_t* blob, const Nf4Layout& l, int64_t r0, int64_t R, int64_t c0, int64_t C,
                         float* out) {
  if (!rect_to_do("nf4_dequantize_rect", blob, l, r0, R, c0, C, out)) return;
  const uint8_t* packed = blob + l.packed_at;
  auto scale_of = [&](int64_t b) { return block_scale(blob, l, b); };
  int64_t cached = -1;
  std::array<float, 16> w{};
  for (int64_t r = 0; r < R; ++r) {
    const int64_t row = (r0 + r) * l.cols + c0;
    float* o = out + r * C;
    for (int64_t c = 0; c < C; ++c) {
      const int64_t i = row + c;
      const int64_t b = i / kNf4BlockSize;
      if (b != cached) {
        const float s = scale_of(b);
        for (size_t k = 0; k < w.size(); ++k) w[k] = kNf4Table[k] * s;
        cached = b;
      }
      const uint8_t byte = packed[i >> 1];
      o[c] = w[(i & 1) ? (byte & 15) : (byte >> 4)];
    }
  }
}

void nf4_dequantize_rect_16(const uint8_t* blob, const Nf4Layout& l, int64_t r0, int64_t R, int64_t c0, int64_t C,
                            uint16_t* out, int64_t ld, bool bf16) {
  if (!rect_to_do("nf4_dequantize_rect_16", blob, l, r0, R, c0, C, out)) return;
  const uint8_t* packed = blob + l.packed_at;
  alignas(64) std::array<uint16_t, 16> tab{};
  for (int64_t r = 0; r < R; ++r) {
    uint16_t* o = out + r * ld;
    const int64_t first = (r0 + r) * l.cols + c0, end = first + C;
    for (int64_t i = first; i < end;) {
      const int64_t b = i / kNf4BlockSize, stop = std::min(end, (b + 1) * kNf4BlockSize);
      const float s = block_scale(blob, l, b);
      for (size_t k = 0; k < tab.size(); ++k) tab[k] = bf16 ? f32_to_bf16(kNf4Table[k] * s) : f32_to_f16(kNf4Table[k] * s);
#ifdef __AVX512F__
      if (i == b * kNf4BlockSize && stop - i == kNf4BlockSize) {
        // 32 bytes, 64 nibbles: element 2j is byte j's high nibble, 2j + 1 its low one, so a
        // dword of the output is tab[hi] | tab[lo] << 16.
        const __m512i t = _mm512_cvtepu16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(tab.data())));
        for (int half = 0; half < 2; ++half) {
          const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + i / 2 + 16 * half)));
          const __m512i hi = _mm512_permutexvar_epi32(_mm512_srli_epi32(d, 4), t);
          const __m512i lo = _mm512_permutexvar_epi32(_mm512_and_si512(d, _mm512_set1_epi32(15)), t);
          _mm512_storeu_si512(o + (i - first) + 32 * half, _mm512_or_si512(hi, _mm512_slli_epi32(lo, 16)));
        }
        i = stop;
        continue;
      }
#endif
      for (; i < stop; ++i) {
        const uint8_t byte = packed[i >> 1];
        o[i - first] = tab[(i & 1) ? (byte & 15) : (byte >> 4)];
      }
    }
  }
}

}  // namespace ferry::nn
