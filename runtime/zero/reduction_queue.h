// ReductionQueue: gradient reductions in flight, finished in issue order. issue() starts a
// unit's reduction the way the stage's policy says (all-reduce of the persistent full
// gradient; reduce-scatter into the persistent shard; or, when reducing every
// micro-batch, reduce-scatter of a per-use full gradient into a new shard that the owner
// accumulates). poll() finishes what is done (or everything): `accumulate` gets each new
// shard while the reduction's buffers still live, `finished` runs after they are freed.
//
// Landing (set_landing: the gradient's home is host memory and the device is not host
// accessible, i.e. a GPU with the optimizer offloaded): the reduction runs on the device
// (NCCL) and only its result comes down, ZeRO-Offload's way: this rank's reduced shard
// (stages 1-3: the optimizer is offloaded from stage 1). The download is queued as soon as it
// can be ordered on the device (the collective's completion event: at issue), else once
// poll() finds the reduction done; it goes straight into the host tensor the owner names
// when it overwrites it (the first contribution of a step), else into a page-locked
// spare that `accumulate` adds on the host. An entry is finished when its download has
// landed, so `finished` (which starts the unit's Adam) never sees a gradient in transit.
//
// Threads: the training thread. Lifetime: clear() or the destructor waits for every
// transfer before its buffers go. Every issue is collective: all ranks in the same order.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "base/trace.h"
#include "comm/communicator.h"
#include "nn/device.h"
#include "runtime/zero/partition.h"
#include "runtime/zero/stage_policy.h"
#include "runtime/zero/unit_collectives.h"

namespace ferry::runtime {

class ReductionQueue {
 public:
  // reduce_every_micro: the new shard of unit's gradient, to add to its persistent one
  // (a host tensor when landing).
  using Accumulate = std::function<void(int unit, const nn::Tensor& reduced)>;
  // After any reduction; `last`: the unit's last reduction of the step.
  using Finished = std::function<void(int unit, bool last)>;

  ReductionQueue(const StagePolicy& policy, nn::Device& device, comm::Communicator& comm, int64_t bucket)
      : policy_(policy), dev_(device), comm_(comm), bucket_(bucket) {}
  ~ReductionQueue() { clear(); }

  // Results come down to `host` memory (page-locked allocations: nn::CpuDevice::set_pinning).
  void set_landing(nn::Device* host) { host_ = host; }
  bool landing() const { return host_ != nullptr; }

  // `full`: the unit's full gradient ([padded]); `shard`: its persistent shard (stage 1).
  // Landing: `home` is the host tensor the result lands in (the shard) and `overwrite` says that it may be overwritten instead of accumulated into.
  void issue(int unit, const Partition& p, const nn::Tensor& full, const nn::Tensor& shard, bool last,
             const std::string& name, const nn::Tensor& home = nn::Tensor{}, bool overwrite = false);
  // Finishes reductions from the oldest on: every one (wait_all) or those already done.
  void poll(bool wait_all, const Accumulate& accumulate, const Finished& finished);
  void clear();
  bool empty() const { return queue_.empty(); }
  void set_tracer(Tracer* t) { tracer_ = t; }

 private:
  struct Entry {
    int unit = -1;
    std::string name;
    nn::Tensor full, reduced;  // kept alive until the reduction (and its download) finishes
    PendingCollective work;
    bool last = false;
    bool finished_work = false;
    // Landing.
    nn::Tensor home, spare;  // where it lands; the spare it lands in first when accumulating
    nn::Tensor result;       // the device tensor that comes down
    nn::TransferPtr download;
  };
  void start_download(Entry& e, const std::shared_ptr<void>& after);
  nn::Tensor take_spare(int64_t n);

  StagePolicy policy_;
  nn::Device& dev_;
  comm::Communicator& comm_;
  int64_t bucket_;
  nn::Device* host_ = nullptr;
  std::deque<Entry> queue_;  // in issue order
  std::vector<nn::Tensor> spares_;  // landing: page-locked spares, as many as were ever in flight at once
  Tracer* tracer_ = nullptr;
};

}  // namespace ferry::runtime
