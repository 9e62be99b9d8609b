#include "testing/staged_units.h"

#include <stdexcept>
#include <string>

namespace ferry::testing {

using nn::Tensor;

Tensor StagedUnits::stage(const Tensor& home, const char* what, int unit) {
  if (!home.defined()) return home;  // a unit with nothing trained has no gradient buffer
  if (!home.device().host_accessible()) {
    throw std::invalid_argument(std::string("StagedUnits: unit ") + std::to_string(unit) + "'s " +
                                what + " live on " + home.device().name() +
                                ", which the host cannot read");
  }
  Tensor here = Tensor::empty(compute_, home.dtype(), home.shape());
  compute_.copy_into_new(here, home.data());  // overlaps the kernels still queued
  return here;
}

Tensor StagedUnits::acquire(std::map<int, Staged>& staged, int unit, bool grads) {
  Staged& s = staged[unit];
  if (s.refs == 0) {
    s.home = grads ? home_.acquire_grads(unit) : home_.acquire_weights(unit);
    s.here = stage(s.home, grads ? "gradients" : "weights", unit);
  }
  ++s.refs;
  return s.here;
}

Tensor StagedUnits::acquire_weights(int unit) {
  return acquire(weights_, unit, false);
}

void StagedUnits::release_weights(int unit) {
  auto it = weights_.find(unit);
  if (it == weights_.end())
    throw std::logic_error("StagedUnits: weights of unit " + std::to_string(unit) +
                           " released twice");
  if (--it->second.refs > 0) return;
  weights_.erase(it);
  home_.release_weights(unit);
}

Tensor StagedUnits::acquire_grads(int unit) {
  return acquire(grads_, unit, true);
}

void StagedUnits::release_grads(int unit, bool complete) {
  auto it = grads_.find(unit);
  if (it == grads_.end())
    throw std::logic_error("StagedUnits: gradients of unit " + std::to_string(unit) +
                           " released twice");
  if (--it->second.refs > 0) return;
  if (it->second.home.defined()) {
    compute_.copy_to_host(it->second.home.data(), it->second.here);  // waits for the backward ops that wrote it
  }
  grads_.erase(it);
  home_.release_grads(unit, complete);
}

}  // namespace ferry::testing
