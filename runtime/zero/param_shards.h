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
// Shards off the device are kept in the compute dtype when it is bf16 or f16 (ZeRO-Infinity's
// fp16 parameters: half the bytes read from NVMe and sent over PCIe); the fp32 master
// is the optimizer's (runtime/zero/optimizer_state.h), which writes the rounded weights
// back through write_rounded (CPU Adam's fused copy-out) or write (rounding here).
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
  // Names this process's nvme files: its rank in the job (-1: the communicator's rank).
  // Hybrid sharding needs it, as ranks of two groups share an index within their groups.
  int file_rank = -1;
  // Shards in the 16-bit compute dtype (bf16, f16) on the device too, the fp32 master being the
  // optimizer's: ShardedUnits sets it for units with frozen tensors, so a frozen base
  // costs two bytes a parameter at stage 3 wherever it is kept.
  bool low_precision_on_device = false;
};

class ParamShards {
 public:
  // Opens the stores for every unit's shard (zeroed); `names` label trace spans. `compute`:
  // the dtype the model computes in (16-bit shards off the device when it is bf16 or f16).
  // Each unit's shard is UnitPartition::stored() elements: its trained shard, then its
  // frozen one (read by gathers, never written: the optimizer's ranges are the trained
  // shard's, runtime/zero/sharded_units.h).
  ParamShards(nn::Device& device, const std::vector<UnitPartition>& parts, const std::vector<std::string>& names,
              int rank, const Placement& place, nn::DType compute = nn::DType::f32);
  // The dtype shards are kept in: the compute dtype off the device in a bf16 or fp16 run
  // (and on it with low_precision_on_device), fp32 otherwise.
  nn::DType dtype() const { return dtype_; }

  // Stores this rank's shard (`shard`: [stored()] on the device, unit_collectives.h's
  // stored_shard), once, at start.
  void init(int unit, const nn::Tensor& shard);
  offload::Tier tier(int unit) const { return store(unit).tier(); }
  bool on_nvme(int unit) const { return tier(unit) == offload::Tier::nvme; }
  // The shard in memory (device and cpu homes; undefined on nvme), used in place.
  nn::Tensor resident(int unit) const { return store(unit).tensor(region(unit)); }
  // The shard as a device tensor: resident (used in place on a host-accessible device or
  // when its home is the device), uploaded from host memory (a GPU: the compute stream
  // orders after the copy, the host does not wait), or read from nvme now through the pool.
  nn::Tensor fetch(int unit);
  // dst (the device) <- src (host memory: a pool buffer or unit's host shard), traced as
  // the unit's upload on the device's clock.
  nn::TransferPtr upload(int unit, const nn::Tensor& dst, const void* src);
  // nvme: the whole shard, in dtype(), into a pool buffer (the prefetcher's swapper job);
  // `queued`: when the prefetcher asked for it (the trace's args.queued_ts).
  void read_into(int unit, void* buf, Tracer::Clock::time_point queued = {});
  // [offset, offset + n) of the shard as fp32 through host memory (ShardStore's rules for
  // nvme: `buf` a pool buffer, `offset` a multiple of quantum()); 16-bit shards widen on
  // read and round to nearest even on write.
  void read(int unit, int64_t offset, int64_t n, float* buf);
  void write(int unit, int64_t offset, int64_t n, const float* buf);
  // The same range, already rounded to dtype() (16-bit shards only): CPU Adam's fused copy-out.
  void write_rounded(int unit, int64_t offset, int64_t n, const uint16_t* buf);
  // Elements of dtype() one pool buffer holds (0 without a pool): longer shards are not read ahead.
  int64_t buffer_elements() const;
  int64_t quantum() const;  // nvme offsets of read/write, elements

  struct Bytes {
    size_t total = 0, host = 0, nvme = 0;
  };
  Bytes bytes() const;
  void set_tracer(Tracer* t) { tracer_ = t; }

 private:
  offload::ShardStore& store(int unit) const { return *home_.at(static_cast<size_t>(unit)).first; }
  int region(int unit) const { return home_.at(static_cast<size_t>(unit)).second; }

  nn::Device& dev_;
  nn::DType dtype_ = nn::DType::f32;
  std::vector<int64_t> sizes_;  // per unit: the stored shard's elements
  std::vector<std::string> names_;
  Placement place_;
  std::unique_ptr<offload::ShardStore> params_;      // the configured tier
  std::unique_ptr<offload::ShardStore> params_cpu_;  // nvme with max_in_cpu: the first units' shards
  std::vector<std::pair<offload::ShardStore*, int>> home_;  // per unit: its store and region
  Tracer* tracer_ = nullptr;
};

}  // namespace ferry::runtime
