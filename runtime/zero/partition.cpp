#include "runtime/zero/partition.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ferry::runtime {

int64_t Partition::owned_real() const { return std::clamp<int64_t>(numel - begin(), 0, shard); }

Partition partition(int64_t numel, int world, int rank) {
  if (world < 1 || rank < 0 || rank >= world || numel < 0) {
    throw std::invalid_argument("partition: numel " + std::to_string(numel) + ", world " + std::to_string(world) +
                                ", rank " + std::to_string(rank));
  }
  Partition p;
  p.numel = numel;
  p.world = world;
  p.rank = rank;
  const int64_t quantum = kShardAlign * world;
  p.padded = std::max<int64_t>(quantum, (numel + quantum - 1) / quantum * quantum);
  p.shard = p.padded / world;
  return p;
}

}  // namespace ferry::runtime
