#include "runtime/zero/reduction_queue.h"

namespace ferry::runtime {

void ReductionQueue::issue(int unit, const Partition& p, const nn::Tensor& full, const nn::Tensor& shard, bool last,
                           const std::string& name, const nn::Tensor& home, bool overwrite) {
  Entry e;
  e.unit = unit;
  e.name = name;
  e.last = last;
  if (policy_.reduce_every_micro) {
    e.full = full;
    // Alone there is nothing to reduce: the full gradient is the shard.
    e.reduced = p.world == 1 ? full : nn::Tensor::empty(dev_, nn::DType::f32, {p.shard});
    e.work = issue_reduce_scatter(comm_, dev_, e.full, e.reduced, p, bucket_, name);
    e.result = e.reduced;
  } else if (policy_.reduction == ReduceKind::reduce_scatter) {
    // Landing: the persistent shard is host memory, which a device collective cannot write.
    const nn::Tensor out = host_ ? nn::Tensor::empty(dev_, nn::DType::f32, {p.shard}) : shard;
    e.full = full;
    e.work = issue_reduce_scatter(comm_, dev_, full, out, p, bucket_, name);
    if (host_) e.result = out, e.reduced = out;
  } else {
    if (host_) throw std::logic_error("ReductionQueue: an all-reduce does not land (stage 0 keeps no shard)");
    e.full = full;
    e.work = issue_all_reduce(comm_, full, bucket_, name);
  }
  if (host_) {
    if (!home.defined()) throw std::logic_error("ReductionQueue: landing without a home for " + name);
    e.home = home;
    if (!overwrite) e.spare = take_spare(e.result.numel());
    // Ordered on the device after the collective itself: it comes down as soon as the
    // reduction completes, without waiting for the compute queued since. Alone (nothing
    // to reduce) the gradient is complete now: it comes down behind the compute issued so
    // far, which ends with its last producer, not behind the next unit's backward.
    if (std::shared_ptr<void> marker = e.work.device_marker()) {
      start_download(e, marker);
    } else if (e.work.in_place()) {
      start_download(e, nullptr);
    }
  }
  queue_.push_back(std::move(e));
}

void ReductionQueue::start_download(Entry& e, const std::shared_ptr<void>& after) {
  const nn::Tensor& dst = e.spare.defined() ? e.spare : e.home;
  e.download = dev_.download(dst.data(), e.result, after);
  if (tracer_) {
    const nn::Transfer::Span s = e.download->span();
    tracer_->record_device(Activity::download, e.name, s.begin, s.end, e.result.nbytes());
  }
}

nn::Tensor ReductionQueue::take_spare(int64_t n) {
  for (size_t i = 0; i < spares_.size(); ++i) {
    if (spares_[i].numel() != n) continue;
    nn::Tensor t = spares_[i];
    spares_.erase(spares_.begin() + static_cast<std::ptrdiff_t>(i));
    return t;
  }
  return nn::Tensor::empty(*host_, nn::DType::f32, {n});
}

void ReductionQueue::poll(bool wait_all, const Accumulate& accumulate, const Finished& finished) {
  while (!queue_.empty()) {
    Entry& e = queue_.front();
    if (!e.finished_work) {
      if (!wait_all && !e.work.done()) break;
      e.work.finish(tracer_);
      e.finished_work = true;
      if (host_ && !e.download) start_download(e, nullptr);  // after finish()'s ordering
    }
    if (e.download) {
      if (!wait_all && !e.download->done()) break;
      e.download->wait();
      if (e.spare.defined()) {
        accumulate(e.unit, e.spare);
        spares_.push_back(e.spare);
      }
    } else if (e.reduced.defined()) {
      accumulate(e.unit, e.reduced);
    }
    const int unit = e.unit;
    const bool last = e.last;
    queue_.pop_front();
    finished(unit, last);
  }
}

void ReductionQueue::clear() {
  for (Entry& e : queue_) {
    if (e.download) {
      try {
        e.download->wait();
      } catch (...) {  // the device's error surfaces at its next use; the buffers must outlive the copy
      }
    }
  }
  queue_.clear();  // each PendingCollective waits for its transfer before its buffers go
}

}  // namespace ferry::runtime
