#include "runtime/sharded_units.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace ferry::runtime {

using nn::DType;
using nn::Tensor;

namespace {

float* f32(const Tensor& t) { return t.data_as<float>(); }

Tensor zeroed(nn::Device& dev, int64_t n) {
  Tensor t = Tensor::empty(dev, DType::f32, {n});
  dev.fill(t, 0.0);
  return t;
}

}  // namespace

ShardedUnits::ShardedUnits(nn::Device& device, comm::Communicator& comm, const std::vector<nn::UnitSpec>& units,
                           const ZeroConfig& zero, const std::function<void(int, const Tensor&)>& init,
                           const Placement& placement)
    : dev_(device), comm_(comm), zero_(zero), place_(placement) {
  if (zero.stage < 0 || zero.stage > 3) throw std::invalid_argument("ZeRO stage must be 0..3");
  if (!device.host_accessible()) {
    throw std::invalid_argument("ShardedUnits: the MPI communicator needs a host-accessible device");
  }
  if (place_.params != Tier::device && zero.stage != 3) {
    throw std::invalid_argument("ShardedUnits: parameters move off the device only at stage 3");
  }
  if ((place_.params != Tier::device || place_.grads_on_host) && place_.host == nullptr) {
    throw std::invalid_argument("ShardedUnits: off-device placement needs a host allocator");
  }
  if (place_.params == Tier::nvme && place_.pool == nullptr) {
    throw std::invalid_argument("ShardedUnits: nvme parameters need a pinned pool");
  }
  nn::Device& grad_home = place_.grads_on_host ? *place_.host : dev_;
  const size_t n = units.size();
  full_w_.resize(n);
  full_g_.resize(n);
  shard_g_.resize(n);
  std::vector<int64_t> shard_sizes;
  for (size_t u = 0; u < n; ++u) {
    parts_.push_back(partition(units[u].numel, comm.size(), comm.rank()));
    shard_sizes.push_back(parts_.back().shard);
  }
  if (zero_.stage == 3) init_param_stores(shard_sizes);
  for (size_t u = 0; u < n; ++u) {
    const Partition& p = parts_[u];
    Tensor full = zeroed(dev_, p.padded);
    init(static_cast<int>(u), full.view(0, {p.numel}));
    if (zero_.stage < 3) {
      full_w_[u] = full;
    } else {
      // The shard goes to its tier in pool-sized pieces (aligned, as O_DIRECT wants).
      const int64_t piece = place_.pool ? static_cast<int64_t>(place_.pool->buffer_size() / 4) : p.shard;
      float* staging = place_.pool ? static_cast<float*>(place_.pool->acquire()) : nullptr;
      for (int64_t k = 0; k < p.shard; k += piece) {
        const int64_t len = std::min(piece, p.shard - k);
        const float* src = full.data_as<float>() + p.begin() + k;
        if (staging) std::memcpy(staging, src, static_cast<size_t>(len) * 4), src = staging;
        store(static_cast<int>(u)).write(region(static_cast<int>(u)), k, len, src);
      }
      if (staging) place_.pool->release(staging);
    }
    if (zero_.stage < 2) full_g_[u] = zeroed(dev_, p.padded);
    if (zero_.stage >= 1) shard_g_[u] = zeroed(grad_home, p.shard);
  }
}

