// StagePolicy: what a ZeRO stage keeps and how it reduces, as data. Computed once from
// the stage and the compute dtype; ShardedUnits, its prefetcher and the reduction queue
// read these fields instead of comparing stage numbers.
//
//   stage | full fp32 weights | weight shards | full grads | grad shard | reduction        | reduce
//   0     | yes               | no            | yes        | no         | all-reduce       | last micro-batch
//   1     | yes               | no            | yes        | yes        | reduce-scatter   | last micro-batch
//   2     | yes               | no            | per use    | yes        | reduce-scatter   | every micro-batch
//   3     | no                | yes           | per use    | yes        | reduce-scatter   | every micro-batch
//
// Pure value type; thread-safe to read. of() throws std::invalid_argument for a stage
// outside 0..3.
#pragma once

#include <string>

#include "nn/tensor.h"

namespace ferry::runtime {

enum class ReduceKind { all_reduce, reduce_scatter };

struct StagePolicy {
  int stage = 0;
  // Weights: full fp32 copies on every rank (0-2), or only this rank's shard, gathered on
  // acquire and freed on the last release (3; the only stage whose shards may be offloaded).
  bool full_weights = true;
  bool sharded_weights = false;
  // Mixed precision at stages 0-2: a persistent full copy in the compute dtype.
  bool compute_copy = false;
  // Gradients: a persistent full buffer (0-1), or one that lives from acquire_grads until
  // its reduction finishes (2-3); a persistent shard of the reduced gradient (1-3).
  bool full_grads = true;
  bool grad_shard = false;
  ReduceKind reduction = ReduceKind::all_reduce;
  // Reduce each micro-batch's gradient as backward releases the unit (2-3), or only the
  // step's last micro-batch's accumulated one (0-1).
  bool reduce_every_micro = false;
  // The optimizer updates the whole unit (0) or this rank's shard (1-3).
  bool updates_whole_unit = true;
  // After an update the weights the model computes with are stale until refreshed:
  // stages 1-2 gather the updated shards; stage 0 under mixed precision casts its copy.
  bool refresh_after_update = false;
  bool refresh_gathers = false;  // the refresh is a collective (1-2), not a local cast

  static StagePolicy of(int stage, nn::DType compute);
  std::string describe() const;  // one line, for logs and test messages
};

}  // namespace ferry::runtime
