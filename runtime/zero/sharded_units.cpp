#include "runtime/zero/sharded_units.h"

#include <algorithm>
#include <stdexcept>

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
                           const Placement& placement, const QuantizedInit& quantized)
    : dev_(device),
      comm_(comm),
      zero_(zero),
      policy_(StagePolicy::of(zero.stage, zero.compute)),
      place_(placement),
      order_(unit_names(units), comm),
      reductions_(policy_, device, comm, zero.reduce_bucket_size) {
  if (place_.params != offload::Tier::device && !policy_.sharded_weights) {
    throw std::invalid_argument("ShardedUnits: parameters move off the device only at stage 3");
  }
  if ((place_.params != offload::Tier::device || place_.grads_on_host) && place_.host == nullptr) {
    throw std::invalid_argument("ShardedUnits: off-device placement needs a host allocator");
  }
  if (place_.params == offload::Tier::nvme && place_.pool == nullptr) {
    throw std::invalid_argument("ShardedUnits: nvme parameters need a pinned pool");
  }
  if (zero.compute != DType::f32 && !nn::is_low_precision(zero.compute)) {
    throw std::invalid_argument("ShardedUnits: compute weights are f32, bf16 or f16");
  }
  nn::Device& grad_home = place_.grads_on_host ? *place_.host : dev_;
  // A GPU whose optimizer is offloaded reduces on the device and lands the result on the
  // host (reduction_queue.h); a host-accessible device reduces into host memory directly.
  land_ = place_.grads_on_host && !dev_.host_accessible();
  if (land_ && !policy_.grad_shard) {
    throw std::invalid_argument("ShardedUnits: gradients land on the host as shards, from stage 1 (DeepSpeed's rule)");
  }
  if (land_) reductions_.set_landing(place_.host);
  const size_t n = units.size();
  full_w_.resize(n);
  compute_w_.resize(n);
  model_w_.resize(n);
  full_g_.resize(n);
  shard_g_.resize(n);
  fresh_.assign(n, false);
  refs_.assign(n, 0);
  stale_.assign(n, false);
  zero_pending_.assign(n, false);
  reported_.assign(n, false);
  reduced_.assign(n, false);
  nf4_ranges_.resize(n);
  for (size_t u = 0; u < n; ++u) {
    for (const nn::TensorSpec& t : units[u].tensors)
      if (t.quantized()) nf4_ranges_[u].emplace_back(t.offset, t.offset + t.stored_numel());
    spans_.push_back(unit_partition(units[u], comm.size(), comm.rank()));
    parts_.push_back(spans_.back().trained);
    any_frozen_ = any_frozen_ || spans_.back().has_frozen();
  }
  if (policy_.sharded_weights) {
    // A frozen base: 16-bit shards (bf16, f16) on the device too, the optimizer keeping the trained
    // span's fp32 master apart (as for shards off the device), so the base costs two bytes
    // a parameter wherever it is kept and a QLoRA base's blobs have 16-bit elements.
    Placement shards_place = place_;
    shards_place.low_precision_on_device = any_frozen_;
    shards_ = std::make_unique<ParamShards>(dev_, spans_, unit_names(units),
                                            place_.file_rank >= 0 ? place_.file_rank : comm.rank(), shards_place,
                                            zero.compute);
  }
  const DType model_dtype = policy_.compute_copy ? zero_.compute : DType::f32;
  for (size_t u = 0; u < n; ++u) {
    const UnitPartition& s = spans_[u];
    const Partition& p = s.trained;
    const bool trains = !s.has_frozen() || p.numel > 0;
    // The unit as the model lays it out, zero past numel and in its alignment gaps.
    Tensor full = zeroed(dev_, std::max(s.gathered(), p.padded));
    init(static_cast<int>(u), full.view(0, {s.numel}));
    Tensor trained = full;  // [padded] of the trainable span, zero padded
    if (s.has_frozen()) {
      trained = trains ? zeroed(dev_, p.padded) : Tensor{};
      if (trains) dev_.copy(trained.view(0, {p.numel}), full.view(0, {p.numel}));
      if (policy_.full_weights) {
        model_w_[u] = Tensor::empty(dev_, model_dtype, {s.numel});
        dev_.cast(model_w_[u], full.view(0, {s.numel}));
        put_quantized(units[u], static_cast<int>(u), quantized, model_w_[u], 0, s.numel);
      }
    }
    if (policy_.full_weights) full_w_[u] = trained;
    if (policy_.compute_copy && trains) {
      compute_w_[u] = Tensor::empty(dev_, zero_.compute, {p.padded});
      dev_.cast(compute_w_[u], trained);
    }
    if (policy_.sharded_weights) {
      Tensor stored = s.has_frozen() ? stored_shard(dev_, full, s) : full.view(p.begin(), {p.shard});
      if (units[u].any_quantized()) {  // the shard in its store's dtype, then the blobs' bytes
        const Tensor typed = Tensor::empty(dev_, shards_->dtype(), {stored.numel()});
        dev_.cast(typed, stored);
        put_quantized(units[u], static_cast<int>(u), quantized, typed.view(s.stored_frozen_at(), {s.frozen.shard}),
                      s.frozen_at + std::min(s.frozen.begin(), s.frozen.numel), s.frozen.owned_real());
        stored = typed;
      }
      shards_->init(static_cast<int>(u), stored);
    }
    if (policy_.full_grads && trains) full_g_[u] = zeroed(dev_, p.padded);
    if (policy_.grad_shard && trains) shard_g_[u] = zeroed(grad_home, p.shard);
  }
  PrefetchLimits limits;
  limits.depth = place_.prefetch_depth;
  limits.overlap_comm = zero_.overlap_comm;
  limits.nvme_reads = policy_.sharded_weights && place_.params == offload::Tier::nvme && place_.overlap_io;
  limits.bucket = zero_.prefetch_bucket_size;
  limits.max_live = zero_.max_live_parameters;
  limits.allgather_bucket = zero_.allgather_bucket_size;
  limits.compute = zero_.compute;
  prefetch_ = std::make_unique<Prefetcher>(policy_, limits, dev_, comm_, spans_, unit_names(units), shards_.get(),
                                           place_.pool, [this](int unit) -> std::optional<PendingCollective> {
                                             const auto u = static_cast<size_t>(unit);
                                             if (!stale_[u]) return std::nullopt;
                                             wait_update(unit);
                                             PendingCollective g = refresh(unit);
                                             stale_[u] = false;
                                             if (!g.valid()) return std::nullopt;  // refreshed in place already
                                             return g;
                                           });
}

