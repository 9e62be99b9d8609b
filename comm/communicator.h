// Communicator: how ranks exchange data. Contract: every rank issues the same collectives
// in the same order with the same sizes.
//
// This release holds the interface the runtime reduces through and the single-process
// implementation (world size 1), where every collective is the identity. Multi-rank
// backends (MPI on host buffers, NCCL on device buffers) implement the same interface.
// Thread safety: collectives are issued from one thread.
#pragma once

#include <cstddef>
#include <span>

namespace ferry::comm {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: every rank ends with the element-wise sum over ranks.
  virtual void all_reduce_sum(std::span<double> values) = 0;
  virtual void barrier() = 0;
};

// World size 1: sums over one rank are the values themselves.
class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(std::span<double>) override {}
  void barrier() override {}
};

}  // namespace ferry::comm