// Stage 3: the weight shards' homes. With nvme, the first units' shards up to max_in_cpu
// elements stay in host memory; the rest go to the configured tier.
void ShardedUnits::init_param_stores(const std::vector<int64_t>& shard_sizes) {
  const size_t n = shard_sizes.size();
  const int rank = comm_.rank();
  // With nvme, the first units' shards up to max_in_cpu elements stay in host memory.
  std::vector<int64_t> main_sizes, cpu_sizes;
  std::vector<bool> in_cpu(n, false);
  int64_t cached = 0;
  for (size_t u = 0; u < n; ++u) {
    if (place_.params == Tier::nvme && cached + shard_sizes[u] <= place_.max_in_cpu) {
      in_cpu[u] = true;
      cached += shard_sizes[u];
      cpu_sizes.push_back(shard_sizes[u]);
    } else {
      main_sizes.push_back(shard_sizes[u]);
    }
  }
  std::string warning;
  params_ = std::make_unique<ShardStore>(place_.params, dev_, place_.host ? *place_.host : dev_, main_sizes,
                                         place_.param_paths, "ferry-params-rank" + std::to_string(rank),
                                         place_.aio, &warning, place_.fault);
  if (!cpu_sizes.empty()) {
    params_cpu_ = std::make_unique<ShardStore>(Tier::cpu, dev_, *place_.host, cpu_sizes, std::vector<std::string>{}, "",
                                               place_.aio, nullptr);
  }
  int main_index = 0, cpu_index = 0;
  for (size_t u = 0; u < n; ++u) {
    home_.emplace_back(in_cpu[u] ? params_cpu_.get() : params_.get(), in_cpu[u] ? cpu_index++ : main_index++);
  }
  if (!warning.empty()) std::fprintf(stderr, "[ferry r%d] warning: parameters: %s\n", rank, warning.c_str());
  if (place_.params == Tier::nvme) {
    const std::string why = params_->use_pool(*place_.pool);
    if (!why.empty()) std::fprintf(stderr, "[ferry r%d] warning: parameters: no fixed buffers: %s\n", rank, why.c_str());
  }
  if (place_.params == Tier::nvme && place_.prefetch_depth > 0) {
    swapper_ = std::make_unique<offload::Swapper>(*place_.pool, place_.prefetch_depth);
  }
}

Tensor ShardedUnits::fetch_shard(int unit) {
  const Partition& p = partition_of(unit);
  if (store(unit).tier() != Tier::nvme) return store(unit).tensor(region(unit));
  Tensor shard = Tensor::empty(dev_, DType::f32, {p.shard});
  const int64_t piece = static_cast<int64_t>(place_.pool->buffer_size() / 4);
  if (auto it = prefetched_.find(unit); it != prefetched_.end()) {
    const offload::Swapper::Ticket t = it->second;
    prefetched_.erase(it);
    void* buf = swapper_->wait(t);
    std::memcpy(shard.data(), buf, static_cast<size_t>(p.shard) * 4);
    swapper_->release(buf);
    ++prefetch_hits_;
  } else {
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
  }
  // Keep the recorded order; from the second step on, start the next units' reads.
  if (recording_) {
    order_.push_back(unit);
  } else if (position_ < order_.size() && order_[position_] == unit) {
    prefetch_from(++position_);
  } else {
    cancel_prefetches();  // another sequence (evaluation, sampling): no guesses
    position_ = order_.size();
  }
  return shard;
}

void ShardedUnits::prefetch_from(size_t position) {
  if (!swapper_) return;
  const int64_t piece = static_cast<int64_t>(place_.pool->buffer_size() / 4);
  for (size_t k = position; k < std::min(order_.size(), position + static_cast<size_t>(place_.prefetch_depth)); ++k) {
    const int u = order_[k];
    const int64_t n = partition_of(u).shard;
    if (prefetched_.count(u) || n > piece || store(u).tier() != Tier::nvme) continue;  // coming, too large, or in memory
    const int r = region(u);
    prefetched_[u] = swapper_->submit([this, r, n](void* buf) { params_->read(r, 0, n, static_cast<float*>(buf)); });
  }
}

void ShardedUnits::cancel_prefetches() {
  for (const auto& [u, t] : prefetched_) swapper_->cancel(t);
  prefetched_.clear();
}

void ShardedUnits::read_owned_weights(int unit, int64_t offset, int64_t n, float* buf) {
  const Owned o = owned(unit);
  if (offset < 0 || offset + n > o.length) throw std::out_of_range("read_owned_weights outside the owned range");
  if (zero_.stage == 3) return store(unit).read(region(unit), offset, n, buf);
  std::memcpy(buf, o.weights.data_as<float>() + offset, static_cast<size_t>(n) * 4);
}

