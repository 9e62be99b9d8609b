// CountingCommunicator: one rank of a world of `size` ranks, alone in this process, whose
// collectives complete at once and move no data. `ferry plan` runs the engine's step on
// it (with nn::CountingDevice): partitions, prefetches and reductions follow the world
// size, while nothing waits for ranks that do not exist.
// Receive buffers are left as they were (an all_gather of unit ids therefore reads the
// same value for every rank, which is what the engine's order check expects of a
// consistent job). Every call still goes through Communicator's funnel: arguments are
// checked and sequence numbers given, so ops() counts what a real rank would issue.
// Thread safety: as Communicator (one issuing thread).
#pragma once

#include <array>
#include <string>

#include "comm/communicator.h"

namespace ferry::comm {

class CountingCommunicator final : public Communicator {
 public:
  // Throws std::invalid_argument unless 0 <= rank < size.
  CountingCommunicator(int rank, int size);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "counting"; }
  // Collectives of each kind issued so far, and the bytes this rank would have sent.
  size_t ops(OpKind k) const { return ops_[static_cast<size_t>(k)]; }
  size_t bytes(OpKind k) const { return bytes_[static_cast<size_t>(k)]; }

 protected:
  void execute(const Op& op, const WorkPtr& work) override;

 private:
  int rank_, size_;
  std::array<size_t, 5> ops_{}, bytes_{};
};

}  // namespace ferry::comm
