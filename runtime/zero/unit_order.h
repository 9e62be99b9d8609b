// UnitOrder: the order in which a training step uses the model's units, recorded on the
// first step and enforced on every later one, because the prefetcher fetches and gathers
// units ahead of use in that order and every rank must issue the same collectives in the
// same order.
//
// An event is a unit's weights or gradients going from unused to used (the model's
// acquire). During the recording step every event is checked across ranks as it happens
// (a small all_gather of the unit index, so a rank that takes another path is caught
// before the collectives of different units could mismatch); at its end, one more
// exchange checks that every rank used the same number of units. On later steps each
// event is compared with the recorded order locally. Either failure throws OrderError
// naming the step, the position, the unit (index and name) and the rank(s).
// Outside a step (evaluation, sampling, checkpoints) nothing is recorded or checked.
// Threads: the training thread; the recording step's checks are collective.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace ferry::runtime {

class OrderError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class UnitOrder {
 public:
  UnitOrder(std::vector<std::string> unit_names, comm::Communicator& comm);

  void begin_step(int64_t step);  // 1-based
  // Notes that `unit` is used next; returns its position in the step. Throws OrderError.
  size_t next(int unit);
  void end_step();  // throws OrderError when the step used fewer units than recorded
  bool in_step() const { return in_step_; }
  bool recorded() const { return recorded_; }
  const std::vector<int>& order() const { return order_; }
  size_t position() const { return position_; }  // events so far in this step
  const std::string& unit_name(int u) const { return names_.at(static_cast<size_t>(u)); }

 private:
  std::string unit(int u) const;
  void check_across_ranks(int unit);  // -1: the step's end

  std::vector<std::string> names_;
  comm::Communicator& comm_;
  std::vector<int> order_;
  bool recorded_ = false, in_step_ = false;
  int64_t step_ = 0, recorded_step_ = 0;
  size_t position_ = 0;
};

}  // namespace ferry::runtime
