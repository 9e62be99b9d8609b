#include "comm/peers.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>

#include "base/scratch_files.h"

namespace ferry::comm {

namespace {
constexpr int kPing = 7101, kPong = 7102, kAbort = 7103;
std::atomic<PeerProbe*> g_world_probe{nullptr};  // the first probe made: the world's
constexpr size_t kHostChars = 256;  // HOST_NAME_MAX is 64 on Linux; room for others
}  // namespace

std::vector<RankInfo> gather_rank_info(MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  char mine[kHostChars] = {};
  if (gethostname(mine, sizeof mine - 1) != 0) std::strncpy(mine, "?", sizeof mine - 1);
  std::vector<char> names(kHostChars * static_cast<size_t>(size));
  MPI_Allgather(mine, kHostChars, MPI_CHAR, names.data(), kHostChars, MPI_CHAR, comm);
  const long pid = static_cast<long>(::getpid());
  std::vector<long> pids(static_cast<size_t>(size));
  MPI_Allgather(&pid, 1, MPI_LONG, pids.data(), 1, MPI_LONG, comm);
  std::vector<RankInfo> out(static_cast<size_t>(size));
  for (size_t r = 0; r < out.size(); ++r) {
    const char* n = names.data() + r * kHostChars;
    out[r].host.assign(n, strnlen(n, kHostChars - 1));
    out[r].pid = pids[r];
  }
  return out;
}

std::string describe_nodes(const std::vector<RankInfo>& ranks) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> by_host;
  for (size_t r = 0; r < ranks.size(); ++r) {
    auto& list = by_host[ranks[r].host];
    if (list.empty()) order.push_back(ranks[r].host);
    list.push_back(static_cast<int>(r));
  }
  std::string s = std::to_string(order.size()) + " node(s):";
  for (size_t i = 0; i < order.size(); ++i) {
    const std::vector<int>& list = by_host[order[i]];
    const bool run = list.back() - list.front() + 1 == static_cast<int>(list.size());
    s += (i ? ", " : " ") + order[i] + (list.size() == 1 ? " (rank " : " (ranks ");
    if (list.size() == 1) {
      s += std::to_string(list[0]);
    } else if (run) {
      s += std::to_string(list.front()) + "-" + std::to_string(list.back());
    } else {
      for (size_t k = 0; k < list.size(); ++k) s += (k ? ", " : "") + std::to_string(list[k]);
    }
    s += ")";
  }
  return s;
}

PeerProbe::PeerProbe(MPI_Comm world) {
  MPI_Comm_dup(world, &comm_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  PeerProbe* none = nullptr;
  g_world_probe.compare_exchange_strong(none, this);
  if (size_ > 1) responder_ = std::thread([this] { respond_loop(); });
}

PeerProbe::~PeerProbe() {
  PeerProbe* self = this;
  g_world_probe.compare_exchange_strong(self, nullptr);
  stop_ = true;
  if (responder_.joinable()) responder_.join();
  MPI_Comm_free(&comm_);
}

void PeerProbe::respond_loop() {
  int ping = 0;
  static const int pong = 1;  // outlives a reply freed unfinished
  static int abort_notice = 0;  // outlives a receive cancelled unfinished
  MPI_Request recv = MPI_REQUEST_NULL, abort_recv = MPI_REQUEST_NULL;
  std::vector<MPI_Request> replies;
  MPI_Irecv(&ping, 1, MPI_INT, MPI_ANY_SOURCE, kPing, comm_, &recv);
  MPI_Irecv(&abort_notice, 1, MPI_INT, MPI_ANY_SOURCE, kAbort, comm_, &abort_recv);
  while (!stop_) {
    int done = 0;
    MPI_Status st;
    // A peer is about to MPI_Abort the job, which kills this process without unwinding.
    if (abort_recv != MPI_REQUEST_NULL && MPI_Test(&abort_recv, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
      end_scratch_files();
      done = 0;
    }
    if (MPI_Test(&recv, &done, &st) != MPI_SUCCESS) break;
    if (done) {
      replies.push_back(MPI_REQUEST_NULL);
      MPI_Isend(&pong, 1, MPI_INT, st.MPI_SOURCE, kPong, comm_, &replies.back());
      MPI_Irecv(&ping, 1, MPI_INT, MPI_ANY_SOURCE, kPing, comm_, &recv);
      continue;
    }
    for (MPI_Request& r : replies) {
      int sent = 0;
      if (r != MPI_REQUEST_NULL) MPI_Test(&r, &sent, MPI_STATUS_IGNORE);
    }
    std::erase(replies, MPI_REQUEST_NULL);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (MPI_Request* r : {&recv, &abort_recv}) {
    if (*r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(r);
    MPI_Wait(r, MPI_STATUS_IGNORE);  // a cancelled receive completes locally
  }
  for (MPI_Request& r : replies)
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);  // a reply to a peer gone away
}

void PeerProbe::clean_up_before_abort() {
  if (PeerProbe* probe = g_world_probe.load()) probe->send_abort_notices();
  end_scratch_files();
}

void PeerProbe::send_abort_notices() {
  static const int notice = 1;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    // Not awaited: a peer may be gone, and MPI_Abort follows whatever happens.
    MPI_Request r = MPI_REQUEST_NULL;
    if (MPI_Isend(&notice, 1, MPI_INT, p, kAbort, comm_, &r) == MPI_SUCCESS && r != MPI_REQUEST_NULL) {
      MPI_Request_free(&r);
    }
  }
}

std::vector<int> PeerProbe::silent(double wait_s) {
  const size_t n = static_cast<size_t>(size_);
  static const int ping = 1;
  // Receives left pending are cancelled and freed, not awaited (the peer may never
  // answer): their buffers stay with the probe.
  pong_bufs_.emplace_back(n, 0);
  std::vector<int>& pongs = pong_bufs_.back();
  std::vector<MPI_Request> recvs(n, MPI_REQUEST_NULL), sends(n, MPI_REQUEST_NULL);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    MPI_Irecv(&pongs[static_cast<size_t>(p)], 1, MPI_INT, p, kPong, comm_, &recvs[static_cast<size_t>(p)]);
    MPI_Isend(&ping, 1, MPI_INT, p, kPing, comm_, &sends[static_cast<size_t>(p)]);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  std::vector<bool> answered(n, false);
  answered[static_cast<size_t>(rank_)] = true;
  while (std::chrono::steady_clock::now() < deadline) {
    bool all = true;
    for (size_t p = 0; p < n; ++p) {
      if (answered[p]) continue;
      int done = 0;
      if (MPI_Test(&recvs[p], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) answered[p] = true;
      all = all && answered[p];
    }
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<int> out;
  for (size_t p = 0; p < n; ++p) {
    if (!answered[p]) out.push_back(static_cast<int>(p));
    // A ping or its wait left pending is freed, not awaited: its peer may never answer.
    if (recvs[p] != MPI_REQUEST_NULL && !answered[p]) {
      MPI_Cancel(&recvs[p]);
      MPI_Request_free(&recvs[p]);
    }
    if (sends[p] != MPI_REQUEST_NULL) MPI_Request_free(&sends[p]);
  }
  return out;
}

}  // namespace ferry::comm
