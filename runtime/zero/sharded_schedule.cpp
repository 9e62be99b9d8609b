// ShardedUnits' step: zeroing gradients, issuing and finishing reductions through the
// ReductionQueue, waiting for the optimizer's updates, and refreshing updated weights.
#include <algorithm>
#include <stdexcept>

#include "runtime/zero/sharded_units.h"

namespace ferry::runtime {

using nn::Tensor;

void ShardedUnits::wait_update(int unit) {
  if (updates_) updates_->wait(unit);
}

int64_t ShardedUnits::live_elements() const {
  int64_t n = 0;
  for (const auto& [u, live] : live_w_) n += live.full.defined() ? live.full.numel() : 0;
  return n;
}

void ShardedUnits::zero_grad_if_needed(int unit) {
  const auto u = static_cast<size_t>(unit);
  if (!zero_pending_[u]) return;
  wait_update(unit);  // the previous step's update may still read this step's buffers
  if (full_g_[u].defined()) dev_.fill(full_g_[u], 0.0);
  if (shard_g_[u].defined()) shard_g_[u].device().fill(shard_g_[u], 0.0);
  zero_pending_[u] = false;
  fresh_[u] = true;
}

void ShardedUnits::zero_grads() {
  for (size_t u = 0; u < parts_.size(); ++u) {
    zero_pending_[u] = true;
    zero_grad_if_needed(static_cast<int>(u));
    reduced_[u] = false;
  }
}

void ShardedUnits::begin_step(int64_t step) {
  prefetch_->cancel();
  order_.begin_step(step);
  std::fill(zero_pending_.begin(), zero_pending_.end(), true);
  std::fill(reported_.begin(), reported_.end(), false);
  std::fill(reduced_.begin(), reduced_.end(), false);
  last_micro_ = false;
  if (order_.recorded()) prefetch_->pump(order_.order(), 0, live_elements());
}

void ShardedUnits::finish_gradients() {
  if (!live_g_.empty()) throw std::logic_error("finish_gradients with unit gradients still in backward");
  if (!policy_.reduce_every_micro) {
    for (size_t u = 0; u < parts_.size(); ++u)
      if (!reduced_[u] && trains(static_cast<int>(u))) issue_reduction(static_cast<int>(u));
  }
  poll_reductions(true);
  if (order_.in_step() && replicas_) {
    std::vector<PendingCollective> across(parts_.size());
    for (size_t u = 0; u < parts_.size(); ++u) {
      const int unit = static_cast<int>(u);
      if (!trains(unit)) continue;
      across[u] = issue_all_reduce(*replicas_, grad_shard(unit), zero_.reduce_bucket_size, name(unit) + " (replicas)");
    }
    for (size_t u = 0; u < parts_.size(); ++u) {
      if (across[u].valid()) across[u].finish(tracer_);
      gradient_done(static_cast<int>(u));
    }
  } else if (order_.in_step()) {
    for (size_t u = 0; u < parts_.size(); ++u)
      if (!reported_[u]) gradient_done(static_cast<int>(u));
  }
  std::fill(reduced_.begin(), reduced_.end(), false);
}

void ShardedUnits::end_step() {
  prefetch_->cancel();
  order_.end_step();
}

void ShardedUnits::mark_updating(int unit) {
  if (!trains(unit)) return;  // nothing in it changes
  // A unit with frozen tensors reads a buffer of its own at stages 0-2 (model_w_): its
  // trainable span is copied in after each update, whatever the dtype.
  if (policy_.refresh_after_update || model_w_.at(static_cast<size_t>(unit)).defined()) {
    stale_.at(static_cast<size_t>(unit)) = true;
  }
  if (node_) node_valid_.at(static_cast<size_t>(unit)) = false;
}

void ShardedUnits::publish_params() {
  if (node_) std::fill(node_valid_.begin(), node_valid_.end(), false);  // the weights were replaced
  if (!policy_.refresh_after_update && !any_frozen_) return;
  prefetch_->cancel();
  for (size_t u = 0; u < parts_.size(); ++u) {
    if (!policy_.refresh_after_update && !model_w_[u].defined()) continue;
    wait_update(static_cast<int>(u));
    refresh(static_cast<int>(u)).finish(tracer_);
    stale_[u] = false;
  }
}

PendingCollective ShardedUnits::refresh(int unit) {
  const auto u = static_cast<size_t>(unit);
  const Partition& p = partition_of(unit);
  if (!trains(unit)) return {};  // frozen: never changes
  const Tensor& target = policy_.compute_copy ? compute_w_[u] : full_w_[u];
  // With frozen tensors the model reads model_w_: the trainable span goes there last.
  const Tensor model = model_w_[u];
  auto to_model = [this, model, target, n = p.numel] { dev_.copy(model.view(0, {n}), target.view(0, {n})); };
  if (!policy_.refresh_gathers) {  // every rank updated the whole unit: only the cast is left
    if (policy_.compute_copy) dev_.cast(target, full_w_[u]);
    if (model.defined()) to_model();
    return {};
  }
  PendingCollective g = issue_weight_gather(comm_, dev_, full_w_[u].view(p.begin(), {p.shard}), target, p,
                                            zero_.allgather_bucket_size, name(unit));
  if (model.defined()) g.then(to_model);
  return g;
}

void ShardedUnits::issue_reduction(int unit) {
  const auto u = static_cast<size_t>(unit);
  Tensor full = full_g_[u];
  if (policy_.reduce_every_micro) {
    auto it = live_g_.find(unit);
    full = it->second.full;
    live_g_.erase(it);  // the full gradient lives on only until its reduction finishes
  }
  // Landing: stage 1's reduce-scattered shard replaces the host copy; stages 2-3
  // accumulate over micro-batches, except the step's first.
  nn::Tensor home;
  bool overwrite = false;
  if (land_) {
    home = shard_g_[u];
    overwrite = !policy_.reduce_every_micro || fresh_[u];
    fresh_[u] = false;
  }
  reductions_.issue(unit, partition_of(unit), full, shard_g_[u], last_micro_ || !order_.in_step(), name(unit), home,
                    overwrite);
  reduced_[u] = true;
}

void ShardedUnits::poll_reductions(bool wait_all) {
  reductions_.poll(
      wait_all,
      [this](int unit, const Tensor& reduced) {
        zero_grad_if_needed(unit);
        const Tensor& shard = shard_g_[static_cast<size_t>(unit)];
        shard.device().accumulate(shard, reduced);
      },
      [this](int unit, bool last) {
        if (last && order_.in_step() && !replicas_) gradient_done(unit);  // replicas: finish_gradients
      });
}

void ShardedUnits::gradient_done(int unit) {
  reported_.at(static_cast<size_t>(unit)) = true;
  if (grads_ready_) grads_ready_(unit);
}

}  // namespace ferry::runtime
