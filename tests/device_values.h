// Values in and out of a device for the tests that compare devices (test_fused_ops,
// test_nf4_ops): host floats uploaded in any dtype, read back as floats, and the largest
// relative difference between two such reads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "nn/device.h"
#include "nn/rng.h"
#include "nn/tensor.h"

namespace ferry::test {

// n values, normal with standard deviation `scale`, from `seed`.
inline std::vector<float> random_values(int64_t n, uint64_t seed, double scale) {
  nn::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

// `v` on `dev` as a tensor of dtype t (rounded by the device's cast).
inline nn::Tensor upload(nn::Device& dev, nn::DType t, nn::Shape shape, const std::vector<float>& v) {
  const nn::Tensor f = nn::Tensor::empty(dev, nn::DType::f32, shape);
  dev.copy_from_host(f, v.data());
  if (t == nn::DType::f32) return f;
  const nn::Tensor out = nn::Tensor::empty(dev, t, shape);
  dev.cast(out, f);
  return out;
}

inline std::vector<float> download(nn::Device& dev, const nn::Tensor& t) {
  const nn::Tensor f = nn::Tensor::empty(dev, nn::DType::f32, t.shape());
  dev.cast(f, t);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  dev.copy_to_host(v.data(), f);
  return v;
}

// Largest |a - b| / max(1, |b|).
inline double worst(const std::vector<float>& a, const std::vector<float>& b) {
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    w = std::max(w, std::abs(double{a[i]} - b[i]) / std::max(1.0, std::abs(double{b[i]})));
  }
  return w;
}

}  // namespace ferry::test
