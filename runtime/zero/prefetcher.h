// Prefetcher: units fetched ahead of use within a step, from the second step on, once the
// order of use is known (UnitOrder). A flight is one unit at one position of the order:
// its shard read from NVMe on the swapper's thread, then its all-gather issued without
// waiting.
//
// pump(order, next, live) starts, past `next` (the first position not yet used):
// - gathers for positions [next, next + max(1, depth - 1)) with overlap_comm, stopping at
//   the first unit that would take the elements gathered ahead past prefetch_bucket_size,
//   or the gathered elements (`live` in use + ahead) past max_live_parameters, or whose
//   shard is on NVMe but cannot be read ahead (no swapper, longer than a pool buffer).
//   Stages 1-2 (refresh_gathers) gather only units whose compute weights are stale,
//   through the owner's RefreshAhead; stage 0 has nothing to gather ahead.
// - stage 3 with nvme parameters and overlap_io: NVMe reads for [next, next + depth),
//   stopping at a unit longer than a pool buffer or with an update still pending.
// Gathers are decided only from the order, the sizes and the limits, never from timing,
// so every rank issues the same collectives in the same order; a gather whose shard is
// still being read waits for the read. Reads are local and never block on the optimizer.
//
// On a device that is not host accessible (a GPU) a read's pool buffer is uploaded as a
// shard on the copy stream and goes back to the pool once that copy is done; host shards
// are uploaded when their gather is issued ahead (ParamShards::fetch).
// Threads: the training thread only (the swapper runs the reads on its own thread).
// Lifetime: the ParamShards, pool, UpdateWorker and tracer must outlive it; cancel() and
// the destructor wait for reads and gathers in flight and give every pool buffer back.
// Errors: a read's StorageError comes out of take() or pump() when it is waited for.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/trace.h"
#include "comm/communicator.h"
#include "nn/device.h"
#include "offload/pinned_pool.h"
#include "offload/swapper.h"
#include "runtime/zero/param_shards.h"
#include "runtime/zero/partition.h"
#include "runtime/zero/stage_policy.h"
#include "runtime/zero/unit_collectives.h"
#include "runtime/zero/update_worker.h"

namespace ferry::runtime {

struct PrefetchLimits {
  int depth = 2;                     // units fetched ahead of use (Placement::prefetch_depth); 0: none
  bool overlap_comm = true;          // gathers ahead
  bool nvme_reads = false;           // nvme parameters read ahead (Placement: params nvme, overlap_io)
  int64_t bucket = 500000000;        // stage3_prefetch_bucket_size: elements gathered ahead
  int64_t max_live = 1000000000;     // stage3_max_live_parameters: elements gathered in all
  int64_t allgather_bucket = 500000000;  // elements per all-gather chunk
  nn::DType compute = nn::DType::f32;    // dtype of the gathered weights
};

class Prefetcher {
 public:
  // Stages 1-2: if unit's compute weights are stale, waits for its update, issues their
  // refresh gather and marks them fresh; nullopt when nothing is stale.
  using RefreshAhead = std::function<std::optional<PendingCollective>(int unit)>;

  // `shards` (stage 3) and `pool` (nvme reads) may be null when unused.
  Prefetcher(const StagePolicy& policy, const PrefetchLimits& limits, nn::Device& device, comm::Communicator& comm,
             std::vector<UnitPartition> parts, std::vector<std::string> names, ParamShards* shards,
             offload::PinnedPool* pool, RefreshAhead refresh);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  void pump(const std::vector<int>& order, size_t next, int64_t live);
  // The unit at `position`, if it was fetched ahead: completes its read and gather and
  // returns the gathered weights (stages 1-2: the refreshed compute weights).
  std::optional<nn::Tensor> take(size_t position);
  void cancel();

  // What is in flight, by position (tests, logs).
  struct FlightView {
    size_t position = 0;
    int unit = -1;
    bool reading = false;    // an NVMe read started and not yet taken
    bool gathering = false;  // its all-gather issued
  };
  std::vector<FlightView> flights() const;
  int64_t elements_ahead() const;  // gathered (or being gathered) ahead of use
  bool reads_ahead() const { return swapper_ != nullptr; }
  int64_t hits() const { return hits_; }  // units taken from a flight

  void set_tracer(Tracer* t) { tracer_ = t; }
  void set_update_worker(UpdateWorker* w) { updates_ = w; }
  // hpZ (ShardedUnits::set_node_copies): a unit whose node copy is ready when its gather
  // is issued is gathered from it (no read, no upload); a read already started for it is
  // dropped.
  using NodeReady = std::function<bool(int unit)>;
  // Allocates the gathered buffer into *full (ShardedUnits::gather_from_node) and issues.
  using NodeGather = std::function<PendingCollective(int unit, nn::Tensor* full)>;
  void set_node_source(NodeReady ready, NodeGather gather) {
    node_ready_ = std::move(ready);
    node_gather_ = std::move(gather);
  }

 private:
  struct Flight {
    int unit = -1;
    offload::Swapper::Ticket read = 0;  // != 0 while the read is not taken
    nn::Tensor shard, full;
    PendingCollective gather;
  };
  void pump_gathers(const std::vector<int>& order, size_t next, size_t depth, int64_t live);
  void pump_reads(const std::vector<int>& order, size_t next, size_t depth);
  void start_read(Flight& f);
  // Pool buffers whose upload has finished go back (all: waiting for the uploads first).
  void reap(bool all);
  void reap_oldest();  // waits for the oldest retired buffer's upload, then gives it back
  nn::Tensor take_read(Flight& f);
  void issue(Flight& f);  // stage 3: the gather of a flight's shard (read first if needed)
  void wait_update(int unit) { if (updates_) updates_->wait(unit); }
  bool update_ready(int unit) { return updates_ == nullptr || updates_->ready(unit); }
  const UnitPartition& part(int unit) const { return parts_.at(static_cast<size_t>(unit)); }

  StagePolicy policy_;
  PrefetchLimits limits_;
  nn::Device& dev_;
  comm::Communicator& comm_;
  std::vector<UnitPartition> parts_;
  std::vector<std::string> names_;
  ParamShards* shards_;
  offload::PinnedPool* pool_;
  RefreshAhead refresh_;
  std::unique_ptr<offload::Swapper> swapper_;
  std::map<size_t, Flight> flights_;  // by position; all after the current one
  std::deque<std::pair<offload::PooledBuffer, nn::TransferPtr>> retired_;  // pool buffers still being uploaded
  int64_t hits_ = 0;
  Tracer* tracer_ = nullptr;
  UpdateWorker* updates_ = nullptr;
  NodeReady node_ready_;
  NodeGather node_gather_;
  bool from_node(int unit) const { return node_ready_ && node_ready_(unit); }
};

}  // namespace ferry::runtime
