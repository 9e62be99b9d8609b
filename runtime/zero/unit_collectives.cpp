#include "runtime/zero/unit_collectives.h"

#include <algorithm>
#include <stdexcept>

#include "nn/device.h"

namespace ferry::runtime {

using nn::DType;
using nn::Tensor;

namespace {

float* f32(const Tensor& t) { return t.data_as<float>(); }

}  // namespace

PendingCollective::~PendingCollective() {
  for (const comm::WorkPtr& w : works_) {
    // An abandoned transfer (an error elsewhere) must not write into freed buffers; the
    // watchdog ends a collective that never completes.
    if (w) w->wait_for(std::chrono::hours(24));
  }
}

bool PendingCollective::done() const {
  for (const comm::WorkPtr& w : works_)
    if (!w->test()) return false;
  return true;
}

void PendingCollective::finish(Tracer* tracer) {
  const bool on_device = comm_ && comm_->orders_on_device() && !works_.empty();
  if (on_device) {
    // The works are chunks issued in order on one stream: the last one's completion
    // covers them all, and nothing issued after them is waited for (review F4).
    comm_->order_consumer(*works_.back());
  } else {
    for (const comm::WorkPtr& w : works_) w->wait();
  }
  if (tracer && on_device) {
    // Timed on the device: the host only queued it (review F6).
    tracer->record_device(activity_, name_, works_.front()->device_start, works_.back()->device_marker, bytes_);
  }
  if (tracer && !works_.empty() && !on_device) {
    auto t0 = works_.front()->started_at(), t1 = works_.front()->finished_at();
    for (const comm::WorkPtr& w : works_) t0 = std::min(t0, w->started_at()), t1 = std::max(t1, w->finished_at());
    tracer->record(activity_, name_, t0, t1, -1, bytes_);
  }
  if (unpack_) unpack_();
  works_.clear();
  keep_.clear();
  unpack_ = nullptr;
  issued_ = false;
}

void PendingCollective::join(PendingCollective other) {
  if (!other.issued_) return;
  if (!issued_) {
    *this = std::move(other);
    return;
  }
  if (!comm_) comm_ = other.comm_;
  for (comm::WorkPtr& w : other.works_) works_.push_back(std::move(w));
  other.works_.clear();
  for (Tensor& t : other.keep_) keep_.push_back(std::move(t));
  other.keep_.clear();
  bytes_ += other.bytes_;
  if (other.unpack_) {
    std::function<void()> first = std::move(unpack_), second = std::move(other.unpack_);
    unpack_ = [first, second] {
      if (first) first();
      second();
    };
  }
  other.issued_ = false;
}

void PendingCollective::then(std::function<void()> step, std::vector<Tensor> keep) {
  for (Tensor& t : keep) keep_.push_back(std::move(t));
  std::function<void()> first = std::move(unpack_);
  unpack_ = [first, step = std::move(step)] {
    if (first) first();
    step();
  };
}

std::shared_ptr<void> PendingCollective::device_marker() const {
  if (!comm_ || !comm_->orders_on_device() || works_.empty() || unpack_) return nullptr;
  return works_.back()->device_marker;
}

PendingCollective issue_all_gather(comm::Communicator& comm, nn::Device& dev, const Tensor& shard, const Tensor& full,
                                   const Partition& p, int64_t bucket, std::string name) {
  PendingCollective pc(Activity::all_gather, std::move(name), {shard, full});
  pc.comm_ = &comm;
  const int64_t W = p.world, S = p.shard;
  if (shard.dtype() != full.dtype()) {
    throw std::invalid_argument("all-gather of " + shard.describe() + " into " + full.describe() + ": one dtype");
  }
  if (W == 1 && shard.data() == full.data()) return pc;
  // Weights only move: a two-byte compute copy (bf16, f16) travels as u16.
  const size_t esize = nn::dtype_size(shard.dtype());
  const comm::DataType type = esize == 2 ? comm::DataType::u16 : comm::DataType::f32;
  auto at = [esize](const Tensor& t, int64_t i) { return static_cast<char*>(t.data()) + static_cast<size_t>(i) * esize; };
  const int64_t len = std::clamp<int64_t>(bucket / W, 1, std::max<int64_t>(S, 1));
  if (len >= S) {
    pc.works_.push_back(comm.all_gather(shard.data(), full.data(), static_cast<size_t>(S), type));
    return pc;
  }
  std::vector<std::pair<int64_t, Tensor>> packs;  // (c0, pack)
  for (int64_t c0 = 0; c0 < S; c0 += len) {
    const int64_t c = std::min(len, S - c0);
    const Tensor pack = Tensor::empty(dev, shard.dtype(), {W * c});
    pc.works_.push_back(comm.all_gather(at(shard, c0), pack.data(), static_cast<size_t>(c), type));
    pc.keep_.push_back(pack);
    packs.emplace_back(c0, pack);
  }
  // Device copies, not memcpy: the buffers may live on a GPU (the NCCL path).
  pc.unpack_ = [packs, full, W, S, &dev] {
    for (const auto& [c0, pack] : packs) {
      const int64_t c = pack.numel() / W;
      for (int64_t r = 0; r < W; ++r) dev.copy(full.view(r * S + c0, {c}), pack.view(r * c, {c}));
    }
  };
  return pc;
}

PendingCollective issue_reduce_scatter(comm::Communicator& comm, nn::Device& dev, const Tensor& full,
                                       const Tensor& shard, const Partition& p, int64_t bucket, std::string name) {
  PendingCollective pc(Activity::reduce_scatter, std::move(name), {full, shard});
  pc.comm_ = &comm;
  const int64_t W = p.world, S = p.shard;
  if (W == 1 && shard.data() == full.data()) return pc;
  const int64_t len = std::clamp<int64_t>(bucket / W, 1, std::max<int64_t>(S, 1));
  if (len >= S) {
    pc.works_.push_back(comm.reduce_scatter(full.data(), shard.data(), static_cast<size_t>(S), comm::DataType::f32,
                                            comm::ReduceOp::sum));
    return pc;
  }
  for (int64_t c0 = 0; c0 < S; c0 += len) {
    const int64_t c = std::min(len, S - c0);
    const Tensor pack = Tensor::empty(dev, DType::f32, {W * c});
    for (int64_t r = 0; r < W; ++r) dev.copy(pack.view(r * c, {c}), full.view(r * S + c0, {c}));
    pc.works_.push_back(comm.reduce_scatter(pack.data(), f32(shard) + c0, static_cast<size_t>(c), comm::DataType::f32,
                                            comm::ReduceOp::sum));
    pc.keep_.push_back(pack);
  }
  return pc;
}

PendingCollective issue_all_reduce(comm::Communicator& comm, const Tensor& full, int64_t bucket, std::string name) {
  PendingCollective pc(Activity::all_reduce, std::move(name), {full});
  pc.comm_ = &comm;
  const int64_t n = full.numel();
  const int64_t len = std::clamp<int64_t>(bucket, 1, std::max<int64_t>(n, 1));
  for (int64_t c0 = 0; c0 < n; c0 += len) {
    const int64_t c = std::min(len, n - c0);
    pc.works_.push_back(comm.all_reduce(f32(full) + c0, static_cast<size_t>(c), comm::DataType::f32, comm::ReduceOp::sum));
  }
  return pc;
}

PendingCollective issue_weight_gather(comm::Communicator& comm, nn::Device& dev, const nn::Tensor& shard,
                                      const nn::Tensor& full, const Partition& p, int64_t bucket,
                                      const std::string& name) {
  if (shard.dtype() == full.dtype()) return issue_all_gather(comm, dev, shard, full, p, bucket, name);
  if (p.world == 1) {  // the cast is the whole gather; a no-op collective marks it done
    dev.cast(full.view(0, {p.shard}), shard);
    return issue_all_gather(comm, dev, full, full, p, bucket, name);
  }
  const nn::Tensor low = nn::Tensor::empty(dev, full.dtype(), {p.shard});
  dev.cast(low, shard);
  return issue_all_gather(comm, dev, low, full, p, bucket, name);
}

nn::Tensor gather_target(nn::Device& dev, const Partition& p, const nn::Tensor& shard, nn::DType compute) {
  if (p.world == 1 && !nn::is_low_precision(compute)) return shard;
  return nn::Tensor::empty(dev, compute, {p.padded});
}

UnitGather issue_unit_gather(comm::Communicator& comm, nn::Device& dev, const Tensor& stored, const UnitPartition& p,
                             DType compute, int64_t bucket, const std::string& name) {
  UnitGather g;
  const Partition& t = p.trained;
  if (!p.has_frozen()) {
    g.full = gather_target(dev, t, stored, compute);
    g.pending = issue_weight_gather(comm, dev, stored, g.full, t, bucket, name);
    return g;
  }
  g.full = Tensor::empty(dev, compute, {p.gathered()});
  const int64_t T = t.numel;
  // Between the spans (alignment) nothing real is gathered: zero, as in every layout. Issued
  // first: a gather that also covers it writes the same zeros (shards' padding).
  if (p.frozen_at > T) dev.fill(g.full.view(T, {p.frozen_at - T}), 0.0);
  if (T > 0) {
    const Tensor mine = stored.view(0, {t.shard});
    if (t.padded <= p.frozen_at) {
      g.pending = issue_weight_gather(comm, dev, mine, g.full.view(0, {t.padded}), t, bucket, name);
    } else {
      const Tensor span = Tensor::empty(dev, compute, {t.padded});
      g.pending = issue_weight_gather(comm, dev, mine, span, t, bucket, name);
      const Tensor full = g.full;
      g.pending.then([&dev, full, span, T] { dev.copy(full.view(0, {T}), span.view(0, {T})); }, {span});
    }
  }
  g.pending.join(issue_weight_gather(comm, dev, stored.view(p.stored_frozen_at(), {p.frozen.shard}),
                                     g.full.view(p.frozen_at, {p.frozen.padded}), p.frozen, bucket, name));
  return g;
}

Tensor stored_shard(nn::Device& dev, const Tensor& full, const UnitPartition& p) {
  Tensor out = Tensor::empty(dev, DType::f32, {p.stored()});
  dev.fill(out, 0.0);
  auto take = [&](const Partition& q, int64_t at, int64_t into) {
    const int64_t real = q.owned_real();
    if (real > 0) dev.copy(out.view(into, {real}), full.view(at + q.begin(), {real}));
  };
  take(p.trained, 0, 0);
  if (p.has_frozen()) take(p.frozen, p.frozen_at, p.stored_frozen_at());
  return out;
}

}  // namespace ferry::runtime
