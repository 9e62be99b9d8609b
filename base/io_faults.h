// Deterministic I/O fault injection: one seam that every file operation on outside storage
// passes through (offload::Storage's io_uring and pread paths, checkpoint streams and
// files, exports, the directory renames and syncs that make them durable). RocksDB's
// FaultInjectionFileSystem is the model: tests choose which operation fails and how, and
// the same choice gives the same run.
//
// With no plan installed (production) each call costs one relaxed atomic load and then
// makes the system call as is. A plan is installed process-wide by ScopedIoFaults, for
// tests, or from the environment by install_io_faults_from_env() (FERRY_IO_FAULTS, for
// trying a real binary: see docs/guide/troubleshooting.md).
//
// Faults and what the wrapped call does:
//   eio, enospc  nothing reaches the file; returns -1 with errno EIO / ENOSPC
//   short_io     transfers the first half (aligned down to `align`); callers resubmit
//   torn         transfers the first half, then returns -1 with errno EIO (data on disk,
//                error reported: what a dying disk or a full one mid-request gives)
//   delay        sleeps delay_ms, then transfers all of it
// sync and rename: eio, enospc and delay as above; torn acts as eio, short_io as none.
//
// Identity: an event is (op, path, offset), never its position in time, so a plan picks
// the same events however threads interleave. Threads: every function may be called from
// any thread; plans must be thread-safe. Install or remove plans only while no I/O runs.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ferry {

enum class IoOp { write, read, sync, rename };
enum class IoFaultKind { none, eio, enospc, short_io, torn, delay };

const char* io_op_name(IoOp op);
const char* io_fault_name(IoFaultKind kind);

struct IoEvent {
  IoOp op;
  std::string path;
  uint64_t offset = 0;
  size_t len = 0;
};

struct IoFault {
  IoFaultKind kind = IoFaultKind::none;
  int delay_ms = 0;
};

class IoFaultPlan {
 public:
  virtual ~IoFaultPlan() = default;
  virtual IoFault decide(const IoEvent& e) = 0;  // called from any thread
};

// Records every event whose path starts with `prefix`; faults nothing.
class RecordingIoPlan final : public IoFaultPlan {
 public:
  explicit RecordingIoPlan(std::string prefix) : prefix_(std::move(prefix)) {}
  IoFault decide(const IoEvent& e) override;
  std::vector<IoEvent> events() const;  // in the order they were seen

 private:
  std::string prefix_;
  mutable std::mutex mu_;
  std::vector<IoEvent> events_;
};

// Faults the `nth` event (1: the first) equal to `target` in (op, path, offset), once.
// Events equal in all three (a folder synced twice) come from one thread in program order.
class TargetedIoPlan final : public IoFaultPlan {
 public:
  TargetedIoPlan(IoEvent target, IoFault fault, int nth = 1) : target_(std::move(target)), fault_(fault), nth_(nth) {}
  IoFault decide(const IoEvent& e) override;
  bool fired() const { return seen_.load() >= nth_; }

 private:
  IoEvent target_;
  IoFault fault_;
  int nth_;
  std::atomic<int> seen_{0};
};

// Faults each event under `prefix` with probability `p`, the kind drawn from `kinds`; both
// from a hash of (seed, op, path, offset), so a seed names one set of faults.
class SeededIoPlan final : public IoFaultPlan {
 public:
  SeededIoPlan(uint64_t seed, double p, std::vector<IoFaultKind> kinds, std::string prefix, int delay_ms = 20);
  IoFault decide(const IoEvent& e) override;
  uint64_t faults() const { return faults_.load(); }  // how many it injected so far

 private:
  uint64_t seed_;
  double p_;
  std::vector<IoFaultKind> kinds_;
  std::string prefix_;
  int delay_ms_;
  std::atomic<uint64_t> faults_{0};
};

// Installs `plan` process-wide for the scope's lifetime (the previous one is restored).
class ScopedIoFaults {
 public:
  explicit ScopedIoFaults(std::shared_ptr<IoFaultPlan> plan);
  ~ScopedIoFaults();
  ScopedIoFaults(const ScopedIoFaults&) = delete;
  ScopedIoFaults& operator=(const ScopedIoFaults&) = delete;

 private:
  std::shared_ptr<IoFaultPlan> plan_;
  IoFaultPlan* previous_;
};

// FERRY_IO_FAULTS="seed:probability[:kinds[:path-prefix]]", kinds a comma list of
// eio,enospc,short,torn,delay (default eio). Returns a description for the log, "" when the
// variable is unset. Throws std::invalid_argument naming the variable on a malformed value.
std::string install_io_faults_from_env();

// The wrapped calls: as the system call (-1 and errno on failure), after the plan's say.
// `align`: short and torn transfers keep O_DIRECT's alignment (1 for buffered I/O).
ssize_t io_pwrite(int fd, const void* buf, size_t len, uint64_t offset, const std::string& path, size_t align = 1);
ssize_t io_pread(int fd, void* buf, size_t len, uint64_t offset, const std::string& path, size_t align = 1);
int io_fdatasync(int fd, const std::string& path);
int io_fsync(int fd, const std::string& path);
int io_rename(const std::string& from, const std::string& to);  // the event's path is `to`
int io_exchange(const std::string& a, const std::string& b);    // renameat2 RENAME_EXCHANGE; event path `b`

// For asynchronous engines (io_uring): the plan's say on a completed request, applied to
// its result (bytes or -errno), as the synchronous wrappers would have ended.
void io_fault_completion(bool write, const std::string& path, uint64_t offset, size_t len, size_t align,
                         int64_t& result);

}  // namespace ferry
