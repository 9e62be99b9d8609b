#include "runtime/zero/stage_policy.h"

#include <stdexcept>

namespace ferry::runtime {

StagePolicy StagePolicy::of(int stage, nn::DType compute) {
  if (stage < 0 || stage > 3) throw std::invalid_argument("ZeRO stage must be 0..3, got " + std::to_string(stage));
  const bool low = nn::is_low_precision(compute);
  StagePolicy p;
  p.stage = stage;
  p.full_weights = stage < 3;
  p.sharded_weights = stage == 3;
  p.compute_copy = stage < 3 && low;
  p.full_grads = stage < 2;
  p.grad_shard = stage >= 1;
  p.reduction = stage == 0 ? ReduceKind::all_reduce : ReduceKind::reduce_scatter;
  p.reduce_every_micro = stage >= 2;
  p.updates_whole_unit = stage == 0;
  p.refresh_gathers = stage == 1 || stage == 2;
  p.refresh_after_update = p.refresh_gathers || (stage == 0 && low);
  return p;
}

std::string StagePolicy::describe() const {
  auto yn = [](bool b) { return b ? "yes" : "no"; };
  return "stage " + std::to_string(stage) + ": full weights " + yn(full_weights) + ", sharded weights " +
         yn(sharded_weights) + ", compute copy " + yn(compute_copy) + ", full grads " + yn(full_grads) +
         ", grad shard " + yn(grad_shard) + ", " +
         (reduction == ReduceKind::all_reduce ? "all-reduce" : "reduce-scatter") +
         (reduce_every_micro ? " every micro-batch" : " in the last micro-batch") + ", updates " +
         (updates_whole_unit ? "the whole unit" : "its shard") + ", refresh after update " +
         yn(refresh_after_update) + (refresh_gathers ? " (gather)" : "");
}

}  // namespace ferry::runtime
