#include "runtime/zero/sharded_units.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "base/log.h"

namespace ferry::runtime {

using nn::DType;
using nn::Tensor;

namespace {

Tensor zeroed(nn::Device& dev, int64_t n) {
  Tensor t = Tensor::empty(dev, DType::f32, {n});
  dev.fill(t, 0.0);
  return t;
}

std::vector<std::string> unit_names(const std::vector<nn::UnitSpec>& units) {
  std::vector<std::string> names;
  for (const auto& u : units) names.push_back(u.name);
  return names;
}

}  // namespace

ShardedUnits::ShardedUnits(nn::Device& device, comm::Communicator& comm, const std::vector<nn::UnitSpec>& units,
                           const ZeroConfig& zero, const std::function<void(int, const Tensor&)>& init,
                           const Placement& placement)
    : dev_(device), comm_(comm), zero_(zero), place_(placement), order_(unit_names(units), comm) {
  if (zero.stage < 0 || zero.stage > 3) throw std::invalid_argument("ZeRO stage must be 0..3");
  if (!device.host_accessible() && (place_.params != offload::Tier::device || place_.grads_on_host)) {
    throw std::invalid_argument("ShardedUnits: offloaded states need a host-accessible device (" + device.name() +
                                " is not); offload runs compute on a GPU through nn::StagedUnits");
  }
  if (place_.params != offload::Tier::device && zero.stage != 3) {
    throw std::invalid_argument("ShardedUnits: parameters move off the device only at stage 3");
  }
  if ((place_.params != offload::Tier::device || place_.grads_on_host) && place_.host == nullptr) {
    throw std::invalid_argument("ShardedUnits: off-device placement needs a host allocator");
  }
  if (place_.params == offload::Tier::nvme && place_.pool == nullptr) {
    throw std::invalid_argument("ShardedUnits: nvme parameters need a pinned pool");
  }
  nn::Device& grad_home = place_.grads_on_host ? *place_.host : dev_;
  const size_t n = units.size();
  if (zero.compute != DType::f32 && !nn::is_low_precision(zero.compute)) {
    throw std::invalid_argument("ShardedUnits: compute weights are f32, bf16 or f16");
  }
  full_w_.resize(n);
  compute_w_.resize(n);
  full_g_.resize(n);
  shard_g_.resize(n);
  refs_.assign(n, 0);
  stale_.assign(n, false);
  zero_pending_.assign(n, false);
  reported_.assign(n, false);
  reduced_.assign(n, false);
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
      if (low()) {
        compute_w_[u] = Tensor::empty(dev_, zero_.compute, {p.padded});
        dev_.cast(compute_w_[u], full);
      }
    } else {
      // The shard goes to its tier in pool-sized pieces (aligned, as O_DIRECT wants).
      const int64_t piece = place_.pool ? static_cast<int64_t>(place_.pool->buffer_size() / 4) : p.shard;
      float* staging = place_.pool ? static_cast<float*>(place_.pool->acquire()) : nullptr;
      std::vector<float> host;  // a GPU's shard comes through host memory once, at start
      if (!dev_.host_accessible()) {
        host.resize(static_cast<size_t>(p.shard));
        if (p.shard > 0) dev_.copy_to_host(host.data(), full.view(p.begin(), {p.shard}));
      }
      for (int64_t k = 0; k < p.shard; k += piece) {
        const int64_t len = std::min(piece, p.shard - k);
        const float* src = host.empty() ? full.data_as<float>() + p.begin() + k : host.data() + k;
        if (staging) std::memcpy(staging, src, static_cast<size_t>(len) * 4), src = staging;
        store(static_cast<int>(u)).write(region(static_cast<int>(u)), k, len, src);
      }
      if (staging) place_.pool->release(staging);
    }
    if (zero_.stage < 2) full_g_[u] = zeroed(dev_, p.padded);
    if (zero_.stage >= 1) shard_g_[u] = zeroed(grad_home, p.shard);
  }
}

ShardedUnits::~ShardedUnits() {
  cancel_flights();
  reductions_.clear();  // each waits for its transfer before its buffers go
}

