#include "base/rank_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace ferry {

namespace {

std::mutex g_mu;
std::string g_dir;  // set once; read under g_mu

// One copied stream: the pipe's read end, the file and the old descriptor it copies to.
struct Tee {
  int target = -1;  // 1 or 2
  int saved = -1;   // the old destination (a dup of it)
  int file = -1;
  int read_end = -1;
  std::thread copier;
};
std::vector<std::unique_ptr<Tee>>& tees() {
  static std::vector<std::unique_ptr<Tee>> t;
  return t;
}

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // the destination is gone: keep copying to the other one
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void copy_loop(Tee* t) {
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(t->read_end, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // every write end closed: the process is ending
    write_all(t->file, buf, static_cast<size_t>(n));
    write_all(t->saved, buf, static_cast<size_t>(n));
  }
}

// At exit: flush what the process buffered, give the old descriptors back (closing the
// pipes' write ends), let the copiers drain.
void stop_tees() {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  for (auto& t : tees()) {
    ::dup2(t->saved, t->target);
    if (t->copier.joinable()) t->copier.join();
    ::close(t->read_end);
    ::close(t->file);
  }
  tees().clear();
}

int open_log(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("log.rank_logs: cannot open " + path.string() + ": " + std::strerror(errno));
  return fd;
}

}  // namespace

void redirect_rank_output(const std::string& dir, int rank, int world_size) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("log.rank_logs: cannot create the folder " + dir + ": " + ec.message());
  const std::string stem = (fs::path(dir) / ("rank" + std::to_string(rank))).string();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  char when[32] = {};
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::string header = "==== ferry rank " + std::to_string(rank) + " of " + std::to_string(world_size) + ", pid ";
  header.append(std::to_string(::getpid())).append(" on ").append(host).append(", started ").append(when);
  header.append(" ====\n");
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  for (int target : {1, 2}) {
    const int file = open_log(stem + (target == 1 ? ".out" : ".err"));
    write_all(file, header.data(), header.size());
    const bool copy = target == 2 || rank == 0;
    if (!copy) {
      ::dup2(file, target);
      ::close(file);
      continue;
    }
    auto t = std::make_unique<Tee>();
    t->target = target;
    t->file = file;
    t->saved = ::fcntl(target, F_DUPFD_CLOEXEC, 3);
    int fds[2];
    if (t->saved < 0 || ::pipe2(fds, O_CLOEXEC) != 0) {
      throw std::runtime_error(std::string("log.rank_logs: cannot make a pipe: ") + std::strerror(errno));
    }
    t->read_end = fds[0];
    ::dup2(fds[1], target);  // the descriptor keeps no close-on-exec flag: children write here too
    ::close(fds[1]);
    t->copier = std::thread(copy_loop, t.get());
    tees().push_back(std::move(t));
  }
  static bool registered = false;
  if (!registered && !tees().empty()) {
    std::atexit(stop_tees);
    registered = true;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  g_dir = dir;
}

std::string rank_log_files(int rank) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_dir.empty()) return "";
  const std::string stem = (std::filesystem::path(g_dir) / ("rank" + std::to_string(rank))).string();
  return stem + ".out, " + stem + ".err";
}

}  // namespace ferry