void ShardedUnits::write_owned_weights(int unit, int64_t offset, int64_t n, const float* buf) {
  if (auto it = prefetched_.find(unit); it != prefetched_.end()) {  // stale now
    swapper_->cancel(it->second);
    prefetched_.erase(it);
  }
  const Owned o = owned(unit);
  if (offset < 0 || offset + n > o.length) throw std::out_of_range("write_owned_weights outside the owned range");
  if (zero_.stage == 3) return store(unit).write(region(unit), offset, n, buf);
  std::memcpy(o.weights.data_as<float>() + offset, buf, static_cast<size_t>(n) * 4);
}

Tensor ShardedUnits::acquire_weights(int unit) {
  const Partition& p = partition_of(unit);
  if (zero_.stage < 3) return full_w_[static_cast<size_t>(unit)].view(0, {p.numel});
  Live& live = live_w_[unit];
  if (live.refs++ == 0) {
    live.full = Tensor::empty(dev_, DType::f32, {p.padded});
    gather(fetch_shard(unit), live.full, p);
  }
  return live.full.view(0, {p.numel});
}

void ShardedUnits::release_weights(int unit) {
  if (zero_.stage < 3) return;
  auto it = live_w_.find(unit);
  if (it == live_w_.end()) throw std::logic_error("release_weights of a unit not acquired: " + std::to_string(unit));
  if (--it->second.refs == 0) live_w_.erase(it);  // frees the gathered weights
}

Tensor ShardedUnits::acquire_grads(int unit) {
  const Partition& p = partition_of(unit);
  if (zero_.stage < 2) return full_g_[static_cast<size_t>(unit)].view(0, {p.numel});
  Live& live = live_g_[unit];
  if (!live.full.defined()) live.full = zeroed(dev_, p.padded);
  return live.full.view(0, {p.numel});
}

void ShardedUnits::release_grads(int unit, bool complete) {
  if (zero_.stage < 2 || !complete) return;  // a tied unit keeps its buffer until its last use
  auto it = live_g_.find(unit);
  if (it == live_g_.end()) throw std::logic_error("release_grads of a unit not acquired: " + std::to_string(unit));
  const Partition& p = partition_of(unit);
  const Tensor reduced = Tensor::empty(dev_, DType::f32, {p.shard});
  reduce_scatter(it->second.full, reduced, p);
  live_g_.erase(it);  // the full gradient is gone; only the shard stays
  dev_.accumulate(shard_g_[static_cast<size_t>(unit)], reduced);
}

ShardedUnits::Owned ShardedUnits::owned(int unit) const {
  const auto u = static_cast<size_t>(unit);
  const Partition& p = partition_of(unit);
  switch (zero_.stage) {
    case 0: return {0, p.padded, full_w_[u], full_g_[u]};
    case 1:
    case 2: return {p.begin(), p.shard, full_w_[u].view(p.begin(), {p.shard}), shard_g_[u]};
    default: return {p.begin(), p.shard, store(unit).tensor(region(unit)), shard_g_[u]};
  }
}

Tensor ShardedUnits::grad_shard(int unit) const {
  const Partition& p = partition_of(unit);
  if (zero_.stage == 0) return full_g_[static_cast<size_t>(unit)].view(p.begin(), {p.shard});
  return shard_g_[static_cast<size_t>(unit)];
}

void ShardedUnits::zero_grads() {
  if (swapper_) {
    // Step boundary: weights changed in the optimizer step, so nothing read before is kept.
    cancel_prefetches();
    recording_ = order_.empty();
    position_ = 0;
    if (!recording_) prefetch_from(0);
  }
  for (const Tensor& g : full_g_)
    if (g.defined()) dev_.fill(g, 0.0);
  for (const Tensor& g : shard_g_)
    if (g.defined()) dev_.fill(g, 0.0);
}

void ShardedUnits::finish_gradients() {
  if (!live_g_.empty()) throw std::logic_error("finish_gradients with unit gradients still in backward");
  for (size_t u = 0; u < parts_.size(); ++u) {
    if (zero_.stage == 0) all_reduce(full_g_[u]);
    if (zero_.stage == 1) reduce_scatter(full_g_[u], shard_g_[u], parts_[u]);
  }
}

