#include "runtime/zero/optimizer_state.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <stdexcept>

namespace ferry::runtime {


OptimizerState::OptimizerState(offload::Tier tier, ShardedUnits& units, nn::Device& device, nn::Device& host,
                               const offload::CpuAdam& adam, const OffloadConfig& offload, offload::PinnedPool* pool,
                               int rank, std::string* warning, const MasterInit& master_init)
    : tier_(tier), units_(units), adam_(adam), pool_(pool) {
  std::vector<int64_t> lengths;
  for (int u = 0; u < units.num_units(); ++u) lengths.push_back(units.owned(u).length);
  // The default placement updates the device-resident compute weights in place, unless
  // those are 16-bit shards (a frozen base at stage 3): the master is then kept beside them.
  alias_ = tier_ == offload::Tier::device && units.placement().params == offload::Tier::device && !units.owned_rounded();
  per_unit_ = alias_ ? 2 : 3;
  if (tier_ == offload::Tier::nvme && pool_ == nullptr) throw std::invalid_argument("OptimizerState: nvme needs a pinned pool");
  slots_ = tier_ == offload::Tier::nvme ? 2 : 1;
  std::vector<int64_t> sizes;
  for (int64_t len : lengths)
    for (int k = 0; k < per_unit_ * slots_; ++k) sizes.push_back(len);
  store_ = std::make_unique<offload::ShardStore>(tier_, device, host, sizes, offload.optimizer_paths,
                                        "ferry-optimizer-rank" + std::to_string(rank), offload.aio, warning,
                                        offload.fault);
  if (tier_ == offload::Tier::nvme) {
    const std::string why = store_->use_pool(*pool_);
    if (!why.empty() && warning) *warning += (warning->empty() ? "" : "; ") + ("no fixed buffers: " + why);
    // Its own share of the pool: the parameter prefetcher holds the rest, and the two run
    // on different threads, each waiting for the other only through the pool.
    buffers_ = std::min(pool_->buffer_count(), offload.optimizer_buffers);
    swapper_ = std::make_unique<offload::Swapper>(*pool_, buffers_);
  }
  if (pool_) {
    // Tiles start where both stores accept an offset: the optimizer's fp32 one and, for
    // nvme parameters, the shards' (2048 elements for 16-bit shards).
    const int64_t q = std::max<int64_t>(units.owned_quantum(), offload::kNvmeQuantum);
    tile_ = static_cast<int64_t>(pool_->buffer_size() / 4) / q * q;
    if (tile_ == 0) {
      throw std::invalid_argument("OptimizerState: a pinned buffer of " + std::to_string(pool_->buffer_size()) +
                                  " bytes holds less than one nvme tile (" + std::to_string(q * 4) +
                                  " bytes); raise offload_param.buffer_size");
    }
  }
  if (alias_) return;
  // Master weights start as the compute weights, or, where those are kept rounded to bf16 or f16
  // (ParamShards), as the fp32 values the run was initialised with.
  if (units.owned_rounded() && !master_init) throw std::logic_error("OptimizerState: 16-bit shards need the fp32 initial weights");
  for (size_t u = 0; u < lengths.size(); ++u) {
    const int unit = static_cast<int>(u);
    std::vector<float> initial;
    if (units.owned_rounded()) {
      initial.resize(static_cast<size_t>(lengths[u]));
      master_init(unit, initial.data());
    }
    auto read = [&](int64_t k, int64_t len, float* dst) {
      if (initial.empty()) return units.read_owned_weights(unit, k, len, dst);
      pool_->copy(dst, initial.data() + k, static_cast<size_t>(len) * 4);  // dst: a pool buffer
    };
    if (tier_ != offload::Tier::nvme && !initial.empty()) {
      store_->write(region(unit, kMaster), 0, lengths[u], initial.data());
      continue;
    }
    if (tier_ != offload::Tier::nvme && units.placement().params != offload::Tier::nvme) {
      read(0, lengths[u], store_->tensor(region(unit, kMaster)).data_as<float>());
      continue;
    }
    const offload::PooledBuffer lease(*pool_);
    float* buf = lease.get();
    for (int64_t k = 0; k < lengths[u]; k += tile_) {
      const int64_t len = std::min(tile_, lengths[u] - k);
      read(k, len, buf);
      store_->write(region(unit, kMaster), k, len, buf);
    }
  }
}

void OptimizerState::step(int unit, const nn::Tensor& grads, const std::vector<DecayRange>& ranges, int64_t step,
                          double lr, double grad_scale) {
  const float* g = grads.data_as<float>();
  const std::string& name = units_.order().unit_name(unit);
  // 16-bit parameter shards: CPU Adam writes the rounded weights in the same pass (its fused
  // copy-out), into `low` ([t0, t0 + n) of the owned range; padding stays 0).
  const bool fused = units_.owned_rounded();
  std::vector<uint16_t> low;
  auto adam_over = [&](float* p, float* m, float* v, int64_t t0, int64_t n) {
    Tracer::Span span(tracer_, Activity::adam, name);
    if (fused) low.assign(static_cast<size_t>(n), 0);
    // Parts of [t0, t0 + n) that hold parameters, each with its own weight decay.
    for (const DecayRange& r : ranges) {
      const int64_t lo = std::max(r.begin, t0), hi = std::min(r.end, t0 + n);
      if (lo < hi) {
        adam_.update(p + (lo - t0), g + lo, m + (lo - t0), v + (lo - t0), hi - lo, step, lr, r.weight_decay, grad_scale,
                     fused ? low.data() + (lo - t0) : nullptr, units_.owned_dtype());
      }
    }
  };
  // The updated weights of [t0, t0 + n) to the parameter shards: the fused copy-out, or fp32.
  auto publish = [&](int64_t t0, int64_t n, const float* p) {
    if (fused) return units_.write_owned_rounded(unit, t0, n, low.data());
    units_.write_owned_weights(unit, t0, n, p);
  };
  const ShardedUnits::Owned o = units_.owned(unit);
  const bool on_gpu = tier_ == offload::Tier::device && units_.placement().params == offload::Tier::device &&
                      o.weights.defined() && !o.weights.device().host_accessible();
  if (on_gpu) {
    // States on a GPU: AdamW on the device, one launch per decay range, on views; on the
    // weights themselves, or on the fp32 master, whose rounding then becomes the 16-bit shard.
    Tracer::Span span(tracer_, Activity::adam, name);
    nn::Device& dev = o.weights.device();
    const nn::Tensor m = store_->tensor(region(unit, kM)), v = store_->tensor(region(unit, kV));
    const nn::Tensor p = alias_ ? o.weights : store_->tensor(region(unit, kMaster));
    const offload::AdamWParams& hp = adam_.params();
    for (const DecayRange& r : ranges) {
      const int64_t lo = std::max<int64_t>(r.begin, 0), hi = std::min(r.end, o.length);
      if (lo >= hi) continue;
      const nn::Shape sh{hi - lo};
      dev.adamw(p.view(lo, sh), grads.view(lo, sh), m.view(lo, sh), v.view(lo, sh),
                {step, lr, hp.beta1, hp.beta2, hp.eps, r.weight_decay, grad_scale});
    }
    if (!alias_ && o.length > 0) dev.cast(o.weights, p.view(0, {o.length}));
    return;
  }
  if (tier_ != offload::Tier::nvme) {
    float* m = store_->tensor(region(unit, kM)).data_as<float>();
    float* v = store_->tensor(region(unit, kV)).data_as<float>();
    float* p = alias_ ? o.weights.data_as<float>() : store_->tensor(region(unit, kMaster)).data_as<float>();
    adam_over(p, m, v, 0, o.length);
    if (alias_) return;
    if (units_.placement().params != offload::Tier::nvme || fused) return publish(0, o.length, p);
    // nvme parameters want aligned pinned buffers: copy through one, tile by tile.
    const int64_t tile = tile_;
    const offload::PooledBuffer lease(*pool_);
    float* buf = lease.get();
    for (int64_t t0 = 0; t0 < o.length; t0 += tile) {
      const int64_t n = std::min(tile, o.length - t0);
      pool_->copy(buf, p + t0, static_cast<size_t>(n) * 4);
      units_.write_owned_weights(unit, t0, n, buf);
    }
    return;
  }
  // nvme: stream tiles of master, m, v through pinned buffers. The swapper reads the next
  // tiles' three arrays while Adam updates this one; the pool bounds how far ahead.
  const int64_t tile = tile_;
  const int64_t tiles = (o.length + tile - 1) / tile;
  const int64_t ahead = read_ahead_ ? std::max(0, buffers_ / 3 - 1) : 0;
  std::deque<std::array<offload::Swapper::Ticket, 3>> queued;
  int64_t next = 0;
  auto enqueue = [&] {
    const int64_t t0 = next++ * tile, n = std::min(tile, o.length - t0);
    std::array<offload::Swapper::Ticket, 3> tickets{};
    for (int which = 0; which < 3; ++which) {
      const int r = region(unit, which, current_);
      tickets[static_cast<size_t>(which)] = swapper_->submit([this, r, t0, n, &name](void* buf) {
        Tracer::Span span(tracer_, Activity::optim_read, name, static_cast<uint64_t>(n) * 4);
        store_->read(r, t0, n, static_cast<float*>(buf));
      });
    }
    queued.push_back(tickets);
  };
  try {
    while (next < tiles && next <= ahead) enqueue();
    for (int64_t k = 0; k < tiles; ++k) {
      const int64_t t0 = k * tile, n = std::min(tile, o.length - t0);
      const auto tickets = queued.front();
      queued.pop_front();
      // Leased as they arrive: a failed read, update or write gives all three back.
      std::array<offload::PooledBuffer, 3> held = {offload::PooledBuffer(*pool_, nullptr),
                                                   offload::PooledBuffer(*pool_, nullptr),
                                                   offload::PooledBuffer(*pool_, nullptr)};
      try {
        for (size_t which = 0; which < 3; ++which)
          held[which] = offload::PooledBuffer(*pool_, swapper_->wait(tickets[which]));
      } catch (...) {
        for (size_t which = 0; which < 3; ++which)
          if (!held[which].get()) swapper_->cancel(tickets[which]);
        throw;
      }
      float* p = held[0].get();
      float* m = held[1].get();
      float* v = held[2].get();
      adam_over(p, m, v, t0, n);
      const int next_slot = 1 - current_;
      {
        Tracer::Span span(tracer_, Activity::optim_write, name, static_cast<uint64_t>(n) * 12);
        store_->write(region(unit, kMaster, next_slot), t0, n, p);
        store_->write(region(unit, kM, next_slot), t0, n, m);
        store_->write(region(unit, kV, next_slot), t0, n, v);
      }
      publish(t0, n, p);
      for (offload::PooledBuffer& b : held) b.reset();
      if (next < tiles) enqueue();
    }
  } catch (...) {
    for (const auto& tickets : queued)
      for (auto t : tickets) swapper_->cancel(t);
    throw;
  }
}

void OptimizerState::commit() {
  if (slots_ == 2) current_ = 1 - current_;
}

std::vector<float> OptimizerState::master(int unit) {
  std::vector<float> out(static_cast<size_t>(units_.owned(unit).length));
  read_state(unit, kMaster, 0, static_cast<int64_t>(out.size()), out.data());
  return out;
}

void OptimizerState::read_state(int unit, Array array, int64_t offset, int64_t n, float* dst) {
  const ShardedUnits::Owned o = units_.owned(unit);
  if (offset < 0 || n < 0 || offset + n > o.length) throw std::out_of_range("OptimizerState::read_state outside the owned range");
  if (n == 0) return;
  if (array == kMaster && alias_) {
    o.weights.device().copy_to_host(dst, o.weights.view(offset, {n}));  // a GPU's too
  } else if (tier_ != offload::Tier::nvme) {
    store_->read(region(unit, array), offset, n, dst);
  } else {
    // Whole aligned tiles from the current slot; the part inside [offset, offset + n) kept.
    const int64_t tile = tile_;
    const offload::PooledBuffer lease(*pool_);
    float* buf = lease.get();
    for (int64_t t0 = offset / tile * tile; t0 < offset + n; t0 += tile) {
      const int64_t len = std::min(tile, o.length - t0);
      store_->read(region(unit, array, current_), t0, len, buf);
      const int64_t lo = std::max(t0, offset), hi = std::min(t0 + len, offset + n);
      pool_->copy(dst + (lo - offset), buf + (lo - t0), static_cast<size_t>(hi - lo) * 4);
    }
  }
}

void OptimizerState::write_state(int unit, Array array, const float* src) {
  const ShardedUnits::Owned o = units_.owned(unit);
  const auto bytes = [](int64_t n) { return static_cast<size_t>(n) * 4; };
  const bool via_pool = tier_ == offload::Tier::nvme || (array == kMaster && units_.placement().params == offload::Tier::nvme);
  if (!via_pool) {
    if (array == kMaster && alias_) return units_.write_owned_weights(unit, 0, o.length, src);
    store_->write(region(unit, array), 0, o.length, src);
    if (array == kMaster) units_.write_owned_weights(unit, 0, o.length, src);
    return;
  }
  // nvme on either side wants aligned pinned buffers: one tile at a time.
  const int64_t tile = tile_;
  const offload::PooledBuffer lease(*pool_);
  float* buf = lease.get();
  for (int64_t t0 = 0; t0 < o.length; t0 += tile) {
    const int64_t len = std::min(tile, o.length - t0);
    pool_->copy(buf, src + t0, bytes(len));
    if (tier_ == offload::Tier::nvme) {
      store_->write(region(unit, array, current_), t0, len, buf);
    } else if (!(array == kMaster && alias_)) {
      pool_->copy(store_->tensor(region(unit, array)).data_as<float>() + t0, buf, bytes(len));
    }
    if (array == kMaster) units_.write_owned_weights(unit, t0, len, buf);
  }
}

}  // namespace ferry::runtime