// Stage 3: the weight shards' homes. With nvme, the first units' shards up to max_in_cpu
// elements stay in host memory; the rest go to the configured tier.
void ShardedUnits::init_param_stores(const std::vector<int64_t>& shard_sizes) {
  const size_t n = shard_sizes.size();
  const int rank = comm_.rank();
  std::vector<int64_t> main_sizes, cpu_sizes;
  std::vector<bool> in_cpu(n, false);
  int64_t cached = 0;
  for (size_t u = 0; u < n; ++u) {
    if (place_.params == offload::Tier::nvme && cached + shard_sizes[u] <= place_.max_in_cpu) {
      in_cpu[u] = true;
      cached += shard_sizes[u];
      cpu_sizes.push_back(shard_sizes[u]);
    } else {
      main_sizes.push_back(shard_sizes[u]);
    }
  }
  std::string warning;
  params_ = std::make_unique<offload::ShardStore>(place_.params, dev_, place_.host ? *place_.host : dev_, main_sizes,
                                         place_.param_paths, "ferry-params-rank" + std::to_string(rank),
                                         place_.aio, &warning, place_.fault);
  if (!cpu_sizes.empty()) {
    params_cpu_ = std::make_unique<offload::ShardStore>(offload::Tier::cpu, dev_, *place_.host, cpu_sizes, std::vector<std::string>{}, "",
                                               place_.aio, nullptr);
  }
  int main_index = 0, cpu_index = 0;
  for (size_t u = 0; u < n; ++u) {
    home_.emplace_back(in_cpu[u] ? params_cpu_.get() : params_.get(), in_cpu[u] ? cpu_index++ : main_index++);
  }
  if (!warning.empty()) log::warn(log::Subsys::offload, "parameters: " + warning);
  if (place_.params == offload::Tier::nvme) {
    const std::string why = params_->use_pool(*place_.pool);
    if (!why.empty()) log::warn(log::Subsys::offload, "parameters: no fixed buffers: " + why);
  }
  if (place_.params == offload::Tier::nvme && place_.prefetch_depth > 0 && place_.overlap_io) {
    swapper_ = std::make_unique<offload::Swapper>(*place_.pool, place_.prefetch_depth);
  }
}

void ShardedUnits::read_owned_weights(int unit, int64_t offset, int64_t n, float* buf) {
  const Owned o = owned(unit);
  if (offset < 0 || offset + n > o.length) throw std::out_of_range("read_owned_weights outside the owned range");
  if (zero_.stage == 3) return store(unit).read(region(unit), offset, n, buf);
  if (n > 0) o.weights.device().copy_to_host(buf, o.weights.view(offset, {n}));
}

void ShardedUnits::write_owned_weights(int unit, int64_t offset, int64_t n, const float* buf) {
  const Owned o = owned(unit);
  if (offset < 0 || offset + n > o.length) throw std::out_of_range("write_owned_weights outside the owned range");
  if (zero_.stage == 3) {
    const bool nvme = store(unit).tier() == offload::Tier::nvme;
    Tracer::Span span(nvme ? tracer_ : nullptr, Activity::param_write, name(unit), static_cast<uint64_t>(n) * 4);
    return store(unit).write(region(unit), offset, n, buf);
  }
  if (n > 0) o.weights.device().copy_from_host(o.weights.view(offset, {n}), buf);
}

Tensor ShardedUnits::acquire_weights(int unit) {
  const auto u = static_cast<size_t>(unit);
  const Partition& p = partition_of(unit);
  if (refs_.at(u)++ == 0) {
    const size_t pos = order_.next(unit);
    const bool ahead = order_.in_step() && order_.recorded();
    auto flight = flights_.find(pos);
    const bool prefetched = ahead && flight != flights_.end();
    if (!prefetched) wait_update(unit);  // the optimizer may still be writing this unit
    if (zero_.stage < 3) {
      if (prefetched) {
        flight->second.gather.finish(tracer_);
        flights_.erase(flight);
        ++prefetch_hits_;
      } else if (stale_[u]) {
        refresh(unit).finish(tracer_);
      }
      stale_[u] = false;
    } else {
      Tensor full;
      if (prefetched) {
        Flight& f = flight->second;
        if (!f.gather.valid()) {
          const Tensor shard = f.read ? take_read(f) : f.shard;
          if (!f.full.defined()) f.full = p.world == 1 && !low() ? shard : Tensor::empty(dev_, zero_.compute, {p.padded});
          f.gather = issue_gather(unit, shard, f.full);
        }
        f.gather.finish(tracer_);
        full = f.full;
        flights_.erase(flight);
        ++prefetch_hits_;
      } else {
        const Tensor shard = read_shard(unit);
        // Alone and in fp32, the shard is the unit.
        full = p.world == 1 && !low() ? shard : Tensor::empty(dev_, zero_.compute, {p.padded});
        issue_gather(unit, shard, full).finish(tracer_);
      }
      live_w_[unit].full = full;
    }
    if (ahead) pump(pos + 1);
  }
  compute_begin(unit);
  if (zero_.stage < 3) return (low() ? compute_w_[u] : full_w_[u]).view(0, {p.numel});
  return live_w_.at(unit).full.view(0, {p.numel});
}

void ShardedUnits::release_weights(int unit) {
  const auto u = static_cast<size_t>(unit);
  if (refs_.at(u) == 0) throw std::logic_error("release_weights of a unit not acquired: " + std::to_string(unit));
  compute_end();
  if (--refs_[u] == 0 && zero_.stage == 3) live_w_.erase(unit);  // frees the gathered weights
  if (order_.in_step() && order_.recorded()) pump(order_.position());
}

Tensor ShardedUnits::acquire_grads(int unit) {
  const Partition& p = partition_of(unit);
  zero_grad_if_needed(unit);
  compute_begin(unit);
  if (zero_.stage < 2) return full_g_[static_cast<size_t>(unit)].view(0, {p.numel});
  Live& live = live_g_[unit];
  if (!live.full.defined()) live.full = zeroed(dev_, p.padded);
  return live.full.view(0, {p.numel});
}

