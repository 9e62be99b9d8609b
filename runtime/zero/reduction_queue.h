// ReductionQueue: gradient reductions in flight, finished in issue order. issue() starts a
// unit's reduction the way the stage's policy says (all-reduce of the persistent full
// gradient; reduce-scatter into the persistent shard; or, when reducing every
// micro-batch, reduce-scatter of a per-use full gradient into a new shard that the owner
// accumulates). poll() finishes what is done (or everything): `accumulate` gets each new
// shard while the reduction's buffers still live, `finished` runs after they are freed.
// Threads: the training thread. Lifetime: clear() or the destructor waits for every
// transfer before its buffers go. Every issue is collective: all ranks in the same order.
#pragma once

#include <deque>
#include <functional>

#include "base/trace.h"
#include "comm/communicator.h"
#include "nn/device.h"
#include "runtime/zero/partition.h"
#include "runtime/zero/stage_policy.h"
#include "runtime/zero/unit_collectives.h"

namespace ferry::runtime {

class ReductionQueue {
 public:
  // reduce_every_micro: the new shard of unit's gradient, to add to its persistent one.
  using Accumulate = std::function<void(int unit, const nn::Tensor& reduced)>;
  // After any reduction; `last`: the unit's last reduction of the step.
  using Finished = std::function<void(int unit, bool last)>;

  ReductionQueue(const StagePolicy& policy, nn::Device& device, comm::Communicator& comm, int64_t bucket)
      : policy_(policy), dev_(device), comm_(comm), bucket_(bucket) {}

  // `full`: the unit's full gradient ([padded]); `shard`: its persistent shard (stage 1).
  void issue(int unit, const Partition& p, const nn::Tensor& full, const nn::Tensor& shard, bool last,
             const std::string& name);
  // Finishes reductions from the oldest on: every one (wait_all) or those already done.
  void poll(bool wait_all, const Accumulate& accumulate, const Finished& finished);
  void clear() { queue_.clear(); }
  bool empty() const { return queue_.empty(); }
  void set_tracer(Tracer* t) { tracer_ = t; }

 private:
  struct Entry {
    int unit = -1;
    nn::Tensor full, reduced;  // kept alive until the reduction finishes
    PendingCollective work;
    bool last = false;
  };
  StagePolicy policy_;
  nn::Device& dev_;
  comm::Communicator& comm_;
  int64_t bucket_;
  std::deque<Entry> queue_;  // in issue order
  Tracer* tracer_ = nullptr;
};

}  // namespace ferry::runtime