// Unit u's NF4 blobs where they fall in elements [begin, begin + n) of its layout, into
// `dst` (which holds those elements from its start), as raw bytes through host memory.
void ShardedUnits::put_quantized(const nn::UnitSpec& spec, int u, const QuantizedInit& quantized, const Tensor& dst,
                                 int64_t begin, int64_t n) {
  if (!spec.any_quantized() || !quantized) return;
  if (nn::dtype_size(dst.dtype()) != static_cast<size_t>(nn::kNf4ElementBytes)) {
    throw std::logic_error("ShardedUnits: " + spec.name + " holds NF4 tensors in " + dst.describe() +
                           " (they need a 16-bit frozen span: bf16 or f16 compute, the configuration's rules)");
  }
  std::vector<uint8_t> bytes;
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const nn::TensorSpec& t = spec.tensors[i];
    if (!t.quantized()) continue;
    const int64_t lo = std::max(begin, t.offset), hi = std::min(begin + n, t.offset + t.stored_numel());
    if (lo >= hi) continue;
    bytes.assign(static_cast<size_t>((hi - lo) * nn::kNf4ElementBytes), 0);
    quantized(u, i, (lo - t.offset) * nn::kNf4ElementBytes, (hi - lo) * nn::kNf4ElementBytes, bytes.data());
    dev_.copy_from_host(dst.view(lo - begin, {hi - lo}), bytes.data());
  }
}

ShardedUnits::~ShardedUnits() {
  prefetch_->cancel();
  reductions_.clear();  // each waits for its transfer before its buffers go
}

void ShardedUnits::set_tracer(Tracer* t) {
  tracer_ = t;
  if (shards_) shards_->set_tracer(t);
  prefetch_->set_tracer(t);
  reductions_.set_tracer(t);
}

void ShardedUnits::set_update_worker(UpdateWorker* w) {
  updates_ = w;
  prefetch_->set_update_worker(w);
}

void ShardedUnits::read_owned_weights(int unit, int64_t offset, int64_t n, float* buf) {
  const Owned o = owned(unit);
  if (offset < 0 || offset + n > o.length) throw std::out_of_range("read_owned_weights outside the owned range");
  if (policy_.sharded_weights) return shards_->read(unit, offset, n, buf);
  if (n > 0) o.weights.device().copy_to_host(buf, o.weights.view(offset, {n}));
}

