// How a unit's flat buffer is split over ranks: padded to a multiple of
// world_size x kShardAlign elements; rank r owns [r * shard, (r + 1) * shard).
// A rank may own nothing but padding (world size larger than a small unit); padding is
// zero in weights and gradients and never read by the model.
#pragma once

#include <cstdint>

#include "nn/unit.h"

namespace ferry::runtime {

constexpr int64_t kShardAlign = 16;  // elements: every shard starts 64-byte aligned (fp32)

struct Partition {
  int64_t numel = 0;   // the unit's elements as the model sees them
  int64_t padded = 0;  // multiple of world * kShardAlign, >= numel
  int64_t shard = 0;   // padded / world
  int world = 1, rank = 0;
  int64_t begin() const { return shard * rank; }
  int64_t end() const { return begin() + shard; }
  // Elements of [begin, end) below numel: the real (non-padding) part of this rank's shard.
  int64_t owned_real() const;
};

Partition partition(int64_t numel, int world, int rank);

// A unit's two spans (docs/design/adapters.md, section 1): the trainable tensors
// [0, trainable_numel) and the frozen ones [frozen_at, numel), each partitioned on its
// own, so that each rank owns 1/N of the adapters and 1/N of the frozen base (one
// partition over the whole unit would put a LoRA run's few trainable elements, and so
// all the optimizer's state, on rank 0). A span with no elements has an empty partition
// (padded and shard 0): a unit with nothing frozen is sharded exactly as before, and one
// with nothing trainable has no gradient and no optimizer state.
// This rank stores its trained shard, then its frozen shard from stored_frozen_at(): a
// multiple of kStoreAlign, because nvme writes whole 4 KiB blocks and the optimizer's
// write of the trained shard's end must not reach the frozen shard. A gathered unit is laid
// out as the model reads it: the trained span at 0, the frozen span at frozen_at,
// gathered() elements (each span's padding included).
constexpr int64_t kStoreAlign = 2048;  // elements: 4 KiB of bf16, 8 KiB of fp32 (offload/shard_store.h)

struct UnitPartition {
  Partition trained, frozen;
  int64_t numel = 0;       // the unit's elements as the model sees them
  int64_t frozen_at = 0;   // where the frozen span starts (numel: nothing frozen)
  bool has_frozen() const { return frozen.numel > 0; }
  int64_t stored_frozen_at() const {
    return has_frozen() ? (trained.shard + kStoreAlign - 1) / kStoreAlign * kStoreAlign : trained.shard;
  }
  int64_t stored() const { return stored_frozen_at() + frozen.shard; }
  int64_t gathered() const;
};

// trainable_numel and frozen_at as nn::UnitSpec gives them (nn/unit.h: the trainable
// tensors first, the frozen ones from the first aligned offset after them).
UnitPartition unit_partition(int64_t trainable_numel, int64_t frozen_at, int64_t numel, int world, int rank);
UnitPartition unit_partition(const nn::UnitSpec& unit, int world, int rank);

}  // namespace ferry::runtime
