#include "base/io_faults.h"

#include "base/env.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace ferry {

namespace {

std::atomic<IoFaultPlan*> g_plan{nullptr};

IoFault decide(IoOp op, const std::string& path, uint64_t offset, size_t len) {
  IoFaultPlan* plan = g_plan.load(std::memory_order_acquire);
  if (!plan) return {};
  return plan->decide(IoEvent{op, path, offset, len});
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t event_hash(uint64_t seed, const IoEvent& e) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (unsigned char c : e.path) h = (h ^ c) * 0x100000001b3ull;
  return mix(h ^ mix(e.offset) ^ (static_cast<uint64_t>(e.op) << 56));
}

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// The part a short or torn transfer moves: half, aligned down; 0 when nothing smaller
// than the whole keeps the alignment.
size_t half_of(size_t len, size_t align) {
  const size_t a = align == 0 ? 1 : align;
  return len / 2 / a * a;
}

int fail_with(int err) {
  errno = err;
  return -1;
}

// A transfer under `f`: eio/enospc move nothing, short/torn move the first half.
template <typename Call>
ssize_t transfer(const IoFault& f, size_t len, size_t align, Call call) {
  switch (f.kind) {
    case IoFaultKind::none:
      return call(len);
    case IoFaultKind::eio:
      return fail_with(EIO);
    case IoFaultKind::enospc:
      return fail_with(ENOSPC);
    case IoFaultKind::delay:
      sleep_ms(f.delay_ms);
      return call(len);
    case IoFaultKind::short_io:
    case IoFaultKind::torn: {
      const size_t part = half_of(len, align);
      if (part == 0) return f.kind == IoFaultKind::torn ? fail_with(EIO) : call(len);
      const ssize_t n = call(part);
      if (n < 0 || f.kind == IoFaultKind::short_io) return n;
      return fail_with(EIO);
    }
  }
  return call(len);
}

int metadata_call(const IoFault& f, const std::function<int()>& call) {
  switch (f.kind) {
    case IoFaultKind::none:
    case IoFaultKind::short_io:  // nothing to shorten
      return call();
    case IoFaultKind::delay:
      sleep_ms(f.delay_ms);
      return call();
    case IoFaultKind::enospc:
      return fail_with(ENOSPC);
    case IoFaultKind::eio:
    case IoFaultKind::torn:
      return fail_with(EIO);
  }
  return call();
}

IoFaultKind kind_named(const std::string& s, const std::string& value) {
  if (s == "eio") return IoFaultKind::eio;
  if (s == "enospc") return IoFaultKind::enospc;
  if (s == "short") return IoFaultKind::short_io;
  if (s == "torn") return IoFaultKind::torn;
  if (s == "delay") return IoFaultKind::delay;
  throw std::invalid_argument("FERRY_IO_FAULTS='" + value + "': unknown fault '" + s + "' (eio, enospc, short, torn, delay)");
}

}  // namespace

const char* io_op_name(IoOp op) {
  switch (op) {
    case IoOp::write: return "write";
    case IoOp::read: return "read";
    case IoOp::sync: return "sync";
    case IoOp::rename: return "rename";
  }
  return "?";
}

const char* io_fault_name(IoFaultKind kind) {
  switch (kind) {
    case IoFaultKind::none: return "none";
    case IoFaultKind::eio: return "eio";
    case IoFaultKind::enospc: return "enospc";
    case IoFaultKind::short_io: return "short";
    case IoFaultKind::torn: return "torn";
    case IoFaultKind::delay: return "delay";
  }
  return "?";
}

IoFault RecordingIoPlan::decide(const IoEvent& e) {
  if (e.path.starts_with(prefix_)) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(e);
  }
  return {};
}

std::vector<IoEvent> RecordingIoPlan::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

IoFault TargetedIoPlan::decide(const IoEvent& e) {
  if (e.op != target_.op || e.offset != target_.offset || e.path != target_.path) return {};
  return seen_.fetch_add(1) + 1 == nth_ ? fault_ : IoFault{};
}

SeededIoPlan::SeededIoPlan(uint64_t seed, double p, std::vector<IoFaultKind> kinds, std::string prefix, int delay_ms)
    : seed_(seed), p_(p), kinds_(std::move(kinds)), prefix_(std::move(prefix)), delay_ms_(delay_ms) {
  if (kinds_.empty()) kinds_ = {IoFaultKind::eio};
}

