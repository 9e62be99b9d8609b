#include "runtime/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace ferry::runtime {

namespace {

// DeepSpeed's self.warmup_num_steps: at least 2, so that log(warmup) is not 0.
int64_t warmup_steps(const SchedulerConfig& s) {
  return std::max<int64_t>(2, s.warmup_num_steps);
}

// Fraction of warmup done at `step`, in [0, 1].
double warmup_gamma(const SchedulerConfig& s, int64_t step) {
  const auto warm = static_cast<double>(warmup_steps(s));
  if (s.warmup_type == "log") return std::log(static_cast<double>(step) + 1.0) / std::log(warm);
  return static_cast<double>(step) / warm;
}

}  // namespace

double learning_rate(const SchedulerConfig& s, double optimizer_lr, int64_t step) {
  if (s.type.empty()) return optimizer_lr;
  const int64_t warm = warmup_steps(s);
  const bool warming = step < warm;
  if (s.type == "WarmupLR" || s.type == "WarmupDecayLR") {
    double gamma = 1.0;
    if (warming) {
      gamma = warmup_gamma(s, step);
    } else if (s.type == "WarmupDecayLR") {
      gamma = std::max(0.0, static_cast<double>(s.total_num_steps - step) /
                                std::max(1.0, static_cast<double>(s.total_num_steps - warm)));
    }
    return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
  }
  // WarmupCosineLR
  if (warming) {
    return optimizer_lr * (s.warmup_min_ratio + warmup_gamma(s, step) * (1.0 - s.warmup_min_ratio));
  }
  const auto done = static_cast<double>(step - warm + 1);
  const auto span = static_cast<double>(s.total_num_steps - warm);
  // span 0: DeepSpeed divides by zero; the limit from above is the end of the decay.
  const double cosine = span == 0.0 ? 0.0 : (1.0 + std::cos(std::numbers::pi * done / span)) / 2.0;
  return optimizer_lr * std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine);
}

std::string schedule_warning(const SchedulerConfig& s) {
  if (s.type != "WarmupDecayLR" && s.type != "WarmupCosineLR") return "";
  const int64_t warm = warmup_steps(s);
  const std::string where =
      "scheduler " + s.type + ": total_num_steps " + std::to_string(s.total_num_steps);
  if (s.total_num_steps < warm) {
    return where + " is less than warmup_num_steps " + std::to_string(s.warmup_num_steps) +
           " (as DeepSpeed: the warmup runs to its end" +
           (s.type == "WarmupDecayLR"
                ? std::string(", then the lr stays at warmup_min_lr)")
                : std::string(", then the cosine runs over |total - warmup| steps)"));
  }
  if (s.type == "WarmupCosineLR" && s.total_num_steps == warm) {
    return where + " equals the warmup's " + std::to_string(warm) +
           " steps (DeepSpeed divides by zero after the warmup; ferry holds cos_min_ratio)";
  }
  return "";
}

}  // namespace ferry::runtime
