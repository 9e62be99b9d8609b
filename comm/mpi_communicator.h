// The MPI backend (MPICH) for host buffers.
//
// Thread level and progress: MPI is initialised with MPI_THREAD_MULTIPLE. Each
// communicator owns one worker thread that runs its collectives one at a time in issue
// order; the issuing thread only queues a collective and later waits on its Work, so
// collectives progress while the rank computes. How the worker drives MPI (comm.progress):
//   blocking  the blocking collective (MPI_Allgather...). MPICH's blocking algorithms were
//             the fastest measured here (ferry-bench comm, 2 ranks: 0.97-1.03 of a direct
//             call, against 0.86-0.96 for the non-blocking ones), but they spin a core
//             while they wait.
//   polling   the non-blocking collective driven by MPI_Test with a backoff (64 spins,
//             1024 yields, then 50 us naps): slower alone, but it leaves the core to other
//             ranks and to compute threads. With 4 ranks on 2 cores the MPI test took 80 s
//             with spinning calls and 7 s polling.
//   automatic blocking unless the ranks on this node outnumber its cores.
// MULTIPLE is needed because the watchdog may call MPI_Abort while the worker is in MPI.
// Test-only fault: FERRY_FAULT_SKIP_COLLECTIVE=RANK:SEQ makes RANK never take part in
// collective number SEQ of the world communicator, as a rank stuck elsewhere would: its
// Work stays pending, the other ranks wait for it, and every rank's watchdog reports.
// Watchdog reports name this rank's host and ask every peer for an answer first
// (comm/peers.h): a peer that does not answer is named with its host and pid.
// Errors: MPI errors are returned (MPI_ERRORS_RETURN) and fail the Work with MPI's text.
// Lifetime: the world communicator finalises MPI when destroyed (on the thread that
// created it); sub-communicators must be destroyed first.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include <mpi.h>

#include "comm/communicator.h"
#include "comm/peers.h"
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
  void set_timeout(double timeout_s) {
    timeout_s_ = timeout_s;
    watchdog_->set_timeout(timeout_s);
  }
  // Every rank of the world's host name and pid (indexed by world rank); a sub-communicator
  // shares its world's.
  const std::vector<RankInfo>& ranks() const { return *ranks_; }
  enum class Progress { automatic, blocking, polling };
  // Call before issuing collectives (the worker reads it without a lock).
  void set_progress(Progress p);
  bool blocking() const { return blocking_; }
  // Ends every rank of the job (MPI_Abort) after `message` is printed: for fatal errors on
  // one rank, which would otherwise leave the others waiting in a collective.
  [[noreturn]] static void abort_job(const std::string& message, int code);

  // The world communicator's destructor ends MPI: a barrier, then MPI_Finalize under a
  // guard. MPI_Finalize over UCX's TCP transport can hang for good (a rank that finished
  // its part of the endpoint flush waits in PMI and no longer makes progress for a peer
  // still flushing; seen here between namespace hosts, known upstream): after
  // kFinalizeGuardS the process logs it and exits with this status, its work being done.
  // Default 1; the program sets 0 once it has succeeded.
  void set_exit_status(int status) { exit_status_ = status; }
  static constexpr double kFinalizeGuardS = 30;

  // Ranks with the same color form a sub-communicator, ordered by key (hybrid sharding).
  // Collective over this communicator.
  std::unique_ptr<MpiCommunicator> split(int color, int key);

 protected:
  void execute(const Op& op, const WorkPtr& work) override;

 private:
  MpiCommunicator(MPI_Comm comm, double timeout_s, bool owns_mpi, std::shared_ptr<const std::vector<RankInfo>> ranks,
                  std::shared_ptr<PeerProbe> probe);
  std::string report_silent_peers();
  void worker_loop();
  void run(const Op& op);

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  double timeout_s_;
  bool owns_mpi_;
  std::atomic<int> exit_status_{1};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::tuple<Op, WorkPtr, uint64_t>> queue_;
  bool stop_ = false;
  bool blocking_ = false;
  int fault_rank_ = -1;
  uint64_t fault_seq_ = 0;
  std::shared_ptr<const std::vector<RankInfo>> ranks_;
  std::shared_ptr<PeerProbe> probe_;  // the world's; destroyed before MPI_Finalize
  std::unique_ptr<Watchdog> watchdog_;
  std::thread worker_;
};

}  // namespace ferry::comm