IoFault SeededIoPlan::decide(const IoEvent& e) {
  if (!e.path.starts_with(prefix_)) return {};
  const uint64_t h = event_hash(seed_, e);
  if (static_cast<double>(h >> 11) * 0x1.0p-53 >= p_) return {};
  faults_.fetch_add(1);
  return {kinds_[mix(h) % kinds_.size()], delay_ms_};
}

ScopedIoFaults::ScopedIoFaults(std::shared_ptr<IoFaultPlan> plan)
    : plan_(std::move(plan)), previous_(g_plan.exchange(plan_.get(), std::memory_order_acq_rel)) {}

ScopedIoFaults::~ScopedIoFaults() { g_plan.store(previous_, std::memory_order_release); }

std::string install_io_faults_from_env() {
  const char* v = env_value("FERRY_IO_FAULTS");
  if (!v || !*v) return "";
  const std::string text = v;
  std::vector<std::string> parts;
  std::stringstream ss(text);
  for (std::string p; std::getline(ss, p, ':');) parts.push_back(p);
  auto bad = [&](const std::string& why) {
    return std::invalid_argument("FERRY_IO_FAULTS='" + text + "': " + why +
                                 " (expected seed:probability[:kinds[:path-prefix]], e.g. 7:0.01:eio,torn:/nvme)");
  };
  if (parts.size() < 2 || parts.size() > 4) throw bad("wrong number of fields");
  uint64_t seed = 0;
  double p = 0;
  try {
    size_t used = 0;
    seed = std::stoull(parts[0], &used);
    if (used != parts[0].size()) throw bad("the seed is not a number");
    p = std::stod(parts[1], &used);
    if (used != parts[1].size() || !(p >= 0 && p <= 1)) throw bad("the probability is not in [0, 1]");
  } catch (const std::invalid_argument&) {
    throw bad("the seed or the probability is not a number");
  } catch (const std::out_of_range&) {
    throw bad("the seed or the probability is out of range");
  }
  std::vector<IoFaultKind> kinds;
  if (parts.size() > 2) {
    std::stringstream ks(parts[2]);
    for (std::string k; std::getline(ks, k, ',');) kinds.push_back(kind_named(k, text));
  }
  const std::string prefix = parts.size() > 3 ? parts[3] : "";
  // The plan lives as long as the process: a binary that asks for faults keeps them.
  static std::shared_ptr<IoFaultPlan> plan;
  plan = std::make_shared<SeededIoPlan>(seed, p, kinds, prefix);
  g_plan.store(plan.get(), std::memory_order_release);
  return "FERRY_IO_FAULTS=" + text + ": injecting I/O faults";
}

ssize_t io_pwrite(int fd, const void* buf, size_t len, uint64_t offset, const std::string& path, size_t align) {
  const IoFault f = decide(IoOp::write, path, offset, len);
  return transfer(f, len, align, [&](size_t n) { return ::pwrite(fd, buf, n, static_cast<off_t>(offset)); });
}

ssize_t io_pread(int fd, void* buf, size_t len, uint64_t offset, const std::string& path, size_t align) {
  const IoFault f = decide(IoOp::read, path, offset, len);
  return transfer(f, len, align, [&](size_t n) { return ::pread(fd, buf, n, static_cast<off_t>(offset)); });
}

int io_fdatasync(int fd, const std::string& path) {
  return metadata_call(decide(IoOp::sync, path, 0, 0), [&] { return ::fdatasync(fd); });
}

int io_fsync(int fd, const std::string& path) {
  return metadata_call(decide(IoOp::sync, path, 0, 0), [&] { return ::fsync(fd); });
}

int io_rename(const std::string& from, const std::string& to) {
  return metadata_call(decide(IoOp::rename, to, 0, 0), [&] { return std::rename(from.c_str(), to.c_str()); });
}

int io_exchange(const std::string& a, const std::string& b) {
  return metadata_call(decide(IoOp::rename, b, 0, 0),
                       [&] { return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE); });
}

void io_fault_completion(bool write, const std::string& path, uint64_t offset, size_t len, size_t align,
                         int64_t& result) {
  const IoFault f = decide(write ? IoOp::write : IoOp::read, path, offset, len);
  switch (f.kind) {
    case IoFaultKind::none:
      return;
    case IoFaultKind::eio:
    case IoFaultKind::torn:
      result = -EIO;
      return;
    case IoFaultKind::enospc:
      result = -ENOSPC;
      return;
    case IoFaultKind::delay:
      sleep_ms(f.delay_ms);
      return;
    case IoFaultKind::short_io:
      if (result > 0) {
        const size_t part = half_of(static_cast<size_t>(result), align);
        if (part > 0) result = static_cast<int64_t>(part);
      }
      return;
  }
}

}  // namespace ferry