void ShardedUnits::write_owned_rounded(int unit, int64_t offset, int64_t n, const uint16_t* buf) {
  const Owned o = owned(unit);
  if (offset < 0 || offset + n > o.length) throw std::out_of_range("write_owned_rounded outside the owned range");
  if (!owned_rounded()) throw std::logic_error("write_owned_rounded: the owned weights are not 16-bit shards");
  shards_->write_rounded(unit, offset, n, buf);
}

void ShardedUnits::write_owned_weights(int unit, int64_t offset, int64_t n, const float* buf) {
  const Owned o = owned(unit);
  if (offset < 0 || offset + n > o.length) throw std::out_of_range("write_owned_weights outside the owned range");
  if (policy_.sharded_weights) return shards_->write(unit, offset, n, buf);
  if (n > 0) o.weights.device().copy_from_host(o.weights.view(offset, {n}), buf);
}

Tensor ShardedUnits::acquire_weights(int unit) {
  const auto u = static_cast<size_t>(unit);
  const UnitPartition& p = spans_of(unit);
  if (refs_.at(u)++ == 0) {
    const size_t pos = order_.next(unit);
    std::optional<Tensor> fetched = ahead() ? prefetch_->take(pos) : std::nullopt;
    if (!fetched) wait_update(unit);  // the optimizer may still be writing this unit
    if (policy_.sharded_weights) {
      if (!fetched && node_copy_ready(unit)) {
        Tensor full;
        gather_from_node(unit, &full).finish(tracer_);
        fetched = full;
      } else if (!fetched) {
        UnitGather g = issue_unit_gather(comm_, dev_, shards_->fetch(unit), spans_of(unit), zero_.compute,
                                         zero_.allgather_bucket_size, name(unit));
        g.pending.finish(tracer_);
        fetched = g.full;
      }
      if (node_ && !node_valid_[u]) keep_node_copy(unit, *fetched);
      live_w_[unit].full = *fetched;
    } else {
      if (!fetched && stale_[u]) refresh(unit).finish(tracer_);
      stale_[u] = false;
    }
    if (ahead()) prefetch_->pump(order_.order(), pos + 1, live_elements());
  }
  if (policy_.sharded_weights) return live_w_.at(unit).full.view(0, {p.numel});
  if (model_w_[u].defined()) return model_w_[u];
  return (policy_.compute_copy ? compute_w_[u] : full_w_[u]).view(0, {p.numel});
}

void ShardedUnits::release_weights(int unit) {
  const auto u = static_cast<size_t>(unit);
  if (refs_.at(u) == 0) throw std::logic_error("release_weights of a unit not acquired: " + std::to_string(unit));
  if (--refs_[u] == 0 && policy_.sharded_weights) live_w_.erase(unit);  // frees the gathered weights
  if (ahead()) prefetch_->pump(order_.order(), order_.position(), live_elements());
}

Tensor ShardedUnits::acquire_grads(int unit) {
  const Partition& p = partition_of(unit);
  if (!trains(unit)) return Tensor{};  // nothing trained: no gradient (nn/unit.h's contract)
  zero_grad_if_needed(unit);
  if (policy_.full_grads) return full_g_[static_cast<size_t>(unit)].view(0, {p.numel});
  Live& live = live_g_[unit];
  if (!live.full.defined()) live.full = zeroed(dev_, p.padded);
  return live.full.view(0, {p.numel});
}

void ShardedUnits::release_grads(int unit, bool complete) {
  if (!complete || !trains(unit)) return;  // a tied unit keeps its buffer until its last use
  if (policy_.reduce_every_micro) {
    if (live_g_.find(unit) == live_g_.end()) {
      throw std::logic_error("release_grads of a unit not acquired: " + std::to_string(unit));
    }
    issue_reduction(unit);
  } else if (last_micro_ && zero_.overlap_comm && order_.in_step()) {
    issue_reduction(unit);  // DDP's overlap: reduce while backward goes on
  }
  poll_reductions(!zero_.overlap_comm);
}

void ShardedUnits::set_node_copies(comm::Communicator* node) {
  if (!policy_.sharded_weights) throw std::logic_error("node copies (hpZ) need stage 3");
  if (comm_.size() % node->size() != 0) throw std::logic_error("node copies (hpZ): the node group must divide the shard group");
  // With frozen tensors (adapters) the node copy is the whole unit as gathered, the frozen
  // base (NF4 blobs as bytes) with the adapters, refreshed after each update like any unit's.
  node_ = node;
  node_parts_.clear();
  for (const UnitPartition& p : spans_) node_parts_.push_back(partition(p.numel, node->size(), node->rank()));
  // Allocated now: device state for the whole run, as ZeRO++ keeps it (and counted so).
  node_w_.clear();
  for (const Partition& q : node_parts_) node_w_.push_back(Tensor::empty(dev_, zero_.compute, {q.shard}));
  node_valid_.assign(parts_.size(), false);
  prefetch_->set_node_source([this](int unit) { return node_copy_ready(unit); },
                             [this](int unit, Tensor* full) { return gather_from_node(unit, full); });
}

