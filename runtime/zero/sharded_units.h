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
// The overlapped schedule (docs/design/zero.md, "The overlapped step"). Inside a training step
// (begin_step .. end_step) the units are used in the order the first step recorded
// (runtime/zero/unit_order.h: a different order on any rank or step stops the run naming the
// unit and rank). From the second step on:
// - Prefetcher (prefetcher.h): NVMe reads and all-gathers issued ahead of use within
//   prefetch_depth, stage3_prefetch_bucket_size and stage3_max_live_parameters, in an
//   order that depends only on the order and the sizes; stages 1-2 gather updated weights
//   one unit ahead the same way.
// - ReductionQueue (reduction_queue.h): a unit's reduction (stages 2-3 every micro-batch,
//   stages 0-1 in the last one) is issued as backward releases it; finished reductions are
//   accumulated into the gradient shard at the next unit boundary, and when a unit's last
//   one is in, the on_gradients_ready callback runs (the trainer queues its optimizer work).
// - updates: with an UpdateWorker set, a unit is read or gathered only once the worker has
//   no update for it pending (the next forward waits for the unit it needs, nothing else).
// With overlap_comm and overlap_io off the same calls run in the plain sequential order.
//
// The parts: StagePolicy (stage_policy.h) says what the stage keeps and how it reduces;
// ParamShards (param_shards.h) keeps stage 3's shards in their tiers (the tier mechanics
// are offload/'s); Prefetcher and ReductionQueue as above; this class owns the buffers,
// the reference counts, the order and the step's bookkeeping and ties them together.
// Compute spans are recorded by the TracedUnits decorator (traced_units.h), not here;
// set_tracer covers the collectives and the parameter I/O.
//
// Memory: every buffer the model computes with comes from the device (its arena's cap and
// peak include them); offloaded shards live in Placement::host memory (page-locked on a
// GPU run) or on NVMe. One path for every device (ZeRO-Infinity's): on a device that is not
// host accessible (a GPU) a stage-3 shard comes up as a shard (ParamShards::fetch, or the
// Prefetcher ahead of use) and is all-gathered there by the communicator (NCCL); gradients
// are reduced there and only this rank's result comes down to host memory
// (ReductionQueue's landing). On the CPU device host shards are used in place.
// Threads: used from the thread that runs the model, except write_owned_weights (see
// there). Every method that communicates is collective: all ranks call it in the same order.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "base/trace.h"
#include "comm/communicator.h"
#include "nn/device.h"
#include "nn/unit.h"
#include "offload/pinned_pool.h"
#include "offload/shard_store.h"
#include "runtime/config/sections.h"
#include "runtime/zero/param_shards.h"
#include "runtime/zero/partition.h"
#include "runtime/zero/prefetcher.h"
#include "runtime/zero/reduction_queue.h"
#include "runtime/zero/stage_policy.h"
#include "runtime/zero/unit_collectives.h"
#include "runtime/zero/unit_order.h"
#include "runtime/zero/update_worker.h"

namespace ferry::runtime {


// Placement (where the shards live besides the device) is in param_shards.h.

struct StateBytes {
  size_t weights = 0, gradients = 0;  // persistent, this rank
  size_t weights_host = 0;             // of `weights`: shards in host memory (offload cpu, nvme's max_in_cpu)
  size_t weights_nvme = 0;             // of `weights`: shards in nvme files
  size_t gradients_host = 0;           // of `gradients`: shards in host memory (optimizer offloaded)
  size_t compute_copy = 0;             // stages 0-2 under mixed precision: the full bf16/f16 weights (device)
  size_t node_copies = 0;              // hpZ: this rank's node slices of the weights (device)
};

class ShardedUnits final : public nn::UnitAccess {
 public:
  // Allocates the persistent buffers and initialises the weights: `init(u, full)` writes
  // unit u's full weights into `full` (every rank computes the same values; each keeps
  // what its stage keeps), so the initial model does not depend on the world size.
  // Tensors stored in NF4 (TensorSpec::nf4) are bytes, not values: `init` leaves them, and
  // `quantized(u, tensor, begin, n, dst)` writes bytes [begin, begin + n) of their blobs
  // into host memory, only the ranges this rank keeps, into the 16-bit buffers that hold
  // them (the model's at stages 0-2, the stored shard at stage 3). Absent: they stay zero.
  using QuantizedInit = std::function<void(int unit, size_t tensor, int64_t begin, int64_t n, uint8_t* dst)>;
  ShardedUnits(nn::Device& device, comm::Communicator& comm, const std::vector<nn::UnitSpec>& units,
               const ZeroConfig& zero, const std::function<void(int, const nn::Tensor&)>& init,
               const Placement& placement = {}, const QuantizedInit& quantized = {});

