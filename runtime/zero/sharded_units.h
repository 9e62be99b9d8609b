// ShardedUnits: the model's parameters and gradients under ZeRO stages 0-3, one code path.
//
//   stage | weights on each rank        | gradients on each rank                | optimizer range
//   0     | full                        | full, all-reduced                     | the full unit
//   1     | full                        | full, reduce-scattered into a shard   | own shard
//   2     | full                        | shard: each micro-batch's full gradient of a unit is reduce-scattered as soon as backward finishes the unit, then freed | own shard
//   3     | shard: a unit's full weights are all-gathered on acquire and freed on the last release | as stage 2 | own shard
//
// Gradients are SUMMED over ranks (and micro-batches); the optimizer divides by
// accumulation steps x world size through its grad_scale. After the optimizer updates a
// unit's range (stages 1-2), the updated shards are all-gathered into the full weights
// before the unit is used again. Collectives are split into chunks of at most
// reduce_bucket_size / allgather_bucket_size elements (runtime/zero/unit_collectives.h).
//
// The overlapped schedule (docs/design.md, "The overlapped step"). Inside a training step
// (begin_step .. end_step) the units are used in the order the first step recorded
// (runtime/zero/unit_order.h: a different order on any rank or step stops the run naming the
// unit and rank). From the second step on:
// - stage 3: acquiring the unit at position k reads the shards of positions up to
//   k + prefetch_depth from NVMe on the swapper's thread (overlap_io) and issues the
//   all-gathers of positions up to k + max(1, prefetch_depth - 1) without waiting
//   (overlap_comm), within stage3_prefetch_bucket_size elements prefetched and
//   stage3_max_live_parameters elements gathered; stages 1-2 gather updated weights one
//   unit ahead the same way. Which collectives are issued when depends only on the order
//   and the sizes, never on timing, so every rank issues the same sequence.
// - gradients: a unit's reduction (stages 2-3 every micro-batch, stages 0-1 in the last one)
//   is issued as backward releases it; finished reductions are accumulated into the
//   gradient shard at the next unit boundary, and when a unit's last one is in, the
//   on_gradients_ready callback runs (the trainer queues that unit's optimizer work).
// - updates: with an UpdateWorker set, a unit is read or gathered only once the worker has
//   no update for it pending (the next forward waits for the unit it needs, nothing else).
// With overlap_comm and overlap_io off the same calls run in the plain sequential order.
//
// Memory: every buffer comes from the device (its arena's cap and peak include them). The
// device may be a GPU when every state stays on it (params and gradients offload::Tier::device):
// buffers then move only through the communicator (NCCL) and device ops, never memcpy.
// Offloaded placements need a host-accessible device.
// Threads: used from the thread that runs the model, except write_owned_weights (see
// there). Every method that communicates is collective: all ranks call it in the same order.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <vector>

#include "base/trace.h"
#include "comm/communicator.h"
#include "nn/device.h"
#include "nn/unit.h"
#include "offload/pinned_pool.h"
#include "offload/shard_store.h"
#include "offload/swapper.h"
#include "runtime/config/sections.h"
#include "runtime/zero/partition.h"
#include "runtime/zero/unit_collectives.h"
#include "runtime/zero/unit_order.h"
#include "runtime/zero/update_worker.h"

