// Who the ranks of a job are and whether they still answer: host names and pids of every
// rank (gathered once, when the world communicator is made), and a probe that asks every
// peer for a reply on a communicator of its own.
//
// Why a probe: a collective that never finishes says that some rank is missing, not which.
// When the watchdog fires, silent() pings every peer; a rank whose host dropped off the
// network, or whose process is gone, does not answer, and the report names it with its
// host. A rank that is alive but stuck elsewhere answers (its probe thread still runs).
// Threads: one responder thread per process polls for pings every 50 ms (MPI_Test, so it
// never spins a core); silent() may be called from any one thread at a time.
// Lifetime: made from MPI_COMM_WORLD after MPI_Init (collective: MPI_Comm_dup), destroyed
// before MPI_Finalize.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <mpi.h>

namespace ferry::comm {

struct RankInfo {
  std::string host;
  long pid = 0;
};

// Every rank's host name and pid, indexed by rank. Collective over `comm`.
std::vector<RankInfo> gather_rank_info(MPI_Comm comm);

// "2 node(s): a (ranks 0-1), b (ranks 2-3)": ranks grouped by host, in order of first rank.
std::string describe_nodes(const std::vector<RankInfo>& ranks);

class PeerProbe {
 public:
  explicit PeerProbe(MPI_Comm world);  // collective over `world`
  ~PeerProbe();
  PeerProbe(const PeerProbe&) = delete;
  PeerProbe& operator=(const PeerProbe&) = delete;

  // The peers (ranks of `world` other than this one) that did not answer a ping within
  // wait_s seconds, in rank order.
  std::vector<int> silent(double wait_s);

  // Before MPI_Abort, which kills the peers where they stand (mpiexec sends SIGKILL):
  // asks each peer's responder to remove its scratch files, and removes this process's
  // (base/scratch_files.h's end_scratch_files: files registered later go at once too).
  // Returns at once; a responder acts within its 50 ms poll, so the caller waits a little
  // before MPI_Abort. Any thread; uses the world's probe (the first made in this
  // process), and only removes this process's files if there is none.
  static void clean_up_before_abort();

 private:
  void respond_loop();
  void send_abort_notices();
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<std::vector<int>> pong_bufs_;
  std::atomic<bool> stop_{false};
  std::thread responder_;
};

}  // namespace ferry::comm
