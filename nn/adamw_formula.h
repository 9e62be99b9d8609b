// One AdamW element, torch.optim.AdamW's formula (decoupled decay, bias correction), in
// the form every implementation computes: offload/cpu_adam.h (the SIMD host optimizer),
// Device::adamw on the CPU device and the CUDA device's kernel. Host and device code.
//   g = grad * grad_scale
//   m = b1 m + (1-b1) g;   v = b2 v + (1-b2) g^2
//   p = p (1 - lr wd) - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FERRY_HOST_DEVICE __host__ __device__
#else
#define FERRY_HOST_DEVICE
#endif

namespace ferry::nn {

// This step's hyper-parameters (step >= 1 counts this one; weight_decay is this range's).
struct AdamWStep {
  int64_t step = 1;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0, grad_scale = 1.0;
};

// The per-step constants, rounded to f32 once on the host (1 - beta in double first:
// 1.0f - 0.999f would carry float(0.999)'s error).
struct AdamWConstants {
  float b1, b2, one_minus_b1, one_minus_b2, decay, step_size, inv_sqrt_bc2, eps, scale;
};

inline AdamWConstants adamw_constants(const AdamWStep& s) {
  const double bc1 = 1.0 - std::pow(s.beta1, static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(s.beta2, static_cast<double>(s.step));
  return {static_cast<float>(s.beta1),
          static_cast<float>(s.beta2),
          static_cast<float>(1.0 - s.beta1),
          static_cast<float>(1.0 - s.beta2),
          static_cast<float>(1.0 - s.lr * s.weight_decay),
          static_cast<float>(s.lr / bc1),
          static_cast<float>(1.0 / std::sqrt(bc2)),
          static_cast<float>(s.eps),
          static_cast<float>(s.grad_scale)};
}

FERRY_HOST_DEVICE inline void adamw_element(const AdamWConstants& k, float& p, float g, float& m,
                                            float& v) {
  const float gi = g * k.scale;
  m = k.b1 * m + k.one_minus_b1 * gi;
  v = k.b2 * v + k.one_minus_b2 * (gi * gi);
  p = p * k.decay - k.step_size * m / (std::sqrt(v) * k.inv_sqrt_bc2 + k.eps);
}

}  // namespace ferry::nn
