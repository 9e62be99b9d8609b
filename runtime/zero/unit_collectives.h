// The collectives of one unit's weights or gradients, issued without waiting.
//
// A chunk of c elements per rank moves W * c elements in all; when a unit's shard exceeds
// the bucket (allgather_bucket_size / reduce_bucket_size, counted over all ranks as
// DeepSpeed counts them), the ranks' slices [r * S + c0, r * S + c0 + c) travel packed in
// a contiguous buffer of their own so that each chunk stays a single collective and all
// chunks can be in flight at once.
// A PendingCollective keeps every buffer it uses alive until finish(), which waits for its
// chunks, unpacks, and records the span [first start, last finish] in the trace.
// World size 1 with the result already in place (the same buffer in and out) issues
// nothing: ShardedUnits lets a unit's shard be its full tensor there.
// Threads: issue and finish on the thread that owns the communicator; done() anywhere.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/trace.h"
#include "comm/communicator.h"
#include "nn/tensor.h"
#include "runtime/zero/partition.h"

namespace ferry::runtime {

class PendingCollective {
 public:
  PendingCollective() = default;
  PendingCollective(PendingCollective&&) = default;
  PendingCollective& operator=(PendingCollective&&) = default;
  ~PendingCollective();  // waits (errors dropped): buffers are never freed under a transfer

  bool valid() const { return issued_; }  // issued and not yet finished
  bool done() const;  // every chunk finished (successfully or not)
  // Waits, rethrows a failed chunk's CommError, unpacks; then the result is in place. On a
  // backend that orders on the device (NCCL), it orders the compute stream after the
  // chunks instead of waiting (the result is in place for every op issued afterwards;
  // the trace records no span then), and the unpacking copies follow on that stream.
  void finish(Tracer* tracer);
  // The device event after which the result is in place, for a consumer on another stream
  // (a download of the reduced gradient): the last chunk's, on a backend that orders on
  // the device and when nothing is unpacked after the chunks; null otherwise (then the
  // consumer orders after finish()).
  std::shared_ptr<void> device_marker() const;
  // Nothing was issued and nothing is unpacked (world size 1, the result the input
  // itself): the result is complete in issue order already, for a consumer on any stream.
  bool in_place() const { return issued_ && works_.empty() && !unpack_; }
  // Makes this one collective of itself and `other` (issued after it on the same
  // communicator): finish() waits for both and unpacks this one's, then other's.
  void join(PendingCollective other);
  // `step` runs after the unpacking (a device copy out of a buffer `keep` holds alive).
  void then(std::function<void()> step, std::vector<nn::Tensor> keep = {});

 private:
  friend PendingCollective issue_all_gather(comm::Communicator&, nn::Device&, const nn::Tensor&, const nn::Tensor&,
                                            const Partition&, int64_t, std::string);
  friend PendingCollective issue_reduce_scatter(comm::Communicator&, nn::Device&, const nn::Tensor&,
                                                const nn::Tensor&, const Partition&, int64_t, std::string);
  friend PendingCollective issue_all_reduce(comm::Communicator&, const nn::Tensor&, int64_t, std::string);
  PendingCollective(Activity activity, std::string name, std::vector<nn::Tensor> keep)
      : issued_(true), activity_(activity), name_(std::move(name)), keep_(std::move(keep)) {
    for (const nn::Tensor& t : keep_) bytes_ = std::max<uint64_t>(bytes_, t.defined() ? t.nbytes() : 0);
  }
  bool issued_ = false;
  comm::Communicator* comm_ = nullptr;  // device-ordering backends finish without a host wait
  Activity activity_ = Activity::all_gather;
  std::string name_;
  uint64_t bytes_ = 0;  // the largest buffer taking part: the collective's full size
  std::vector<comm::WorkPtr> works_;
  std::vector<nn::Tensor> keep_;       // pack buffers and the tensors the chunks read or write
  std::function<void()> unpack_;       // after every chunk finished
};

// full[padded] <- every rank's shard[S].
PendingCollective issue_all_gather(comm::Communicator& comm, nn::Device& dev, const nn::Tensor& shard,
                                   const nn::Tensor& full, const Partition& p, int64_t bucket, std::string name);
// shard[S] <- sum over ranks of their full[r * S, (r + 1) * S).
PendingCollective issue_reduce_scatter(comm::Communicator& comm, nn::Device& dev, const nn::Tensor& full,
                                       const nn::Tensor& shard, const Partition& p, int64_t bucket,
                                       std::string name);
// full <- sum over ranks, in place.
PendingCollective issue_all_reduce(comm::Communicator& comm, const nn::Tensor& full, int64_t bucket,
                                   std::string name);
// Weights: full[padded] (fp32, or the compute dtype under mixed precision) <- every rank's
// fp32 shard. Under mixed precision only this rank's slice is cast, and the gather moves
// two-byte values.
PendingCollective issue_weight_gather(comm::Communicator& comm, nn::Device& dev, const nn::Tensor& shard,
                                      const nn::Tensor& full, const Partition& p, int64_t bucket,
                                      const std::string& name);
// Where a unit's gathered weights go: alone and in fp32 the shard is the unit, otherwise
// a new [padded] tensor of the compute dtype.
nn::Tensor gather_target(nn::Device& dev, const Partition& p, const nn::Tensor& shard, nn::DType compute);

// Stage 3: a unit's weights gathered from every rank's stored shard (`stored`: this
// rank's [trained shard | frozen shard], UnitPartition::stored()) into the layout the
// model reads, in the compute dtype. Without frozen tensors it is gather_target and
// issue_weight_gather. With them, the frozen span is gathered straight into place at
// frozen_at and the trained span into its own buffer whose first trainable_numel elements
// are then copied (its padding would overrun frozen_at). `full` holds the result once
// `pending` is finished.
struct UnitGather {
  nn::Tensor full;  // [gathered()]; the model reads [0, numel)
  PendingCollective pending;
};
UnitGather issue_unit_gather(comm::Communicator& comm, nn::Device& dev, const nn::Tensor& stored,
                             const UnitPartition& p, nn::DType compute, int64_t bucket, const std::string& name);
// This rank's stored shard ([stored()], fp32, zero padding and gap) of a unit's full weights
// `full` ([>= gathered()] on `dev`, zero past numel), laid out as issue_unit_gather reads it.
nn::Tensor stored_shard(nn::Device& dev, const nn::Tensor& full, const UnitPartition& p);

}  // namespace ferry::runtime
