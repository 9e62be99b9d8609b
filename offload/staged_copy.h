// Whole-region copies between memory and a ShardStore in pieces of one pinned buffer:
// what the nvme tier's O_DIRECT transfers need (aligned buffers, offsets in 1024-element
// steps), used the same way for every tier so the bytes moved do not depend on it.
// Threads: as ShardStore (one thread at a time per store); the pool is thread safe.
// Errors: StorageError from the nvme tier; the pinned buffer goes back to the pool first.
#pragma once

#include <cstdint>

#include "offload/pinned_pool.h"
#include "offload/shard_store.h"

namespace ferry::offload {

// Writes src[0, n) into [0, n) of `region`: through one buffer of `pool`, piece by piece,
// or in one write from src when pool is null (device and cpu tiers only).
void write_staged(ShardStore& store, int region, const float* src, int64_t n, PinnedPool* pool);
// Reads [0, n) of `region` into dst (any host memory) through one buffer of `pool`.
void read_staged(ShardStore& store, int region, float* dst, int64_t n, PinnedPool& pool);

}  // namespace ferry::offload
