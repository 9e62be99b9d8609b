#include "runtime/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace ferry::runtime {

namespace {

// Fraction of warmup done at `step`, in [0, 1].
double warmup_gamma(const SchedulerConfig& s, int64_t step) {
  const auto warm = static_cast<double>(std::max<int64_t>(2, s.warmup_num_steps));
  if (s.warmup_type == "log") return std::log(static_cast<double>(step) + 1.0) / std::log(warm);
  return static_cast<double>(step) / warm;
}

}  // namespace

double learning_rate(const SchedulerConfig& s, double optimizer_lr, int64_t step) {
  if (s.type.empty()) return optimizer_lr;
  const bool warming = step < s.warmup_num_steps;
  if (s.type == "WarmupLR" || s.type == "WarmupDecayLR") {
    double gamma = 1.0;
    if (warming) {
      gamma = warmup_gamma(s, step);
    } else if (s.type == "WarmupDecayLR") {
      gamma = std::max(0.0, static_cast<double>(s.total_num_steps - step) /
                                std::max<double>(1.0, static_cast<double>(s.total_num_steps - s.warmup_num_steps)));
    }
    return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
  }
  // WarmupCosineLR
  if (warming) {
    return optimizer_lr * (s.warmup_min_ratio + warmup_gamma(s, step) * (1.0 - s.warmup_min_ratio));
  }
  const double done = static_cast<double>(step - s.warmup_num_steps + 1);
  const double span = static_cast<double>(s.total_num_steps - s.warmup_num_steps);
  const double cosine = (1.0 + std::cos(std::numbers::pi * std::min(1.0, done / span))) / 2.0;
  return optimizer_lr * std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine);
}

}  // namespace ferry::runtime
