// ParamShards: stage 3's weight shards between uses, each unit's in its home: the tier
// Placement::params names (device, cpu, nvme), except that with nvme the first units'
// shards up to max_in_cpu elements stay in host memory. Everything about the tiers is in
// offload/ (ShardStore, staged copies, Swapper); this class only decides the homes and
// moves whole shards in and out for ShardedUnits and its Prefetcher.
// Threads: read_into runs on the prefetcher's swapper thread and write on the
// UpdateWorker's thread, each for a unit the training thread is not touching; everything
// else on the training thread. Errors: StorageError from nvme, naming the file.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/trace.h"
#include "nn/device.h"
#include "offload/pinned_pool.h"
#include "offload/shard_store.h"
#include "runtime/zero/partition.h"

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

class ParamShards {
 public:
  // Opens the stores for every unit's shard (zeroed); `names` label trace spans.
  ParamShards(nn::Device& device, const std::vector<Partition>& parts, const std::vector<std::string>& names,
              int rank, const Placement& place);

  // Stores this rank's shard of `full` ([padded] on the device), once, at start.
  void init(int unit, const nn::Tensor& full);
  offload::Tier tier(int unit) const { return store(unit).tier(); }
  bool on_nvme(int unit) const { return tier(unit) == offload::Tier::nvme; }
  // The shard in memory (device and cpu homes; undefined on nvme), used in place.
  nn::Tensor resident(int unit) const { return store(unit).tensor(region(unit)); }
  // The shard as a device tensor: resident, or read from nvme now through the pool.
  nn::Tensor fetch(int unit);
  // nvme: the whole shard into a pool buffer (the prefetcher's swapper job).
  void read_into(int unit, float* buf);
  // [offset, offset + n) of the shard through host memory (ShardStore's rules for nvme).
  void read(int unit, int64_t offset, int64_t n, float* buf);
  void write(int unit, int64_t offset, int64_t n, const float* buf);
  // Elements one pool buffer holds (0 without a pool): longer shards are not read ahead.
  int64_t buffer_elements() const;

  struct Bytes {
    size_t total = 0, host = 0, nvme = 0;
  };
  Bytes bytes() const;
  void set_tracer(Tracer* t) { tracer_ = t; }

 private:
  offload::ShardStore& store(int unit) const { return *home_.at(static_cast<size_t>(unit)).first; }
  int region(int unit) const { return home_.at(static_cast<size_t>(unit)).second; }

  nn::Device& dev_;
  std::vector<Partition> parts_;
  std::vector<std::string> names_;
  Placement place_;
  std::unique_ptr<offload::ShardStore> params_;      // the configured tier
  std::unique_ptr<offload::ShardStore> params_cpu_;  // nvme with max_in_cpu: the first units' shards
  std::vector<std::pair<offload::ShardStore*, int>> home_;  // per unit: its store and region
  Tracer* tracer_ = nullptr;
};

}  // namespace ferry::runtime
