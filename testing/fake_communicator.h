// FakeGroup: N ranks inside one process, one thread each, for logic tests of sharding at
// any world size without mpiexec (PyTorch c10d's fake process group, but computing the
// real results). Collectives rendezvous on a std::barrier and complete before they return;
// sums run in rank order. A rank whose collective differs from the others' (kind, count or
// type) gets a failed Work naming both, instead of a hang.
// Thread safety: each FakeCommunicator is used by its own thread; the group is shared.
#pragma once

#include <barrier>
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace ferry::testing {

// The fake speaks comm's vocabulary throughout.
using namespace ferry::comm;  // NOLINT(google-build-using-namespace)

class FakeGroup {
 public:
  explicit FakeGroup(int size);
  int size() const { return size_; }
  // The communicator of `rank`; the group must outlive it.
  std::unique_ptr<Communicator> communicator(int rank);

 private:
  friend class FakeCommunicator;
  int size_;
  std::barrier<> barrier_;
  std::vector<Op> ops_;
};

class FakeCommunicator final : public comm::Communicator {
 public:
  FakeCommunicator(FakeGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }
  std::string name() const override { return "fake"; }

 protected:
  void execute(const Op& op, const WorkPtr& work) override;

 private:
  FakeGroup& group_;
  int rank_;
};

}  // namespace ferry::testing