void ShardedUnits::publish_params() {
  if (zero_.stage != 1 && zero_.stage != 2) return;
  for (size_t u = 0; u < parts_.size(); ++u) {
    const Partition& p = parts_[u];
    gather(full_w_[u].view(p.begin(), {p.shard}), full_w_[u], p);
  }
}

std::vector<float> ShardedUnits::full_weights(int unit) {
  const Partition& p = partition_of(unit);
  std::vector<float> out(static_cast<size_t>(p.numel));
  const Tensor w = acquire_weights(unit);
  dev_.copy_to_host(out.data(), w);
  release_weights(unit);
  return out;
}

StateBytes ShardedUnits::state_bytes() const {
  StateBytes s;
  if (params_) s.weights += params_->bytes();
  if (params_cpu_) s.weights += params_cpu_->bytes();
  for (size_t u = 0; u < parts_.size(); ++u) {
    s.weights += full_w_[u].defined() ? full_w_[u].nbytes() : 0;
    s.gradients += (full_g_[u].defined() ? full_g_[u].nbytes() : 0) + (shard_g_[u].defined() ? shard_g_[u].nbytes() : 0);
  }
  return s;
}

// Bucketed collectives. A chunk of c elements per rank moves W * c elements in all; when a
// unit's shard exceeds the bucket, the ranks' slices [r * S + c0, r * S + c0 + c) are packed
// into one contiguous buffer so that each call stays a single MPI collective.
void ShardedUnits::gather(const Tensor& shard, const Tensor& full, const Partition& p) {
  const int64_t W = p.world, S = p.shard;
  const int64_t len = std::clamp<int64_t>(zero_.allgather_bucket_size / W, 1, S);
  if (len == S) {
    comm_.all_gather(shard.data(), full.data(), static_cast<size_t>(S), comm::DataType::f32)->wait();
    return;
  }
  const Tensor pack = Tensor::empty(dev_, DType::f32, {W * len});
  for (int64_t c0 = 0; c0 < S; c0 += len) {
    const int64_t c = std::min(len, S - c0);
    comm_.all_gather(f32(shard) + c0, pack.data(), static_cast<size_t>(c), comm::DataType::f32)->wait();
    for (int64_t r = 0; r < W; ++r) std::memcpy(f32(full) + r * S + c0, f32(pack) + r * c, static_cast<size_t>(c) * 4);
  }
}

void ShardedUnits::reduce_scatter(const Tensor& full, const Tensor& shard, const Partition& p) {
  const int64_t W = p.world, S = p.shard;
  const int64_t len = std::clamp<int64_t>(zero_.reduce_bucket_size / W, 1, S);
  if (len == S) {
    comm_.reduce_scatter(full.data(), shard.data(), static_cast<size_t>(S), comm::DataType::f32, comm::ReduceOp::sum)
        ->wait();
    return;
  }
  const Tensor pack = Tensor::empty(dev_, DType::f32, {W * len});
  for (int64_t c0 = 0; c0 < S; c0 += len) {
    const int64_t c = std::min(len, S - c0);
    for (int64_t r = 0; r < W; ++r) std::memcpy(f32(pack) + r * c, f32(full) + r * S + c0, static_cast<size_t>(c) * 4);
    comm_.reduce_scatter(pack.data(), f32(shard) + c0, static_cast<size_t>(c), comm::DataType::f32, comm::ReduceOp::sum)
        ->wait();
  }
}

void ShardedUnits::all_reduce(const Tensor& full) {
  const int64_t n = full.numel();
  const int64_t len = std::clamp<int64_t>(zero_.reduce_bucket_size, 1, n);
  for (int64_t c0 = 0; c0 < n; c0 += len) {
    const int64_t c = std::min(len, n - c0);
    comm_.all_reduce(f32(full) + c0, static_cast<size_t>(c), comm::DataType::f32, comm::ReduceOp::sum)->wait();
  }
}

}  // namespace ferry::runtime