namespace ferry::runtime {


// Where the persistent shards live besides the device (DeepSpeed's offload_param and the
// gradient half of offload_optimizer).
struct Placement {
  offload::Tier params = offload::Tier::device;   // stage 3's weight shards between uses
  bool grads_on_host = false;   // gradient shards in host memory (optimizer offloaded)
  nn::Device* host = nullptr;   // allocator for host-memory tensors (required if either is off-device)
  std::vector<std::string> param_paths;
  offload::AioConfig aio;
  offload::PinnedPool* pool = nullptr;  // staging for nvme reads and writes
  int prefetch_depth = 2;               // units fetched ahead of use (nvme reads need as many pool buffers)
  bool overlap_io = true;               // nvme parameter reads ahead of use
  int64_t max_in_cpu = 0;               // nvme: elements of parameter shards kept in host memory instead
  offload::FaultHook fault;             // tests only
};

struct StateBytes {
  size_t weights = 0, gradients = 0;  // persistent, this rank
  size_t weights_host = 0;             // of `weights`: shards in host memory (offload cpu, nvme's max_in_cpu)
  size_t weights_nvme = 0;             // of `weights`: shards in nvme files
  size_t gradients_host = 0;           // of `gradients`: shards in host memory (optimizer offloaded)
  size_t compute_copy = 0;             // stages 0-2 under mixed precision: the full bf16/f16 weights (device)
};

class ShardedUnits final : public nn::UnitAccess {
 public:
  // Allocates the persistent buffers and initialises the weights: `init(u, full)` writes
  // unit u's full weights into `full` (every rank computes the same values; each keeps
  // what its stage keeps), so the initial model does not depend on the world size.
  ShardedUnits(nn::Device& device, comm::Communicator& comm, const std::vector<nn::UnitSpec>& units,
               const ZeroConfig& zero, const std::function<void(int, const nn::Tensor&)>& init,
               const Placement& placement = {});

  ~ShardedUnits() override;

  nn::Tensor acquire_weights(int unit) override;
  void release_weights(int unit) override;
  nn::Tensor acquire_grads(int unit) override;
  void release_grads(int unit, bool complete) override;

  int stage() const { return zero_.stage; }
  int num_units() const { return static_cast<int>(parts_.size()); }
  const Partition& partition_of(int unit) const { return parts_.at(static_cast<size_t>(unit)); }
  // The element range [begin, begin + length) of the unit's flat buffer this rank's
  // optimizer updates, its weights and (reduced) gradients.
  struct Owned {
    int64_t begin = 0, length = 0;
    nn::Tensor weights, grads;  // f32 [length]; weights undefined when they live on nvme
  };
  // Copies of [offset, offset + n) of the owned compute weights, through host memory. For
  // nvme parameters `buf` must be a PinnedPool buffer and `offset` a multiple of 1024.
  // write_owned_weights may run on the UpdateWorker's thread while the training thread
  // works on other units: it touches only the unit's own shard.
  void read_owned_weights(int unit, int64_t offset, int64_t n, float* buf);
  void write_owned_weights(int unit, int64_t offset, int64_t n, const float* buf);
  const Placement& placement() const { return place_; }
  Owned owned(int unit) const;
  // This rank's shard [begin, begin + shard) of the reduced gradient, whatever the stage:
  // the squared norms of these slices summed over ranks give the global gradient norm.
  nn::Tensor grad_shard(int unit) const;

  // A training step: begin_step zeroes each gradient before its first use in the step and
  // starts the prefetches; `last_micro` says whether the coming forward/backward is the
  // step's last micro-batch; finish_gradients completes every reduction (collective) and
  // fires on_gradients_ready for every unit not yet reported; end_step checks the order.
  void begin_step(int64_t step);  // 1-based
  void set_micro_batch(bool last_micro) { last_micro_ = last_micro; }
  void finish_gradients();
  void end_step();
  // Outside steps (tests): zero every gradient now.
  void zero_grads();
  int64_t prefetch_hits() const { return prefetch_hits_; }  // units whose fetch was started ahead
  const UnitOrder& order() const { return order_; }

  void set_tracer(Tracer* t) { tracer_ = t; }
  void set_update_worker(UpdateWorker* w) { updates_ = w; }
  void on_gradients_ready(std::function<void(int)> f) { grads_ready_ = std::move(f); }
  // Stages 1-2: the optimizer is changing unit's owned weights; they are gathered into the
  // full weights before the next use. publish_params gathers every such unit now.
  void mark_updating(int unit);
  void publish_params();  // collective
  // Host copy of unit's full weights (numel elements) as the model computes with them
  // (rounded to the compute dtype under mixed precision). Collective at stage 3.
  std::vector<float> full_weights(int unit);
  StateBytes state_bytes() const;

