// Learning-rate schedules with DeepSpeed's names and formulas (deepspeed/runtime/lr_schedules.py):
//   WarmupLR        warmup_min_lr -> warmup_max_lr over warmup_num_steps, then constant
//   WarmupDecayLR   the same warmup, then linear decay to 0 at total_num_steps
//   WarmupCosineLR  optimizer lr x ratio: warmup_min_ratio -> 1, then cosine to cos_min_ratio
// warmup_type "log" (DeepSpeed's default) rises as log(step + 1) / log(warmup_num_steps).
#pragma once

#include <cstdint>

#include "runtime/config/config.h"

namespace ferry::runtime {

// Learning rate of optimizer step `step` (0-based: the first step uses step 0).
double learning_rate(const SchedulerConfig& s, double optimizer_lr, int64_t step);

}  // namespace ferry::runtime
