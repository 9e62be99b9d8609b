// Learning-rate schedules with DeepSpeed's names and formulas (deepspeed/runtime/lr_schedules.py):
//   WarmupLR        warmup_min_lr -> warmup_max_lr over warmup_num_steps, then constant
//   WarmupDecayLR   the same warmup, then linear decay to warmup_min_lr at total_num_steps
//   WarmupCosineLR  optimizer lr x ratio: warmup_min_ratio -> 1, then cosine to cos_min_ratio
// warmup_type "log" (DeepSpeed's default) rises as log(step + 1) / log(warmup_num_steps).
//
// As in DeepSpeed, warmup lasts max(2, warmup_num_steps) steps, and a total_num_steps below
// that is accepted with a warning (schedule_warning): the warmup runs to its end regardless;
// WarmupDecayLR then holds warmup_min_lr, WarmupCosineLR follows DeepSpeed's cosine of a
// negative span (cos is even: it falls as over |total - warmup| steps, then rises again).
// Past total_num_steps the cosine is not clamped either, as in DeepSpeed. The one case
// DeepSpeed cannot compute, WarmupCosineLR with total_num_steps equal to the warmup (a
// division by zero there), holds cos_min_ratio after the warmup.
// Pure functions of their arguments; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/config/config.h"

namespace ferry::runtime {

// Learning rate of optimizer step `step` (0-based: the first step uses step 0).
double learning_rate(const SchedulerConfig& s, double optimizer_lr, int64_t step);

// The warning DeepSpeed logs when it builds this schedule ("" when none): total_num_steps
// below the warmup. The trainer prints it once on rank 0.
std::string schedule_warning(const SchedulerConfig& s);

}  // namespace ferry::runtime
