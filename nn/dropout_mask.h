// The dropout mask of DeviceOps::dropout_rows (nn/device_ops.h), in the one form every
// device computes: the CPU device's loop, the cuda device's kernel (nn/cuda/elementwise.cu)
// and the tests' host reference. Host and device code; no state.
//
// Element (row, col) of a mask with key k is kept when
//   h(k, row, col) >= threshold(p),
//   h = mix(mix(mix(k) + (row + 1) G) + (col + 1) G)      (all arithmetic mod 2^64)
// where mix is SplitMix64's finalizer (a bijection of 64-bit words, the one nn::Rng uses)
// and G = 0x9e3779b97f4a7c15, SplitMix64's increment: a row's columns are the SplitMix64
// stream seeded with the row's hash. threshold(p) = p 2^64 rounded down, computed on the
// host in double, so that exactly the words in [threshold, 2^64) keep: a fraction 1 - p (to
// 2^-64). A kept element is scaled by 1 / (1 - p) (dropout_scale).
// The mask is a pure function of (k, row, col): not of the tensor's shape, the device, the
// thread or block layout, or any state. That is what lets a trainer recompute it in
// backward instead of storing it, and give every world size, device and resume the same
// masks (docs/design/adapters.md, section 2).
// Changing anything here changes every mask: a resumed run would no longer continue its
// original one. tests/test_backend_ops.cpp pins a few values.
#pragma once

#include <cmath>
#include <cstdint>

#ifndef FERRY_HOST_DEVICE
#if defined(__CUDACC__)
#define FERRY_HOST_DEVICE __host__ __device__
#else
#define FERRY_HOST_DEVICE
#endif
#endif

namespace ferry::nn {

inline constexpr uint64_t kDropoutGamma = 0x9e3779b97f4a7c15ull;

FERRY_HOST_DEVICE inline uint64_t dropout_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The hash of a row: what its columns' words are drawn from. Devices compute it once per
// row (or per vector chunk) and dropout_word per element.
FERRY_HOST_DEVICE inline uint64_t dropout_row_hash(uint64_t key, int64_t row) {
  return dropout_mix(dropout_mix(key) + (static_cast<uint64_t>(row) + 1) * kDropoutGamma);
}

FERRY_HOST_DEVICE inline uint64_t dropout_word(uint64_t row_hash, int64_t col) {
  return dropout_mix(row_hash + (static_cast<uint64_t>(col) + 1) * kDropoutGamma);
}

// p in [0, 1) (the ops check it): p 2^64 rounded down. p 2^64 < 2^64 for every double p < 1
// (the largest, 1 - 2^-53, gives 2^64 - 2^11), so the conversion is defined.
inline uint64_t dropout_threshold(double p) {
  return static_cast<uint64_t>(std::ldexp(p, 64));
}

// The factor a kept element is multiplied by, computed in double and rounded once to the
// accumulation type by the caller (f32 for f32, bf16 and f16 tensors; f64 for f64).
inline double dropout_scale(double p) {
  return 1.0 / (1.0 - p);
}

FERRY_HOST_DEVICE inline bool dropout_keep(uint64_t key, int64_t row, int64_t col, uint64_t threshold) {
  return dropout_word(dropout_row_hash(key, row), col) >= threshold;
}

}  // namespace ferry::nn