  ~ShardedUnits() override;

  nn::Tensor acquire_weights(int unit) override;
  void release_weights(int unit) override;
  nn::Tensor acquire_grads(int unit) override;
  void release_grads(int unit, bool complete) override;

  int stage() const { return zero_.stage; }
  const StagePolicy& policy() const { return policy_; }
  int num_units() const { return static_cast<int>(parts_.size()); }
  // The partition of the unit's trainable span [0, trainable_numel): what its gradients
  // are reduced over and what the optimizer updates (the whole unit when nothing in it is
  // frozen; empty, shard 0, when nothing in it is trained).
  const Partition& partition_of(int unit) const { return parts_.at(static_cast<size_t>(unit)); }
  // Both spans (partition.h): the frozen one is stored and gathered, never reduced or written.
  const UnitPartition& spans_of(int unit) const { return spans_.at(static_cast<size_t>(unit)); }
  // The element range [begin, begin + length) of the unit's trainable span this rank's
  // optimizer updates, its weights and (reduced) gradients; length 0 for a frozen unit.
  struct Owned {
    int64_t begin = 0, length = 0;
    // grads f32 [length]; weights [length] f32, or owned_dtype() (bf16, f16) where owned_rounded(); undefined
    // when they live on nvme
    nn::Tensor weights, grads;
  };
  // Copies of [offset, offset + n) of the owned compute weights, through host memory. For
  // nvme parameters `buf` must be a PinnedPool buffer and `offset` a multiple of 1024.
  // write_owned_weights may run on the UpdateWorker's thread while the training thread
  // works on other units: it touches only the unit's own shard.
  void read_owned_weights(int unit, int64_t offset, int64_t n, float* buf);
  void write_owned_weights(int unit, int64_t offset, int64_t n, const float* buf);
  // Stage 3 with 16-bit shards (ParamShards::dtype: off the device in a bf16 or fp16 run, and on it
  // for units with frozen tensors): the owned weights are kept rounded, so
  // read_owned_weights gives rounded values, the fp32 master is the optimizer's, and
  // write_owned_rounded takes CPU Adam's fused copy-out (same threads rule).
  bool owned_rounded() const { return shards_ && nn::is_low_precision(shards_->dtype()); }
  nn::DType owned_dtype() const { return shards_ ? shards_->dtype() : nn::DType::f32; }
  void write_owned_rounded(int unit, int64_t offset, int64_t n, const uint16_t* buf);
  // nvme offsets of the read/write calls above must be multiples of this (elements).
  int64_t owned_quantum() const { return shards_ ? shards_->quantum() : offload::kNvmeQuantum; }
  const Placement& placement() const { return place_; }
  Owned owned(int unit) const;
  // This rank's shard [begin, begin + shard) of the reduced gradient, whatever the stage:
  // the squared norms of these slices summed over ranks give the global gradient norm.
  // Undefined for a unit with nothing trainable.
  nn::Tensor grad_shard(int unit) const;
  // Where gradient shards live (the device, or host memory with the optimizer offloaded),
  // whether or not unit 0 has any.
  nn::Device& grad_device() const { return place_.grads_on_host ? *place_.host : dev_; }
  bool trains(int unit) const { return !spans_of(unit).has_frozen() || partition_of(unit).numel > 0; }

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
  int64_t prefetch_hits() const { return prefetch_->hits(); }  // units whose fetch was started ahead
  const UnitOrder& order() const { return order_; }