bool ShardedUnits::node_copy_ready(int unit) const {
  return node_ != nullptr && node_valid_.at(static_cast<size_t>(unit));
}

PendingCollective ShardedUnits::gather_from_node(int unit, Tensor* full) {
  const auto u = static_cast<size_t>(unit);
  const Partition& q = node_parts_.at(u);
  // The node partition pads numel to a multiple of 16 x node size. Without frozen tensors
  // that divides the shard group's padding; a unit with a frozen span is gathered to
  // frozen_at + the frozen partition's padding, which can be shorter: the buffer is the
  // longer of the two, and the model reads only numel.
  *full = Tensor::empty(dev_, zero_.compute, {std::max(spans_[u].gathered(), q.padded)});
  return issue_all_gather(*node_, dev_, node_w_[u], full->view(0, {q.padded}), q, zero_.allgather_bucket_size,
                          name(unit) + " (node copy)");
}

void ShardedUnits::keep_node_copy(int unit, const Tensor& full) {
  const auto u = static_cast<size_t>(unit);
  const Partition& q = node_parts_[u];
  // This rank's node slice of the gathered unit; past the gathered buffer (the last slice's
  // padding, see gather_from_node) zeros.
  const int64_t n = std::clamp<int64_t>(full.numel() - q.begin(), 0, q.shard);
  if (n > 0) dev_.copy(node_w_[u].view(0, {n}), full.view(q.begin(), {n}));
  if (n < q.shard) dev_.fill(node_w_[u].view(n, {q.shard - n}), 0.0);
  node_valid_[u] = true;
}

ShardedUnits::Owned ShardedUnits::owned(int unit) const {
  const auto u = static_cast<size_t>(unit);
  const Partition& p = partition_of(unit);
  if (!trains(unit)) return {0, 0, Tensor{}, Tensor{}};
  if (policy_.updates_whole_unit) return {0, p.padded, full_w_[u], full_g_[u]};
  if (policy_.full_weights) return {p.begin(), p.shard, full_w_[u].view(p.begin(), {p.shard}), shard_g_[u]};
  // Stage 3: the stored shard's first part (its frozen part follows, never written).
  const Tensor stored = shards_->resident(unit);
  return {p.begin(), p.shard, stored.defined() ? stored.view(0, {p.shard}) : stored, shard_g_[u]};
}

Tensor ShardedUnits::grad_shard(int unit) const {
  const Partition& p = partition_of(unit);
  if (!trains(unit)) return Tensor{};
  if (!policy_.grad_shard) return full_g_[static_cast<size_t>(unit)].view(p.begin(), {p.shard});
  return shard_g_[static_cast<size_t>(unit)];
}

std::vector<float> ShardedUnits::full_weights(int unit) {
  const UnitPartition& p = spans_of(unit);
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
  for (const auto& [begin, end] : nf4_ranges_.at(static_cast<size_t>(unit))) std::fill(out.begin() + begin, out.begin() + end, 0.0f);
  return out;
}

StateBytes ShardedUnits::state_bytes() const {
  StateBytes s;
  if (shards_) {
    const ParamShards::Bytes b = shards_->bytes();
    s.weights += b.total, s.weights_host += b.host, s.weights_nvme += b.nvme;
  }
  for (const nn::Tensor& t : node_w_) s.node_copies += t.nbytes();
  for (size_t u = 0; u < parts_.size(); ++u) {
    s.weights += full_w_[u].defined() ? full_w_[u].nbytes() : 0;
    s.compute_copy += compute_w_[u].defined() ? compute_w_[u].nbytes() : 0;
    // The model's buffer of a unit with frozen tensors: its compute copy under mixed precision.
    if (model_w_[u].defined()) (policy_.compute_copy ? s.compute_copy : s.weights) += model_w_[u].nbytes();
    const size_t shard = shard_g_[u].defined() ? shard_g_[u].nbytes() : 0;
    s.gradients += (full_g_[u].defined() ? full_g_[u].nbytes() : 0) + shard;
    if (place_.grads_on_host) s.gradients_host += shard;
  }
  return s;
}

}  // namespace ferry::runtime
