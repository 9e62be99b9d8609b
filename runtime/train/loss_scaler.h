// LossScaler: fp16's dynamic loss scaling, DeepSpeed's rule (its fp16 keys and defaults).
//
// The loss is multiplied by scale() before backward, so small fp16 gradients do not flush
// to zero; the optimizer divides it out. A step whose gradients overflowed (a non-finite
// global norm) is skipped: no update, and neither Adam's step count nor the learning-rate
// schedule advances (DeepSpeed's behaviour). update() then applies the rule:
//   overflow: with hysteresis h, the first h-1 overflows since the last reset only count
//             down; the h-th divides the scale by 2 (never below min_loss_scale). Another
//             overflow at min_loss_scale stops the run (DeepSpeed's raise_error_at_min_scale).
//   no overflow: after loss_scale_window steps since the last overflow (counted from the
//             start: -1) the scale doubles and the hysteresis resets; with
//             consecutive_hysteresis every good step resets it.
// A static scale (fp16.loss_scale > 0) never changes; overflowing steps are still skipped.
// Threads: the training thread.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/config/sections.h"

namespace ferry::runtime {


class LossScaler {
 public:
  explicit LossScaler(const LossScaling& cfg);
  double scale() const { return scale_; }
  bool dynamic() const { return cfg_.static_scale <= 0; }
  // After a step: `overflow` = its gradients were not finite. Returns a line describing
  // the change ("" when nothing changed). Throws std::runtime_error when an overflow comes
  // with the scale already at min_loss_scale.
  std::string update(bool overflow);
  int64_t skipped() const { return skipped_; }

  // For checkpoints: everything update() depends on.
  nlohmann::json state() const;
  void restore(const nlohmann::json& state);  // throws std::runtime_error on a malformed state

 private:
  LossScaling cfg_;
  double scale_;
  int64_t iter_ = 0, last_overflow_ = -1, skipped_ = 0;
  int hysteresis_left_;
};

}  // namespace ferry::runtime