  // Collectives and parameter I/O; compute spans come from TracedUnits.
  void set_tracer(Tracer* t);
  void set_update_worker(UpdateWorker* w);
  void on_gradients_ready(std::function<void(int)> f) { grads_ready_ = std::move(f); }
  // Hybrid sharding: `comm` joins this rank with the ranks that hold the same shards in the
  // other groups (the ShardedUnits communicator is this rank's group). Each unit's reduced
  // gradient shard is then all-reduced across them (summed) before on_gradients_ready.
  // Those all-reduces run in finish_gradients, every unit in unit order: the same order on
  // every rank whatever finished first, which a device-ordered backend (NCCL streams of two
  // communicators) needs to stay free of cycles. The optimizer then starts after backward
  // rather than during it. `comm` must reach the shard's memory (grad_shard's device).
  void set_replicas(comm::Communicator* comm) { replicas_ = comm; }
  // ZeRO++ hpZ (stage 3): `node` joins this rank with the others of its node group, a
  // subgroup of this rank's shard group. Each unit's first gather after its weights
  // changed keeps this rank's node slice of the gathered weights (1/node size of the unit,
  // in the compute dtype, on the device); until the optimizer touches the unit again
  // (mark_updating, publish_params) its gathers read from those slices over `node`, and
  // no shard is read, uploaded or cast. Which source a gather uses depends only on the
  // order of use, so it is the same on every rank. `node` must reach device memory.
  void set_node_copies(comm::Communicator* node);
  bool node_copy_ready(int unit) const;
  // Issues unit's gather from the node copies into a new buffer *full (the compute dtype;
  // the gathered size, or the node partition's padding where that is longer).
  PendingCollective gather_from_node(int unit, nn::Tensor* full);
  // Stages 1-2: the optimizer is changing unit's owned weights; they are gathered into the
  // full weights before the next use. publish_params gathers every such unit now.
  void mark_updating(int unit);
  void publish_params();  // collective
  // Host copy of unit's full weights (numel elements) as the model computes with them
  // (rounded to the compute dtype under mixed precision); an NF4 tensor's elements are 0
  // (they hold bytes, not values). Collective at stage 3.
  std::vector<float> full_weights(int unit);
  StateBytes state_bytes() const;

 private:
  void wait_update(int unit);
  // Stages 0-2: brings the unit's compute weights up to date with its fp32 weights.
  PendingCollective refresh(int unit);
  int64_t live_elements() const;  // stage 3: gathered weights the model holds
  void issue_reduction(int unit);
  void poll_reductions(bool wait_all);
  void gradient_done(int unit);
  void zero_grad_if_needed(int unit);
  const std::string& name(int unit) const { return order_.unit_name(unit); }
  bool ahead() const { return order_.in_step() && order_.recorded(); }

  nn::Device& dev_;
  comm::Communicator& comm_;
  ZeroConfig zero_;
  StagePolicy policy_;
  Placement place_;
  std::vector<Partition> parts_;        // the trainable spans'
  std::vector<UnitPartition> spans_;
  bool any_frozen_ = false;
  std::vector<nn::Tensor> full_w_, full_g_, shard_g_;
  // Stages 0-2, a unit with frozen tensors: the weights the model reads, [numel] in the
  // compute dtype (f32 in an f32 run). Its frozen span is written once, at start; its
  // trainable span is copied from full_w_ / compute_w_ ([padded] of the trainable span,
  // whose padding would overrun the frozen span) by each refresh.
  std::vector<nn::Tensor> model_w_;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> nf4_ranges_;  // per unit: NF4 tensors' [offset, end)
  void put_quantized(const nn::UnitSpec& spec, int u, const QuantizedInit& quantized, const nn::Tensor& dst,
                     int64_t begin, int64_t n);
  std::vector<bool> fresh_;           // landing: the shard was zeroed and nothing landed yet
  bool land_ = false;                 // reductions on the device, results land on the host
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
  std::unique_ptr<ParamShards> shards_;    // stage 3
  std::unique_ptr<Prefetcher> prefetch_;   // after shards_: its reads use them
  ReductionQueue reductions_;
  bool last_micro_ = false;
  Tracer* tracer_ = nullptr;
  UpdateWorker* updates_ = nullptr;
  std::function<void(int)> grads_ready_;
  comm::Communicator* replicas_ = nullptr;
  void keep_node_copy(int unit, const nn::Tensor& full);
  comm::Communicator* node_ = nullptr;  // hpZ
  std::vector<Partition> node_parts_;
  std::vector<nn::Tensor> node_w_;
  std::vector<bool> node_valid_;
};

}  // namespace ferry::runtime
