// ShardedUnits' overlapped schedule: fetching units ahead of use, gradient reductions in
// flight, waiting for the optimizer's updates, and the compute spans of the trace.
#include <algorithm>
#include <cstring>

#include "base/log.h"
#include "runtime/zero/sharded_units.h"

namespace ferry::runtime {

using nn::DType;
using nn::Tensor;

void ShardedUnits::wait_update(int unit) {
  if (updates_) updates_->wait(unit);
}

bool ShardedUnits::update_ready(int unit) { return updates_ == nullptr || updates_->ready(unit); }

Tensor ShardedUnits::read_shard(int unit) {
  const Partition& p = partition_of(unit);
  if (store(unit).tier() != offload::Tier::nvme) return store(unit).tensor(region(unit));
  Tensor shard = Tensor::empty(dev_, DType::f32, {p.shard});
  const int64_t piece = static_cast<int64_t>(place_.pool->buffer_size() / 4);
  Tracer::Span span(tracer_, Activity::param_read, name(unit), static_cast<uint64_t>(p.shard) * 4);
  float* staging = static_cast<float*>(place_.pool->acquire());
  try {
    for (int64_t k = 0; k < p.shard; k += piece) {
      const int64_t len = std::min(piece, p.shard - k);
      params_->read(region(unit), k, len, staging);
      std::memcpy(shard.data_as<float>() + k, staging, static_cast<size_t>(len) * 4);
    }
  } catch (...) {
    place_.pool->release(staging);
    throw;
  }
  place_.pool->release(staging);
  return shard;
}

void ShardedUnits::start_read(Flight& f) {
  const int r = region(f.unit);
  const int64_t n = partition_of(f.unit).shard;
  const std::string label = name(f.unit);
  f.read = swapper_->submit([this, r, n, label](void* buf) {
    Tracer::Span span(tracer_, Activity::param_read, label, static_cast<uint64_t>(n) * 4);
    params_->read(r, 0, n, static_cast<float*>(buf));
  });
}

Tensor ShardedUnits::take_read(Flight& f) {
  const int64_t n = partition_of(f.unit).shard;
  void* buf = swapper_->wait(f.read);
  f.read = 0;
  f.shard = Tensor::empty(dev_, DType::f32, {n});
  std::memcpy(f.shard.data(), buf, static_cast<size_t>(n) * 4);
  swapper_->release(buf);
  return f.shard;
}

PendingCollective ShardedUnits::issue_gather(int unit, const Tensor& shard, const Tensor& full) {
  const Partition& p = partition_of(unit);
  if (shard.dtype() == full.dtype()) {
    return issue_all_gather(comm_, dev_, shard, full, p, zero_.allgather_bucket_size, name(unit));
  }
  // Mixed precision: only this rank's slice is cast, and the gather moves two-byte values.
  if (p.world == 1) {  // the cast is the whole gather; a no-op collective marks it done
    dev_.cast(full.view(0, {p.shard}), shard);
    return issue_all_gather(comm_, dev_, full, full, p, zero_.allgather_bucket_size, name(unit));
  }
  const Tensor low = Tensor::empty(dev_, full.dtype(), {p.shard});
  dev_.cast(low, shard);
  return issue_all_gather(comm_, dev_, low, full, p, zero_.allgather_bucket_size, name(unit));
}

int64_t ShardedUnits::gathered_elements() const {
  int64_t n = 0;
  for (const auto& [u, live] : live_w_) n += live.full.defined() ? live.full.numel() : 0;
  for (const auto& [pos, f] : flights_) n += f.gather.valid() || f.full.defined() ? f.full.numel() : 0;
  return n;
}

// Two windows past `next`, the first position not yet used:
// - gathers (collectives) for [next, next + max(1, depth - 1)): decided only from the
//   recorded order, the sizes and the budgets, so that every rank issues the same
//   collectives in the same order; a shard still being read is waited for here.
// - nvme reads for [next, next + depth): local, started only when the unit has no update
//   pending (they never block on the optimizer).
void ShardedUnits::pump(size_t next) {
  const std::vector<int>& order = order_.order();
  const auto depth = static_cast<size_t>(std::max(0, place_.prefetch_depth));
  if (depth == 0) return;
  if (zero_.overlap_comm) {
    const size_t gather_end = std::min(order.size(), next + std::max<size_t>(1, depth - 1));
    int64_t ahead = 0;
    for (const auto& [pos, f] : flights_) ahead += f.full.defined() ? f.full.numel() : 0;
    for (size_t k = next; k < gather_end; ++k) {
      const int unit = order[k];
      const auto u = static_cast<size_t>(unit);
      const Partition& p = partition_of(unit);
      auto it = flights_.find(k);
      if (it != flights_.end() && it->second.gather.valid()) continue;
      if (zero_.stage < 3) {
        if (!stale_[u] || zero_.stage == 0) continue;  // nothing to gather (stage 0 casts at use)
        wait_update(unit);
        Flight& f = flights_[k];
        f.unit = unit;
        f.full = low() ? compute_w_[u] : full_w_[u];
        f.gather = refresh(unit);
        stale_[u] = false;
        continue;
      }
      if (ahead + p.padded > zero_.prefetch_bucket_size ||
          gathered_elements() + p.padded > zero_.max_live_parameters) {
        break;
      }
      const bool nvme = store(unit).tier() == offload::Tier::nvme;
      if (nvme && !swapper_ && it == flights_.end()) break;  // no reads ahead: fetched at use
      if (nvme && it == flights_.end() && p.shard > static_cast<int64_t>(place_.pool->buffer_size() / 4)) break;
      Flight& f = flights_[k];
      f.unit = unit;
      if (nvme && !f.read && !f.shard.defined()) {
        wait_update(unit);
        start_read(f);
      }
      if (!nvme) {
        wait_update(unit);
        f.shard = store(unit).tensor(region(unit));
      }
      const Tensor shard = f.read ? take_read(f) : f.shard;
      // Alone and in fp32, the shard is the unit.
      f.full = p.world == 1 && !low() ? shard : Tensor::empty(dev_, zero_.compute, {p.padded});
      f.gather = issue_gather(unit, shard, f.full);
      ahead += p.padded;
      if (log::enabled(log::Level::trace, log::Subsys::sched)) {
        log::trace(log::Subsys::sched, "position " + std::to_string(next) + ": all-gather of " + name(unit) +
                                           " (position " + std::to_string(k) + ") issued ahead, " +
                                           std::to_string(ahead) + " elements in flight");
      }
    }
  }
  if (zero_.stage == 3 && swapper_ && place_.overlap_io) {
    const int64_t piece = static_cast<int64_t>(place_.pool->buffer_size() / 4);
    for (size_t k = next; k < std::min(order.size(), next + depth); ++k) {
      const int unit = order[k];
      if (flights_.count(k)) continue;
      if (store(unit).tier() != offload::Tier::nvme) continue;  // in memory: nothing to read
      if (partition_of(unit).shard > piece || !update_ready(unit)) break;
      Flight& f = flights_[k];
      f.unit = unit;
      start_read(f);
      if (log::enabled(log::Level::trace, log::Subsys::sched)) {
        log::trace(log::Subsys::sched, "position " + std::to_string(next) + ": nvme read of " + name(unit) +
                                           " (position " + std::to_string(k) + ") started ahead");
      }
    }
  }
}

void ShardedUnits::cancel_flights() {
  for (auto& [pos, f] : flights_) {
    if (f.read) swapper_->cancel(f.read);
    f.read = 0;
  }
  flights_.clear();  // gathers in flight are waited for by their destructors
}

void ShardedUnits::issue_reduction(int unit) {
  const auto u = static_cast<size_t>(unit);
  const Partition& p = partition_of(unit);
  const std::string& unit_name = name(unit);
  Reduction r;
  r.unit = unit;
  r.last = last_micro_ || !order_.in_step();
  if (zero_.stage >= 2) {
    auto it = live_g_.find(unit);
    r.full = it->second.full;
    live_g_.erase(it);  // the full gradient lives on only until its reduction finishes
    r.reduced = p.world == 1 ? r.full : Tensor::empty(dev_, DType::f32, {p.shard});  // alone: nothing to reduce
    r.work = issue_reduce_scatter(comm_, dev_, r.full, r.reduced, p, zero_.reduce_bucket_size, unit_name);
  } else if (zero_.stage == 1) {
    r.work = issue_reduce_scatter(comm_, dev_, full_g_[u], shard_g_[u], p, zero_.reduce_bucket_size, unit_name);
  } else {
    r.work = issue_all_reduce(comm_, full_g_[u], zero_.reduce_bucket_size, unit_name);
  }
  reduced_[u] = true;
  reductions_.push_back(std::move(r));
}

void ShardedUnits::poll_reductions(bool wait_all) {
  while (!reductions_.empty() && (wait_all || reductions_.front().work.done())) {
    Reduction& r = reductions_.front();
    r.work.finish(tracer_);
    if (r.reduced.defined()) {
      zero_grad_if_needed(r.unit);
      dev_.accumulate(shard_g_[static_cast<size_t>(r.unit)], r.reduced);
    }
    const int unit = r.unit;
    const bool last = r.last;
    reductions_.pop_front();
    if (last && order_.in_step()) gradient_done(unit);
  }
}

void ShardedUnits::gradient_done(int unit) {
  reported_.at(static_cast<size_t>(unit)) = true;
  if (grads_ready_) grads_ready_(unit);
}

void ShardedUnits::compute_begin(int unit) {
  if (compute_depth_++ > 0) return;
  compute_unit_ = unit;
  compute_t0_ = Tracer::Clock::now();
}

void ShardedUnits::compute_end() {
  if (compute_depth_ == 0 || --compute_depth_ > 0) return;
  if (tracer_) tracer_->record(Activity::compute, name(compute_unit_), compute_t0_, Tracer::Clock::now());
}

}  // namespace ferry::runtime
