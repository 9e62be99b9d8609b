// Where a run's states go before the engine is built: the pinned staging pool the nvme
// tiers need and the Placement ShardedUnits takes. The trainer and `ferry plan`'s dry run
// (runtime/tools/plan_dry_run.cpp) both call these, so the plan builds what a run builds.
// Pure functions of the configuration and the model's units; no allocation, no I/O.
#pragma once

#include <optional>
#include <vector>

#include "nn/device.h"
#include "nn/unit.h"
#include "offload/pinned_pool.h"
#include "offload/shard_store.h"
#include "runtime/config/config.h"
#include "runtime/zero/sharded_units.h"

namespace ferry::runtime {

struct Tiers {
  offload::Tier optimizer = offload::Tier::device, params = offload::Tier::device;
};
Tiers state_tiers(const OffloadConfig& off);

// The staging pool for nvme tiers (none when nothing lives on nvme): buffers no larger than
// the largest shard this rank owns or offload_param.buffer_size; separate budgets for the
// optimizer's tiles and for parameter shards in flight, plus one for the optimizer's
// write-through of nvme parameters, so that neither side can take the buffers the other
// waits for.
std::optional<offload::PinnedPoolOptions> staging_pool_options(const OffloadConfig& off, Tiers tiers,
                                                               const std::vector<nn::UnitSpec>& units,
                                                               int ranks, int rank);

// The Placement for ShardedUnits. With nvme parameters, prefetching is limited to
// offload_param.buffer_count - 1 units (one buffer stays for reads on demand); `clamped`
// (optional) says whether schedule.prefetch_depth had to be lowered for that.
Placement state_placement(const Config& cfg, Tiers tiers, nn::Device* host, offload::PinnedPool* pool,
                          bool* clamped = nullptr);

}  // namespace ferry::runtime
