// TracedUnits: a UnitAccess decorator that records the model's compute on the tracer's
// "compute" track. A span opens when the outermost acquire (weights or gradients) returns
// (after any gather or read it waited for) and closes when the matching release begins
// (before the reduction or prefetches it starts), named after the unit that opened it;
// nested acquires (a block's gradients inside its weights) extend the same span.
// Everything else is forwarded unchanged to `inner`.
// Threads: the model's thread, like the UnitAccess it wraps. Lifetime: `inner`, the
// tracer and the names must outlive it.
#pragma once

#include <string>
#include <vector>

#include "base/trace.h"
#include "nn/device.h"
#include "nn/unit.h"

namespace ferry::runtime {

class TracedUnits final : public nn::UnitAccess {
 public:
  // `compute`: the device the model computes on; where it has a clock (a GPU), spans are
  // timed on the device, not by when the host queued the kernels (review F6).
  TracedUnits(nn::UnitAccess& inner, Tracer& tracer, std::vector<std::string> unit_names, nn::Device& compute)
      : inner_(inner), tracer_(tracer), names_(std::move(unit_names)), compute_(compute) {}

  nn::Tensor acquire_weights(int unit) override {
    nn::Tensor t = inner_.acquire_weights(unit);
    begin(unit);
    return t;
  }
  void release_weights(int unit) override {
    end();
    inner_.release_weights(unit);
  }
  nn::Tensor acquire_grads(int unit) override {
    nn::Tensor t = inner_.acquire_grads(unit);
    begin(unit);
    return t;
  }
  void release_grads(int unit, bool complete) override {
    end();
    inner_.release_grads(unit, complete);
  }

 private:
  void begin(int unit) {
    if (depth_++ > 0) return;
    unit_ = unit;
    t0_ = Tracer::Clock::now();
    if (compute_.clock()) m0_ = compute_.mark();
  }
  void end() {
    if (depth_ == 0 || --depth_ > 0) return;
    if (compute_.clock()) {
      tracer_.record_device(Activity::compute, names_.at(static_cast<size_t>(unit_)), std::move(m0_), compute_.mark());
      return;
    }
    tracer_.record(Activity::compute, names_.at(static_cast<size_t>(unit_)), t0_, Tracer::Clock::now());
  }

  nn::UnitAccess& inner_;
  Tracer& tracer_;
  std::vector<std::string> names_;
  int depth_ = 0;
  int unit_ = -1;
  Tracer::Clock::time_point t0_{};
  nn::Device& compute_;
  DeviceClock::Mark m0_;
};

}  // namespace ferry::runtime
