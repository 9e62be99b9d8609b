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

namespace {
Partition span_partition(int64_t numel, int world, int rank) {
  if (numel > 0) return partition(numel, world, rank);
  Partition p = partition(0, world, rank);
  p.padded = p.shard = 0;
  return p;
}
}  // namespace

int64_t UnitPartition::gathered() const {
  if (!has_frozen()) return trained.padded;
  return std::max(trained.padded, frozen_at + frozen.padded);
}

UnitPartition unit_partition(int64_t trainable_numel, int64_t frozen_at, int64_t numel, int world, int rank) {
  if (trainable_numel < 0 || trainable_numel > frozen_at || frozen_at > numel) {
    throw std::invalid_argument("unit_partition: trainable " + std::to_string(trainable_numel) + ", frozen from " +
                                std::to_string(frozen_at) + ", numel " + std::to_string(numel));
  }
  UnitPartition u;
  u.numel = numel;
  u.frozen_at = frozen_at;
  // All trainable: the one partition of the whole unit, as always (padding to at least
  // one quantum even for an empty unit).
  u.trained = frozen_at == numel ? partition(numel, world, rank) : span_partition(trainable_numel, world, rank);
  u.frozen = span_partition(numel - frozen_at, world, rank);
  return u;
}

UnitPartition unit_partition(const nn::UnitSpec& unit, int world, int rank) {
  int64_t frozen_at = unit.numel;
  for (const nn::TensorSpec& t : unit.tensors)
    if (!t.trainable) frozen_at = std::min(frozen_at, t.offset);
  return unit_partition(unit.trainable_numel, frozen_at, unit.numel, world, rank);
}

}  // namespace ferry::runtime
