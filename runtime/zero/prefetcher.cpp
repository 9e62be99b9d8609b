#include "runtime/zero/prefetcher.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "base/log.h"

namespace ferry::runtime {

using nn::DType;
using nn::Tensor;

Prefetcher::Prefetcher(const StagePolicy& policy, const PrefetchLimits& limits, nn::Device& device,
                       comm::Communicator& comm, std::vector<UnitPartition> parts, std::vector<std::string> names,
                       ParamShards* shards, offload::PinnedPool* pool, RefreshAhead refresh)
    : policy_(policy),
      limits_(limits),
      dev_(device),
      comm_(comm),
      parts_(std::move(parts)),
      names_(std::move(names)),
      shards_(shards),
      pool_(pool),
      refresh_(std::move(refresh)) {
  if (policy_.sharded_weights && shards_ == nullptr) throw std::invalid_argument("Prefetcher: stage 3 needs the shards");
  if (limits_.nvme_reads && limits_.depth > 0) {
    if (pool_ == nullptr) throw std::invalid_argument("Prefetcher: nvme reads ahead need a pinned pool");
    swapper_ = std::make_unique<offload::Swapper>(*pool_, limits_.depth);
  }
}

Prefetcher::~Prefetcher() { cancel(); }

void Prefetcher::pump(const std::vector<int>& order, size_t next, int64_t live) {
  reap(/*all=*/false);
  const auto depth = static_cast<size_t>(std::max(0, limits_.depth));
  if (depth == 0) return;
  if (limits_.overlap_comm) pump_gathers(order, next, depth, live);
  if (policy_.sharded_weights && swapper_) pump_reads(order, next, depth);
}

void Prefetcher::pump_gathers(const std::vector<int>& order, size_t next, size_t depth, int64_t live) {
  const size_t gather_end = std::min(order.size(), next + std::max<size_t>(1, depth - 1));
  int64_t ahead = elements_ahead();
  for (size_t k = next; k < gather_end; ++k) {
    const int unit = order[k];
    const int64_t gathered = part(unit).gathered();
    auto it = flights_.find(k);
    if (it != flights_.end() && it->second.gather.valid()) continue;
    if (!policy_.sharded_weights) {
      if (!policy_.refresh_gathers) continue;  // stage 0 casts at use
      std::optional<PendingCollective> g = refresh_(unit);
      if (!g) continue;  // fresh: nothing to gather
      Flight& f = flights_[k];
      f.unit = unit;
      f.gather = std::move(*g);
      continue;
    }
    if (ahead + gathered > limits_.bucket || live + ahead + gathered > limits_.max_live) break;
    if (from_node(unit)) {
      Flight& f = flights_[k];
      f.unit = unit;
      issue(f);
      ahead += gathered;
      continue;
    }
    const bool nvme = shards_->on_nvme(unit);
    if (nvme && it == flights_.end() && (!swapper_ || part(unit).stored() > shards_->buffer_elements())) {
      break;  // no read ahead for it: fetched at use
    }
    Flight& f = flights_[k];
    f.unit = unit;
    if (nvme && !f.read && !f.shard.defined()) {
      wait_update(unit);
      start_read(f);
    }
    if (!nvme) {
      wait_update(unit);
      f.shard = shards_->fetch(unit);  // in place, or uploaded from host memory (a GPU)
    }
    issue(f);
    ahead += gathered;
    if (log::enabled(log::Level::trace, log::Subsys::sched)) {
      log::trace(log::Subsys::sched, "position " + std::to_string(next) + ": all-gather of " + names_[static_cast<size_t>(unit)] +
                                         " (position " + std::to_string(k) + ") issued ahead, " +
                                         std::to_string(ahead) + " elements in flight");
    }
  }
}

void Prefetcher::pump_reads(const std::vector<int>& order, size_t next, size_t depth) {
  for (size_t k = next; k < std::min(order.size(), next + depth); ++k) {
    const int unit = order[k];
    if (flights_.count(k)) continue;
    if (!shards_->on_nvme(unit) || from_node(unit)) continue;  // in memory: nothing to read
    if (part(unit).stored() > shards_->buffer_elements() || !update_ready(unit)) break;
    Flight& f = flights_[k];
    f.unit = unit;
    start_read(f);
    if (log::enabled(log::Level::trace, log::Subsys::sched)) {
      log::trace(log::Subsys::sched, "position " + std::to_string(next) + ": nvme read of " + names_[static_cast<size_t>(unit)] +
                                         " (position " + std::to_string(k) + ") started ahead");
    }
  }
}

void Prefetcher::start_read(Flight& f) {
  // submit takes a pool buffer: those whose upload has finished go back first, and only
  // when the pool is spent does the host wait for the oldest upload (a GPU run).
  reap(/*all=*/false);
  while (!retired_.empty() && pool_->in_use() >= pool_->buffer_count()) reap_oldest();
  const int unit = f.unit;
  ParamShards* shards = shards_;
  const Tracer::Clock::time_point queued = Tracer::Clock::now();
  f.read = swapper_->submit([shards, unit, queued](void* buf) { shards->read_into(unit, buf, queued); });
}

Tensor Prefetcher::take_read(Flight& f) {
  const int64_t n = part(f.unit).stored();
  offload::PooledBuffer buf(*pool_, swapper_->wait(f.read));  // back to the pool on every path
  f.read = 0;
  f.shard = Tensor::empty(dev_, shards_->dtype(), {n});
  if (dev_.host_accessible()) {
    pool_->copy(f.shard.data(), buf.get(), f.shard.nbytes());
  } else {
    // Up from the page-locked buffer on the copy stream; the buffer goes back to the pool
    // once the copy is done (reap), never with the host waiting for it here.
    nn::TransferPtr upload = shards_->upload(f.unit, f.shard, buf.get());
    retired_.emplace_back(std::move(buf), std::move(upload));
  }
  return f.shard;
}

void Prefetcher::reap(bool all) {
  while (!retired_.empty() && (all || retired_.front().second->done())) reap_oldest();
}

void Prefetcher::reap_oldest() {
  auto [buf, upload] = std::move(retired_.front());
  retired_.pop_front();
  upload->wait();  // the buffer goes back to the pool as `buf` ends, also when this throws
}

void Prefetcher::issue(Flight& f) {
  const UnitPartition& p = part(f.unit);
  if (from_node(f.unit)) {
    if (f.read) swapper_->cancel(f.read);  // read ahead before the node copy was made
    f.read = 0;
    f.shard = Tensor{};
    f.gather = node_gather_(f.unit, &f.full);
    return;
  }
  const Tensor shard = f.read ? take_read(f) : f.shard;
  UnitGather g = issue_unit_gather(comm_, dev_, shard, p, limits_.compute, limits_.allgather_bucket,
                                   names_[static_cast<size_t>(f.unit)]);
  f.full = g.full;
  f.gather = std::move(g.pending);
}

std::optional<Tensor> Prefetcher::take(size_t position) {
  auto it = flights_.find(position);
  if (it == flights_.end()) return std::nullopt;
  Flight& f = it->second;
  if (!f.gather.valid() && policy_.sharded_weights) issue(f);  // read ahead only: gathered now
  if (f.gather.valid()) f.gather.finish(tracer_);
  Tensor full = f.full;
  flights_.erase(it);
  ++hits_;
  return full;
}

void Prefetcher::cancel() {
  for (auto& [pos, f] : flights_) {
    if (f.read) swapper_->cancel(f.read);
    f.read = 0;
  }
  while (!retired_.empty()) {
    try {
      reap_oldest();
    } catch (...) {  // a failed upload surfaces at the device's next use; the buffer went back
    }
  }
  flights_.clear();  // gathers in flight are waited for by their destructors
}

std::vector<Prefetcher::FlightView> Prefetcher::flights() const {
  std::vector<FlightView> out;
  for (const auto& [pos, f] : flights_) out.push_back({pos, f.unit, f.read != 0, f.gather.valid()});
  return out;
}

int64_t Prefetcher::elements_ahead() const {
  int64_t n = 0;
  for (const auto& [pos, f] : flights_) n += f.full.defined() ? f.full.numel() : 0;
  return n;
}

}  // namespace ferry::runtime
