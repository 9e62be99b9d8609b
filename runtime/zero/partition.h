// How a unit's flat buffer is split over ranks: padded to a multiple of
// world_size x kShardAlign elements; rank r owns [r * shard, (r + 1) * shard).
// A rank may own nothing but padding (world size larger than a small unit); padding is
// zero in weights and gradients and never read by the model.
#pragma once

#include <cstdint>

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

}  // namespace ferry::runtime
