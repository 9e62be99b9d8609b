#include "runtime/zero/unit_order.h"

namespace ferry::runtime {

UnitOrder::UnitOrder(std::vector<std::string> unit_names, comm::Communicator& comm)
    : names_(std::move(unit_names)), comm_(comm) {}

std::string UnitOrder::unit(int u) const {
  if (u < 0) return "no unit (its step had ended)";
  return "unit " + std::to_string(u) + " (" + names_.at(static_cast<size_t>(u)) + ")";
}

void UnitOrder::begin_step(int64_t step) {
  step_ = step;
  in_step_ = true;
  position_ = 0;
}

void UnitOrder::check_across_ranks(int u) {
  if (comm_.size() == 1) return;
  std::vector<int32_t> all(static_cast<size_t>(comm_.size()));
  const int32_t mine = u;
  comm_.all_gather(&mine, all.data(), 1, comm::DataType::i32)->wait();
  for (int r = 0; r < comm_.size(); ++r) {
    if (all[static_cast<size_t>(r)] == all[0]) continue;
    throw OrderError("the unit execution order differs between ranks: at position " + std::to_string(position_) +
                     " of step " + std::to_string(step_) + ", rank 0 uses " + unit(all[0]) + " and rank " +
                     std::to_string(r) + " uses " + unit(all[static_cast<size_t>(r)]) +
                     "; every rank must run the model's units in the same order");
  }
}

size_t UnitOrder::next(int u) {
  if (!in_step_) return 0;
  const size_t pos = position_;
  if (!recorded_) {
    check_across_ranks(u);
    order_.push_back(u);
  } else if (pos >= order_.size() || order_[pos] != u) {
    throw OrderError("the unit execution order changed: in step " + std::to_string(step_) + ", rank " +
                     std::to_string(comm_.rank()) + " uses " + unit(u) + " at position " + std::to_string(pos) +
                     " where step " + std::to_string(recorded_step_) + " used " +
                     (pos < order_.size() ? unit(order_[pos]) : std::string("no unit (its step had ended)")) +
                     "; ferry fetches units ahead in the recorded order, so every step must use them in the same order");
  }
  ++position_;
  return pos;
}

void UnitOrder::end_step() {
  if (!in_step_) return;
  in_step_ = false;
  if (!recorded_) {
    check_across_ranks(-1);
    recorded_ = true;
    recorded_step_ = step_;
    return;
  }
  if (position_ != order_.size()) {
    throw OrderError("the unit execution order changed: step " + std::to_string(step_) + " on rank " +
                     std::to_string(comm_.rank()) + " used " + std::to_string(position_) + " units where step " +
                     std::to_string(recorded_step_) + " used " + std::to_string(order_.size()) + "; the first missing is " +
                     unit(order_[position_]));
  }
}

}  // namespace ferry::runtime
