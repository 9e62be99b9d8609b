// FakeGroup: N ranks inside one process, one thread each, for logic tests of sharding at
// any world size without mpiexec (PyTorch c10d's fake process group, but computing the
// real results). Collectives rendezvous on the group's barrier and complete before they
// return; sums run in rank order. Never a hang, as with mpiexec's abort:
// - a rank whose collective differs from the others' (kind, count or type) gets a failed
//   Work naming both;
// - abort(why) (a rank that threw: test::run_ranks calls it) fails every collective
//   waiting or yet to come on every rank, naming why;
// - leave(rank) (a rank done with its work) fails every collective that would wait for
//   it, naming the rank, since it will never arrive.
// Thread safety: each FakeCommunicator is used by its own thread; the group is shared and
// its methods are safe from any thread.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
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
  // Fails every collective waiting now or issued later, on every rank, with `why`.
  void abort(const std::string& why);
  // `rank` issues no more collectives: one that would wait for it fails instead.
  void leave(int rank);

 private:
  friend class FakeCommunicator;
  // Waits until every rank has arrived; throws comm::CommError (naming the cause) once
  // the group is aborted or a rank has left.
  void arrive_and_wait();
  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::string failure_;  // "" while the group is healthy
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
  void run(const Op& op, const WorkPtr& work);  // throws CommError when the group fails
  FakeGroup& group_;
  int rank_;
};

}  // namespace ferry::testing
