#include "comm/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <cstdio>
#include <unistd.h>

#include "base/env.h"
#include "base/log.h"
#include "base/rank_output.h"

namespace ferry::comm {

namespace {

// One check for every MPI call: the call's text, file and line, and MPI's message.
#define FERRY_MPI_CHECK(call)                                                                   \
  do {                                                                                          \
    const int ferry_mpi_rc_ = (call);                                                           \
    if (ferry_mpi_rc_ != MPI_SUCCESS) {                                                         \
      char ferry_mpi_msg_[MPI_MAX_ERROR_STRING];                                                \
      int ferry_mpi_len_ = 0;                                                                   \
      MPI_Error_string(ferry_mpi_rc_, ferry_mpi_msg_, &ferry_mpi_len_);                         \
      throw CommError(std::string(#call) + " failed at " + __FILE__ + ":" +                     \
                      std::to_string(__LINE__) + ": " + std::string(ferry_mpi_msg_, ferry_mpi_len_)); \
    }                                                                                           \
  } while (0)

MPI_Datatype mpi_type(DataType t) {
  switch (t) {
    case DataType::f32: return MPI_FLOAT;
    case DataType::f64: return MPI_DOUBLE;
    case DataType::i32: return MPI_INT32_T;
    case DataType::u8: return MPI_UINT8_T;
    case DataType::u16: return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

}  // namespace

std::unique_ptr<MpiCommunicator> MpiCommunicator::world(double timeout_s) {
  int initialized = 0;
  FERRY_MPI_CHECK(MPI_Initialized(&initialized));
  bool owns = false;
  if (!initialized) {
    int provided = 0;
    FERRY_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    if (provided < MPI_THREAD_MULTIPLE) {
      throw CommError("MPI provides thread level " + std::to_string(provided) +
                      ", ferry needs MPI_THREAD_MULTIPLE (" + std::to_string(MPI_THREAD_MULTIPLE) + ")");
    }
    owns = true;
  }
  MPI_Comm dup;
  FERRY_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  auto ranks = std::make_shared<const std::vector<RankInfo>>(gather_rank_info(dup));
  auto probe = std::make_shared<PeerProbe>(MPI_COMM_WORLD);
  auto world = std::unique_ptr<MpiCommunicator>(new MpiCommunicator(dup, timeout_s, owns, ranks, probe));
  if (const char* f = env_value("FERRY_FAULT_SKIP_COLLECTIVE")) {
    unsigned long long seq = 0;
    int rank = -1;
    if (std::sscanf(f, "%d:%llu", &rank, &seq) != 2) {
      throw CommError(std::string("FERRY_FAULT_SKIP_COLLECTIVE='") + f + "': expected RANK:SEQ");
    }
    world->fault_rank_ = rank;
    world->fault_seq_ = seq;
  }
  log::set_rank(world->rank());
  log::info(log::Subsys::comm, "MPI world: rank " + std::to_string(world->rank()) + " of " +
                                   std::to_string(world->size()) + ", local rank " + std::to_string(world->local_rank()) +
                                   " of " + std::to_string(world->local_size()) + " on this node");
  return world;
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, double timeout_s, bool owns_mpi,
                                 std::shared_ptr<const std::vector<RankInfo>> ranks, std::shared_ptr<PeerProbe> probe)
    : comm_(comm), timeout_s_(timeout_s), owns_mpi_(owns_mpi), ranks_(std::move(ranks)), probe_(std::move(probe)) {
  FERRY_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  FERRY_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  FERRY_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  MPI_Comm node;
  FERRY_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  FERRY_MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
  FERRY_MPI_CHECK(MPI_Comm_size(node, &local_size_));
  FERRY_MPI_CHECK(MPI_Comm_free(&node));
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  const std::string me = "rank " + std::to_string(world_rank) + " on " + (*ranks_)[static_cast<size_t>(world_rank)].host;
  watchdog_ = std::make_unique<Watchdog>(timeout_s_, [this, me, world_rank](const std::string& report) {
    // With log.rank_logs, the files to open next: this rank's, and every rank's beside them.
    const std::string files = rank_log_files(world_rank);
    log::error(log::Subsys::comm, "watchdog: " + me + ": " + report + "; " + report_silent_peers() +
                                      " Recent collectives on rank " + std::to_string(world_rank) + ":\n" + recent_ops() +
                                      (files.empty() ? "" : "This rank's output: " + files +
                                                                " (every rank's beside it: rankN.out, rankN.err). ") +
                                      "Aborting the job (MPI_Abort).");
    PeerProbe::clean_up_before_abort();  // every rank's swap files: MPI_Abort skips destructors
    // mpiexec tears the job down on MPI_Abort, and lines still in its stderr forwarding
    // are lost (seen in CI): give the forwarder (and the peers' clean-up) a moment first.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    MPI_Abort(MPI_COMM_WORLD, 70);
  });
  set_progress(Progress::automatic);
  worker_ = std::thread([this] { worker_loop(); });
}

MpiCommunicator::~MpiCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  watchdog_.reset();
  if (!owns_mpi_) {
    MPI_Comm_free(&comm_);
    return;
  }
  std::mutex mu;
  std::condition_variable cv;
  bool finalized = false;
  std::thread guard([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (cv.wait_for(lock, std::chrono::duration<double>(kFinalizeGuardS), [&] { return finalized; })) return;
    log::warn(log::Subsys::comm, "MPI_Finalize has not returned after " + std::to_string(int(kFinalizeGuardS)) +
                                     " s (a known hang at exit of MPI over UCX's TCP transport); this rank's work "
                                     "is done: exiting with status " + std::to_string(exit_status_.load()));
    std::fflush(nullptr);
    std::_Exit(exit_status_.load());
  });
  MPI_Barrier(comm_);  // every rank is done with its messages before endpoints close
  MPI_Comm_free(&comm_);
  probe_.reset();
  MPI_Finalize();
  {
    std::lock_guard<std::mutex> lock(mu);
    finalized = true;
  }
  cv.notify_all();
  guard.join();
}

void MpiCommunicator::abort_job(const std::string& message, int code) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  log::error(log::Subsys::comm, message + "\nending the job (MPI_Abort)");
  PeerProbe::clean_up_before_abort();  // every rank's swap files: MPI_Abort skips destructors
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // see the watchdog's abort
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

void MpiCommunicator::set_progress(Progress p) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  blocking_ = p == Progress::blocking || (p == Progress::automatic && static_cast<unsigned>(local_size_) <= cores);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split(int color, int key) {
  barrier()->wait();  // the split is collective: keep it ordered with queued collectives
  MPI_Comm sub;
  FERRY_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
  auto child = std::unique_ptr<MpiCommunicator>(new MpiCommunicator(sub, timeout_s_, false, ranks_, probe_));
  child->blocking_ = blocking_;
  return child;
}

std::string MpiCommunicator::report_silent_peers() {
  // Long enough for a busy peer's probe thread (it polls every 50 ms), short beside the
  // collective's own timeout.
  const double wait_s = std::clamp(timeout_s_ / 4, 1.0, 5.0);
  std::string out;
  for (int p : probe_->silent(wait_s)) {
    const RankInfo& info = (*ranks_)[static_cast<size_t>(p)];
    out += "rank " + std::to_string(p) + " on " + info.host + " (pid " + std::to_string(info.pid) +
           ") does not answer (its host is unreachable or its process is gone)";
    if (const std::string files = rank_log_files(p); !files.empty()) out += ", its output: " + files;
    out += "; ";
  }
  if (out.empty()) {
    out = "every other rank answers within " + std::to_string(static_cast<int>(wait_s)) +
          " s, so one of them is alive but has not reached this collective (stuck or issuing another).";
  }
  return out;
}

void MpiCommunicator::execute(const Op& op, const WorkPtr& work) {
  const uint64_t id = watchdog_->begin("rank " + std::to_string(rank_) + ": " + op.describe());
  if (rank_ == fault_rank_ && op.seq == fault_seq_) {
    log::warn(log::Subsys::comm, "FERRY_FAULT_SKIP_COLLECTIVE: not taking part in " + op.describe());
    return;  // `work` never completes; the watchdog (id) stays armed
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(op, work, id);
  }
  cv_.notify_one();
}

void MpiCommunicator::worker_loop() {
  while (true) {
    std::tuple<Op, WorkPtr, uint64_t> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ with nothing left
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    auto& [op, work, id] = item;
    try {
      work->mark_started();
      run(op);
      watchdog_->end(id);
      work->complete();
    } catch (const std::exception& e) {
      watchdog_->end(id);
      work->fail(e.what());
    }
  }
}

void MpiCommunicator::run(const Op& op) {
  if (op.count > static_cast<size_t>(INT_MAX)) {
    throw CommError(op.describe() + ": more than INT_MAX elements in one collective; lower the bucket size");
  }
  const int n = static_cast<int>(op.count);
  const MPI_Datatype t = mpi_type(op.type);
  if (blocking_) {
    switch (op.kind) {
      case OpKind::all_gather: {
        const auto* slot = static_cast<const char*>(op.recv) + op.bytes() * static_cast<size_t>(rank_);
        FERRY_MPI_CHECK(MPI_Allgather(op.send == slot ? MPI_IN_PLACE : op.send, n, t, op.recv, n, t, comm_));
        break;
      }
      case OpKind::reduce_scatter:
        FERRY_MPI_CHECK(MPI_Reduce_scatter_block(op.send, op.recv, n, t, MPI_SUM, comm_));
        break;
      case OpKind::all_reduce:
        FERRY_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, op.recv, n, t, MPI_SUM, comm_));
        break;
      case OpKind::broadcast:
        FERRY_MPI_CHECK(MPI_Bcast(op.recv, n, t, op.root, comm_));
        break;
      case OpKind::barrier:
        FERRY_MPI_CHECK(MPI_Barrier(comm_));
        break;
    }
    if (op.reduce == ReduceOp::avg && (op.kind == OpKind::reduce_scatter || op.kind == OpKind::all_reduce)) {
      scale_by(op.recv, op.count, op.type, 1.0 / size_);
    }
    return;
  }
  MPI_Request req = MPI_REQUEST_NULL;
  switch (op.kind) {
    case OpKind::all_gather: {
      const auto* slot = static_cast<const char*>(op.recv) + op.bytes() * static_cast<size_t>(rank_);
      const void* send = op.send == slot ? MPI_IN_PLACE : op.send;
      FERRY_MPI_CHECK(MPI_Iallgather(send, n, t, op.recv, n, t, comm_, &req));
      break;
    }
    case OpKind::reduce_scatter:
      FERRY_MPI_CHECK(MPI_Ireduce_scatter_block(op.send, op.recv, n, t, MPI_SUM, comm_, &req));
      break;
    case OpKind::all_reduce:
      FERRY_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, op.recv, n, t, MPI_SUM, comm_, &req));
      break;
    case OpKind::broadcast:
      FERRY_MPI_CHECK(MPI_Ibcast(op.recv, n, t, op.root, comm_, &req));
      break;
    case OpKind::barrier:
      FERRY_MPI_CHECK(MPI_Ibarrier(comm_, &req));
      break;
  }
  // Poll instead of blocking: a blocking MPICH collective spins on a core for as long as
  // it waits, which on a machine with few cores takes the core from this rank's compute
  // threads or from another rank. Spin briefly (latency), then yield, then nap.
  int done = 0;
  for (int polls = 0; !done; ++polls) {
    FERRY_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) break;
    if (polls < 64) continue;
    if (polls < 1024) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  if (op.reduce == ReduceOp::avg && (op.kind == OpKind::reduce_scatter || op.kind == OpKind::all_reduce)) {
    scale_by(op.recv, op.count, op.type, 1.0 / size_);
  }
}

}  // namespace ferry::comm
