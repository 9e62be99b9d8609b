// The MPI backend (MPICH) for host buffers.
//
// Thread level and progress: MPI is initialised with MPI_THREAD_MULTIPLE. Each
// communicator owns one worker thread that runs its collectives one at a time in issue
// order: it starts the non-blocking MPI call and drives it with MPI_Test until done; the
// issuing thread only queues the collective and later waits on the Work. So collectives
// progress while the rank computes, although MPICH progresses non-blocking calls only
// inside MPI calls (MPICH_ASYNC_PROGRESS unset). The worker polls with a backoff (spin,
// then yield, then 50 us naps) instead of blocking: MPICH's blocking collectives spin,
// which on a machine with few cores takes a core from compute or from another rank.
// MULTIPLE is needed because the watchdog may call MPI_Abort while the worker is in MPI.
// Watchdog: a collective not completed comm.timeout_s after it was issued is reported
// on stderr (rank, operation, sequence number, bytes, how long, the recent collectives)
// and the job ends with MPI_Abort: mpiexec then stops every rank.
// Test-only fault: FERRY_FAULT_SKIP_COLLECTIVE=RANK:SEQ makes RANK never take part in
// collective number SEQ of the world communicator, as a rank stuck elsewhere would: its
// Work stays pending, the other ranks wait for it, and every rank's watchdog reports.
// Errors: MPI errors are returned (MPI_ERRORS_RETURN) and fail the Work with MPI's text.
// Lifetime: the world communicator finalises MPI when destroyed (on the thread that
// created it); sub-communicators must be destroyed first.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include <mpi.h>

#include "comm/communicator.h"
#include "comm/watchdog.h"

namespace ferry::comm {

class MpiCommunicator final : public Communicator {
 public:
  // MPI_COMM_WORLD (initialising MPI if needed). Works without mpiexec too (MPI singleton:
  // world size 1).
  static std::unique_ptr<MpiCommunicator> world(double timeout_s);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string name() const override { return "mpi"; }
  MPI_Comm handle() const { return comm_; }
  void set_timeout(double timeout_s) { watchdog_->set_timeout(timeout_s); }
  // Ends every rank of the job (MPI_Abort) after `message` is printed: for fatal errors on
  // one rank, which would otherwise leave the others waiting in a collective.
  [[noreturn]] static void abort_job(const std::string& message, int code);

  // Ranks with the same color form a sub-communicator, ordered by key (hybrid sharding).
  // Collective over this communicator.
  std::unique_ptr<MpiCommunicator> split(int color, int key);

 protected:
  void execute(const Op& op, const WorkPtr& work) override;

 private:
  MpiCommunicator(MPI_Comm comm, double timeout_s, bool owns_mpi);
  void worker_loop();
  void run(const Op& op);

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  double timeout_s_;
  bool owns_mpi_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::tuple<Op, WorkPtr, uint64_t>> queue_;
  bool stop_ = false;
  int fault_rank_ = -1;
  uint64_t fault_seq_ = 0;
  std::unique_ptr<Watchdog> watchdog_;
  std::thread worker_;
};

}  // namespace ferry::comm
