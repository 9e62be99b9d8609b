// PinnedPool: the host memory that shards pass through on their way between tiers, all
// allocated up front (buffer_count x buffer_size, 4 KiB aligned, one slab on 2 MiB
// boundaries advised MADV_HUGEPAGE: fewer pages for O_DIRECT to pin per request), so the
// host memory a run uses is known before it starts, and page-locked (mlock) so that DMA
// (GPU copies, O_DIRECT) never waits on paging.
//
// Pinning needs RLIMIT_MEMLOCK >= the pool (or CAP_IPC_LOCK). When it is too low the pool
// says so, with the limit and how to raise it, and either fails (PinnedMemoryError) or,
// when allow_unpinned, continues with ordinary pages and keeps the message in warning().
// Registration with io_uring is the Storage's (register_buffers(regions())). With CUDA:
// the pool itself knows nothing of it; a run on a GPU (device.type cuda) passes a
// HostRegistration (nn::cuda_register_host: cudaHostRegister through the
// runtime ferry links, with the rank's GPU current), so device copies from the slab are
// DMA without staging. A CPU run passes none and never touches CUDA (no context on GPU 0
// of a GPU node, nothing loaded).
// Threads: acquire()/release() are thread safe; acquire() blocks while every buffer is
// in use, which bounds the transfers in flight.
#pragma once

#include <cstring>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ferry::offload {

class PinnedMemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct PinnedPoolOptions {
  size_t buffer_size = 16 << 20;
  int buffer_count = 4;
  bool pin = true;             // DeepSpeed's pin_memory
  bool allow_unpinned = false; // continue unpinned when the limit is too low
  // ferry plan: the slab is address space only (MAP_NORESERVE, never touched, pinned or
  // registered with CUDA); bytes() and the buffers are as a real pool's.
  bool count_only = false;
};

// Registration of the slab for a GPU's DMA (used only when the pool pins): `add` returns
// "" or why it failed (kept in warning(); the pool stays usable); `remove` undoes it in
// the destructor. Left empty, the pool registers nothing.
struct HostRegistration {
  std::function<std::string(void*, size_t)> add;
  std::function<void(void*)> remove;
};

// The problem with pinning `bytes` under soft limit `limit` ("" if none); `privileged`:
// the process may exceed the limit (CAP_IPC_LOCK, root).
std::string memlock_problem(size_t bytes, size_t limit, bool privileged);
// Root or CAP_IPC_LOCK: RLIMIT_MEMLOCK does not bind this process.
bool may_exceed_memlock();

class PinnedPool {
 public:
  explicit PinnedPool(const PinnedPoolOptions& options, HostRegistration registration = {});
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  bool pinned() const { return pinned_; }
  bool cuda_registered() const { return cuda_registered_; }
  const std::string& warning() const { return warning_; }
  size_t buffer_size() const { return options_.buffer_size; }
  int buffer_count() const { return options_.buffer_count; }
  size_t bytes() const { return bytes_; }
  // memcpy to or from one of this pool's buffers. A count_only pool (ferry plan's dry run:
  // its storage reads and writes nothing) moves no bytes, so a plan of a model of any size
  // neither faults in nor copies its terabytes. Thread safe (touches no pool state).
  void copy(void* dst, const void* src, size_t bytes) const {
    if (!options_.count_only) std::memcpy(dst, src, bytes);
  }
  // The slab as io_uring fixed buffers: pieces of whole buffers, each at most
  // kMaxFixedBuffer (io_uring refuses a larger one with EFAULT), so that every buffer lies
  // inside one piece (a buffer larger than that is cut, and its transfers fall back to
  // unregistered I/O). One piece for a slab of at most 1 GiB.
  static constexpr size_t kMaxFixedBuffer = size_t{1} << 30;
  std::vector<std::pair<void*, size_t>> regions() const;
  void* slab() const { return slab_; }

  // A buffer of buffer_size() bytes, 4 KiB aligned; blocks until one is free.
  void* acquire();
  void release(void* buffer);
  int in_use() const;
  int waiting() const;  // threads blocked in acquire() now (tests observe the bound with it)

 private:
  PinnedPoolOptions options_;
  HostRegistration registration_;
  size_t bytes_ = 0;
  char* slab_ = nullptr;
  bool pinned_ = false;
  bool cuda_registered_ = false;
  std::string warning_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char*> free_;
  int waiting_ = 0;  // under mu_
};

// A pool buffer held for a scope: given back to the pool when the lease ends, on every
// path, exceptions included. Either acquired (blocks as acquire() does) or adopting a
// buffer the caller already holds (a Swapper's wait() result). Movable, not copyable;
// a moved-from lease holds nothing. Thread safety: as the pool's release().
class PooledBuffer {
 public:
  explicit PooledBuffer(PinnedPool& pool) : pool_(&pool), buf_(static_cast<float*>(pool.acquire())) {}
  PooledBuffer(PinnedPool& pool, void* adopted) : pool_(&pool), buf_(static_cast<float*>(adopted)) {}
  ~PooledBuffer() { reset(); }
  PooledBuffer(PooledBuffer&& o) noexcept : pool_(o.pool_), buf_(std::exchange(o.buf_, nullptr)) {}
  PooledBuffer& operator=(PooledBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      pool_ = o.pool_;
      buf_ = std::exchange(o.buf_, nullptr);
    }
    return *this;
  }
  PooledBuffer(const PooledBuffer&) = delete;
  PooledBuffer& operator=(const PooledBuffer&) = delete;
  float* get() const { return buf_; }
  int64_t elements() const { return static_cast<int64_t>(pool_->buffer_size() / 4); }
  void reset() noexcept {
    if (buf_) pool_->release(std::exchange(buf_, nullptr));
  }

 private:
  PinnedPool* pool_;
  float* buf_;
};

}  // namespace ferry::offload
