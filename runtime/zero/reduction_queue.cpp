#include "runtime/zero/reduction_queue.h"

namespace ferry::runtime {

void ReductionQueue::issue(int unit, const Partition& p, const nn::Tensor& full, const nn::Tensor& shard, bool last,
                           const std::string& name) {
  Entry e;
  e.unit = unit;
  e.last = last;
  if (policy_.reduce_every_micro) {
    e.full = full;
    // Alone there is nothing to reduce: the full gradient is the shard.
    e.reduced = p.world == 1 ? full : nn::Tensor::empty(dev_, nn::DType::f32, {p.shard});
    e.work = issue_reduce_scatter(comm_, dev_, e.full, e.reduced, p, bucket_, name);
  } else if (policy_.reduction == ReduceKind::reduce_scatter) {
    e.work = issue_reduce_scatter(comm_, dev_, full, shard, p, bucket_, name);
  } else {
    e.work = issue_all_reduce(comm_, full, bucket_, name);
  }
  queue_.push_back(std::move(e));
}

void ReductionQueue::poll(bool wait_all, const Accumulate& accumulate, const Finished& finished) {
  while (!queue_.empty() && (wait_all || queue_.front().work.done())) {
    Entry& e = queue_.front();
    e.work.finish(tracer_);
    if (e.reduced.defined()) accumulate(e.unit, e.reduced);
    const int unit = e.unit;
    const bool last = e.last;
    queue_.pop_front();
    finished(unit, last);
  }
}

}  // namespace ferry::runtime
