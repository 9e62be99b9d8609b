// ShardedUnits: the model's parameters and gradients under ZeRO stages 0-3, one code path.
//
//   stage | weights on each rank        | gradients on each rank                | optimizer range
//   0     | full                        | full, all-reduced at the step's end   | the full unit
//   1     | full                        | full, reduce-scattered at the step's end into a shard | own shard
//   2     | full                        | shard: each micro-batch's full gradient of a unit is reduce-scattered as soon as backward finishes the unit, then freed | own shard
//   3     | shard: a unit's full weights are all-gathered on acquire and freed on the last release | as stage 2 | own shard
//
// Gradients are SUMMED over ranks (and micro-batches); the optimizer divides by
// accumulation steps x world size through its grad_scale. After the optimizer updates its
// range, publish_params() all-gathers the updated shards into the full weights (stages 1-2).
// Collectives are split into chunks of at most reduce_bucket_size / allgather_bucket_size
// elements (summed over ranks, as DeepSpeed counts them).
//
// Memory: every buffer comes from the device (its arena's cap and peak include them); the
// device must be host-accessible (the MPI backend moves host buffers).
// Threads: used from the thread that runs the model. Every method that communicates is
// collective: all ranks call it in the same order.
#pragma once

#include <functional>
#include <map>
#include <vector>

#include "comm/communicator.h"
#include "nn/device.h"
#include "nn/unit.h"
#include "offload/pinned_pool.h"
#include "offload/swapper.h"
#include "runtime/partition.h"
#include "runtime/shard_store.h"

namespace ferry::runtime {

struct ZeroConfig {
  int stage = 0;
  int64_t reduce_bucket_size = 500'000'000;     // elements
  int64_t allgather_bucket_size = 500'000'000;  // elements
};

// Where the persistent shards live besides the device (DeepSpeed's offload_param and the
// gradient half of offload_optimizer).
struct Placement {
  Tier params = Tier::device;   // stage 3's weight shards between uses
  bool grads_on_host = false;   // gradient shards in host memory (optimizer offloaded)
  nn::Device* host = nullptr;   // allocator for host-memory tensors (required if either is off-device)
  std::vector<std::string> param_paths;
  offload::AioConfig aio;
  offload::PinnedPool* pool = nullptr;  // staging for nvme reads and writes
  int prefetch_depth = 1;               // nvme parameter shards read ahead of use
  int64_t max_in_cpu = 0;               // nvme: elements of parameter shards kept in host memory instead
  offload::FaultHook fault;             // tests only
};

struct StateBytes {
  size_t weights = 0, gradients = 0;  // persistent, this rank
};

class ShardedUnits final : public nn::UnitAccess {
 public:
  // Allocates the persistent buffers and initialises the weights: `init(u, full)` writes
  // unit u's full weights into `full` (every rank computes the same values; each keeps
  // what its stage keeps), so the initial model does not depend on the world size.
  ShardedUnits(nn::Device& device, comm::Communicator& comm, const std::vector<nn::UnitSpec>& units,
               const ZeroConfig& zero, const std::function<void(int, const nn::Tensor&)>& init,
               const Placement& placement = {});

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
  void read_owned_weights(int unit, int64_t offset, int64_t n, float* buf);
  void write_owned_weights(int unit, int64_t offset, int64_t n, const float* buf);
  const Placement& placement() const { return place_; }
  Owned owned(int unit) const;
  // This rank's shard [begin, begin + shard) of the reduced gradient, whatever the stage:
  // the squared norms of these slices summed over ranks give the global gradient norm.
  nn::Tensor grad_shard(int unit) const;

  // Starts a step: zeroes the gradients. With nvme parameters it also ends the recording
  // of the unit order (the first step's) and prefetches the first units of the next.
  void zero_grads();
  int64_t prefetch_hits() const { return prefetch_hits_; }
  void finish_gradients();  // stages 0-1: reduce the step's full gradients (collective)
  void publish_params();    // stages 1-2: all-gather updated shards (collective)
  // Host copy of unit's full weights (numel elements). Collective at stage 3.
  std::vector<float> full_weights(int unit);
  StateBytes state_bytes() const;

 private:
  void gather(const nn::Tensor& shard, const nn::Tensor& full, const Partition& p);
  void reduce_scatter(const nn::Tensor& full, const nn::Tensor& shard, const Partition& p);
  void all_reduce(const nn::Tensor& full);

  void init_param_stores(const std::vector<int64_t>& shard_sizes);
  nn::Tensor fetch_shard(int unit);  // stage 3: this rank's weight shard, readable on the device
  void prefetch_from(size_t position);
  void cancel_prefetches();

  nn::Device& dev_;
  comm::Communicator& comm_;
  ZeroConfig zero_;
  Placement place_;
  std::unique_ptr<ShardStore> params_;      // stage 3 weight shards, in the configured tier
  std::unique_ptr<ShardStore> params_cpu_;  // nvme with max_in_cpu: the first units' shards in host memory
  std::vector<std::pair<ShardStore*, int>> home_;  // per unit: its store and region
  ShardStore& store(int unit) const { return *home_.at(static_cast<size_t>(unit)).first; }
  int region(int unit) const { return home_.at(static_cast<size_t>(unit)).second; }
  std::vector<Partition> parts_;
  std::vector<nn::Tensor> full_w_, full_g_, shard_g_;
  struct Live {
    nn::Tensor full;
    int refs = 0;
  };
  std::map<int, Live> live_w_, live_g_;  // stage 3 gathered weights; stage 2-3 full gradients
  // nvme parameter prefetch: the order of fetches recorded on the first step, the position
  // in it, and the reads in flight.
  std::unique_ptr<offload::Swapper> swapper_;
  std::vector<int> order_;
  bool recording_ = true;
  size_t position_ = 0;
  std::map<int, offload::Swapper::Ticket> prefetched_;
  int64_t prefetch_hits_ = 0;
};

}  // namespace ferry::runtime
