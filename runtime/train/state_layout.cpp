#include "runtime/train/state_layout.h"

#include <algorithm>

#include "runtime/zero/partition.h"

namespace ferry::runtime {

Tiers state_tiers(const OffloadConfig& off) {
  return {off.optimizer_device, off.param_device};
}

std::optional<offload::PinnedPoolOptions> staging_pool_options(const OffloadConfig& off, Tiers tiers,
                                                               const std::vector<nn::UnitSpec>& units,
                                                               int ranks, int rank) {
  const bool opt_nvme = tiers.optimizer == offload::Tier::nvme, param_nvme = tiers.params == offload::Tier::nvme;
  if (!opt_nvme && !param_nvme) return std::nullopt;
  int64_t largest = 0;
  // A pool buffer holds a unit's stored shard (trainable and frozen spans, partition.h).
  for (const auto& u : units) largest = std::max(largest, unit_partition(u, ranks, rank).stored());
  const int64_t quantum = offload::kNvmeQuantum;
  const int64_t elems = std::min<int64_t>(off.param_buffer_size, (largest + quantum - 1) / quantum * quantum);
  offload::PinnedPoolOptions po;
  po.buffer_size = static_cast<size_t>(std::max<int64_t>(elems, quantum)) * 4;
  po.buffer_count = (opt_nvme ? off.optimizer_buffers : 0) + (param_nvme ? off.param_buffers + 1 : 0);
  po.pin = off.optimizer_pin && off.param_pin;
  return po;
}

Placement state_placement(const Config& cfg, Tiers tiers, nn::Device* host, offload::PinnedPool* pool,
                          bool* clamped) {
  const OffloadConfig& off = cfg.offload;
  Placement place;
  place.params = tiers.params;
  place.grads_on_host = tiers.optimizer != offload::Tier::device;
  place.host = host;
  place.param_paths = off.param_paths;
  place.aio = off.aio;
  place.pool = pool;
  place.fault = off.fault;
  place.max_in_cpu = off.max_in_cpu;
  place.prefetch_depth = cfg.schedule.prefetch_depth;
  const bool clamp = tiers.params == offload::Tier::nvme && place.prefetch_depth > off.param_buffers - 1;
  if (clamp) place.prefetch_depth = off.param_buffers - 1;
  if (clamped != nullptr) *clamped = clamp;
  place.overlap_io = cfg.schedule.overlap_offload;
  return place;
}

}  // namespace ferry::runtime
