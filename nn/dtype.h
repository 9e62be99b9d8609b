// Element types of tensors and the bf16 conversions every device agrees on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace ferry::nn {

// f64 exists for the CPU device only: it is the oracle's precision for gradient checks.
// i32 holds token ids. bf16 and f16 are the compute types of mixed precision (weights and
// activations); every device computes them in f32 and rounds what it stores.
enum class DType : uint8_t { f32, f64, bf16, i32, f16 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::f16: return 2;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::f16: return "f16";
  }
  return "?";
}

// bf16 is the upper half of an IEEE f32. Conversion rounds to nearest even and keeps NaN a
// NaN (a NaN whose payload lies only in the low bits would otherwise round to infinity).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

// IEEE binary16 through the compiler's _Float16 (round to nearest even; past 65504 the
// result is infinity, which is what fp16 loss scaling watches for). Clang before 15 has
// no _Float16 on x86 (the fuzz build, tests/fuzz/); its __fp16 is the same binary16 with
// the same single rounding, as a storage type.
#if defined(__clang__) && __clang_major__ < 15
using Half = __fp16;
#else
using Half = _Float16;
#endif

inline uint16_t f32_to_f16(float f) {
  const Half h = static_cast<Half>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

inline float f16_to_f32(uint16_t u) {
  Half h;
  std::memcpy(&h, &u, 2);
  return static_cast<float>(h);
}

constexpr bool is_low_precision(DType t) { return t == DType::bf16 || t == DType::f16; }

// A target id that takes no part in the loss (prompt tokens, padding): Hugging Face's -100,
// written -1 here (ids are never negative).
constexpr int32_t kIgnoreTarget = -1;

inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace ferry::nn