 private:
  // A unit fetched ahead of use: its shard read from NVMe (read != 0 while in flight), then
  // its gather issued.
  struct Flight {
    int unit = -1;
    offload::Swapper::Ticket read = 0;
    nn::Tensor shard, full;
    PendingCollective gather;
  };
  // A gradient reduction in flight and where its result goes.
  struct Reduction {
    int unit = -1;
    nn::Tensor full, reduced;  // reduced: stages 2-3, accumulated into the shard when done
    PendingCollective work;
    bool last = false;  // the unit's last reduction of the step
  };

  void init_param_stores(const std::vector<int64_t>& shard_sizes);
  void wait_update(int unit);
  bool update_ready(int unit);
  nn::Tensor read_shard(int unit);  // stage 3, on demand: this rank's shard on the device
  nn::Tensor take_read(Flight& f);  // the shard of a flight whose read was started
  void start_read(Flight& f);
  // shard (fp32) into full (fp32 or the compute dtype: the shard is cast first).
  PendingCollective issue_gather(int unit, const nn::Tensor& shard, const nn::Tensor& full);
  // Stages 0-2: brings the unit's compute weights up to date with its fp32 weights.
  PendingCollective refresh(int unit);
  bool low() const { return nn::is_low_precision(zero_.compute); }
  void pump(size_t position);       // starts the reads and gathers ahead of `position`
  void cancel_flights();
  int64_t gathered_elements() const;
  void issue_reduction(int unit);
  void poll_reductions(bool wait_all);
  void gradient_done(int unit);
  void zero_grad_if_needed(int unit);
  const std::string& name(int unit) const { return order_.unit_name(unit); }
  void compute_begin(int unit);
  void compute_end();

  nn::Device& dev_;
  comm::Communicator& comm_;
  ZeroConfig zero_;
  Placement place_;
  std::unique_ptr<offload::ShardStore> params_;      // stage 3 weight shards, in the configured tier
  std::unique_ptr<offload::ShardStore> params_cpu_;  // nvme with max_in_cpu: the first units' shards in host memory
  std::vector<std::pair<offload::ShardStore*, int>> home_;  // per unit: its store and region
  offload::ShardStore& store(int unit) const { return *home_.at(static_cast<size_t>(unit)).first; }
  int region(int unit) const { return home_.at(static_cast<size_t>(unit)).second; }
  std::vector<Partition> parts_;
  std::vector<nn::Tensor> full_w_, full_g_, shard_g_;
  std::vector<nn::Tensor> compute_w_;  // stages 0-2 under mixed precision: full weights in the compute dtype
  struct Live {
    nn::Tensor full;
    int refs = 0;
  };
  std::map<int, Live> live_w_, live_g_;  // stage 3 gathered weights; stage 2-3 full gradients
  std::vector<int> refs_;                // per unit: the model's acquires not yet released
  std::vector<bool> stale_;              // stages 0-2: weights changed, compute weights not yet refreshed
  std::vector<bool> zero_pending_;       // gradient not yet zeroed in this step
  std::vector<bool> reported_;           // on_gradients_ready fired in this step
  std::vector<bool> reduced_;            // stages 0-1: the step's reduction issued
  UnitOrder order_;
  std::unique_ptr<offload::Swapper> swapper_;  // nvme parameter reads ahead of use
  std::map<size_t, Flight> flights_;           // by position; all after the current one
  std::deque<Reduction> reductions_;           // in issue order
  bool last_micro_ = false;
  int64_t prefetch_hits_ = 0;
  Tracer* tracer_ = nullptr;
  UpdateWorker* updates_ = nullptr;
  std::function<void(int)> grads_ready_;
  int compute_depth_ = 0;
  int compute_unit_ = -1;
  Tracer::Clock::time_point compute_t0_{};
};

}  // namespace ferry::runtime
