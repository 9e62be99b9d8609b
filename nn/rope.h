// Rotary position embedding frequencies: the base theta and, optionally, Llama 3's
// frequency rescaling (Hugging Face's rope_type "llama3"), computed the same way by the
// CPU kernel and the CUDA kernel (host and device code, plain values: pass by value).
//
// inv_freq(i) = theta^(-2i/hd) for pair i < hd/2. With llama3 scaling (factor > 0), as
// transformers' _compute_llama3_parameters: wavelen = 2 pi / inv_freq; wavelen below
// original_max / high_freq_factor keeps inv_freq; above original_max / low_freq_factor
// divides it by factor; between, smooth = (original_max / wavelen - low_freq_factor) /
// (high_freq_factor - low_freq_factor) blends (1 - smooth) inv_freq / factor + smooth inv_freq.
// Without scaling the value is the expression the kernels always used (bit-identical).
#pragma once

#include <cmath>
#include <cstdint>

#include "nn/adamw_formula.h"  // FERRY_HOST_DEVICE

namespace ferry::nn {

struct Rope {
  double theta = 10000.0;
  double factor = 0.0;  // 0: no scaling
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_max_positions = 8192.0;

  // A plain base converts implicitly: most callers only have theta.
  Rope(double base = 10000.0) : theta(base) {}  // NOLINT(google-explicit-constructor)
  static Rope llama3(double base, double factor, double low, double high, double original_max) {
    Rope r(base);
    r.factor = factor;
    r.low_freq_factor = low;
    r.high_freq_factor = high;
    r.original_max_positions = original_max;
    return r;
  }
  bool scaled() const { return factor > 0.0; }

  FERRY_HOST_DEVICE double inv_freq(int64_t i, int64_t hd) const {
    const double f = pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
    if (!(factor > 0.0)) return f;
    const double pi = 3.14159265358979323846;
    const double wavelen = 2.0 * pi / f;
    const double low_wavelen = original_max_positions / low_freq_factor;
    const double high_wavelen = original_max_positions / high_freq_factor;
    if (wavelen < high_wavelen) return f;
    if (wavelen > low_wavelen) return f / factor;
    const double smooth = (original_max_positions / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    return (1.0 - smooth) * f / factor + smooth * f;
  }
};

}  // namespace ferry::nn