void ShardedUnits::release_grads(int unit, bool complete) {
  compute_end();
  if (!complete) return;  // a tied unit keeps its buffer until its last use
  if (zero_.stage >= 2) {
    if (live_g_.find(unit) == live_g_.end()) {
      throw std::logic_error("release_grads of a unit not acquired: " + std::to_string(unit));
    }
    issue_reduction(unit);
  } else if (last_micro_ && zero_.overlap_comm && order_.in_step()) {
    issue_reduction(unit);  // DDP's overlap: reduce while backward goes on
  }
  poll_reductions(!zero_.overlap_comm);
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

void ShardedUnits::zero_grad_if_needed(int unit) {
  const auto u = static_cast<size_t>(unit);
  if (!zero_pending_[u]) return;
  wait_update(unit);  // the previous step's update may still read this step's buffers
  if (full_g_[u].defined()) dev_.fill(full_g_[u], 0.0);
  if (shard_g_[u].defined()) dev_.fill(shard_g_[u], 0.0);
  zero_pending_[u] = false;
}

void ShardedUnits::zero_grads() {
  for (size_t u = 0; u < parts_.size(); ++u) {
    zero_pending_[u] = true;
    zero_grad_if_needed(static_cast<int>(u));
    reduced_[u] = false;
  }
}

void ShardedUnits::begin_step(int64_t step) {
  cancel_flights();
  order_.begin_step(step);
  std::fill(zero_pending_.begin(), zero_pending_.end(), true);
  std::fill(reported_.begin(), reported_.end(), false);
  std::fill(reduced_.begin(), reduced_.end(), false);
  last_micro_ = false;
  if (order_.recorded()) pump(0);
}

void ShardedUnits::finish_gradients() {
  if (!live_g_.empty()) throw std::logic_error("finish_gradients with unit gradients still in backward");
  if (zero_.stage < 2) {
    for (size_t u = 0; u < parts_.size(); ++u)
      if (!reduced_[u]) issue_reduction(static_cast<int>(u));
  }
  poll_reductions(true);
  if (order_.in_step()) {
    for (size_t u = 0; u < parts_.size(); ++u)
      if (!reported_[u]) gradient_done(static_cast<int>(u));
  }
  std::fill(reduced_.begin(), reduced_.end(), false);
}

void ShardedUnits::end_step() {
  cancel_flights();
  order_.end_step();
}

void ShardedUnits::mark_updating(int unit) {
  if (zero_.stage == 1 || zero_.stage == 2 || (zero_.stage == 0 && low())) stale_.at(static_cast<size_t>(unit)) = true;
}

void ShardedUnits::publish_params() {
  if (zero_.stage == 3 || (zero_.stage == 0 && !low())) return;
  cancel_flights();
  for (size_t u = 0; u < parts_.size(); ++u) {
    wait_update(static_cast<int>(u));
    refresh(static_cast<int>(u)).finish(tracer_);
    stale_[u] = false;
  }
}

PendingCollective ShardedUnits::refresh(int unit) {
  const auto u = static_cast<size_t>(unit);
  const Partition& p = partition_of(unit);
  const Tensor& target = low() ? compute_w_[u] : full_w_[u];
  if (zero_.stage == 0) {  // every rank updated the whole unit: only the cast is left
    if (low()) dev_.cast(target, full_w_[u]);
    return {};
  }
  return issue_gather(unit, full_w_[u].view(p.begin(), {p.shard}), target);
}

std::vector<float> ShardedUnits::full_weights(int unit) {
  const Partition& p = partition_of(unit);
  std::vector<float> out(static_cast<size_t>(p.numel));
  const Tensor w = acquire_weights(unit);
  if (w.dtype() == DType::f32) {
    dev_.copy_to_host(out.data(), w);
  } else {
    const Tensor wide = Tensor::empty(dev_, DType::f32, w.shape());
    dev_.cast(wide, w);
    dev_.copy_to_host(out.data(), wide);
  }
  release_weights(unit);
  return out;
}

StateBytes ShardedUnits::state_bytes() const {
  StateBytes s;
  if (params_) {
    s.weights += params_->bytes();
    if (params_->tier() == offload::Tier::cpu) s.weights_host += params_->bytes();
    if (params_->tier() == offload::Tier::nvme) s.weights_nvme += params_->bytes();
  }
  if (params_cpu_) s.weights += params_cpu_->bytes(), s.weights_host += params_cpu_->bytes();
  for (size_t u = 0; u < parts_.size(); ++u) {
    s.weights += full_w_[u].defined() ? full_w_[u].nbytes() : 0;
    s.compute_copy += compute_w_[u].defined() ? compute_w_[u].nbytes() : 0;
    const size_t shard = shard_g_[u].defined() ? shard_g_[u].nbytes() : 0;
    s.gradients += (full_g_[u].defined() ? full_g_[u].nbytes() : 0) + shard;
    if (place_.grads_on_host) s.gradients_host += shard;
  }
  return s;
}

}  // namespace ferry::runtime
