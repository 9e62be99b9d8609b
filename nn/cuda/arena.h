// The cuda device's memory bookkeeping (nn/cuda_device.h, "Memory"): fences, the events
// they record (pooled), and the first-fit arena over the device's one slab that prefers
// blocks no queued work still uses. Internal to the cuda device (nn/cuda/device_*.cpp);
// needs the CUDA runtime's headers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "nn/cuda_abi.h"
#include "nn/cuda_check.h"

namespace ferry::nn::cuda_dev {
FERRY_CUDA_ABI_BEGIN

// Events for fences, reused: a GPT step frees about a thousand tensors per micro-batch,
// and creating and destroying an event per free is microseconds of driver time each.
// Re-recording an event is safe while streams still wait on an earlier record
// (cudaStreamWaitEvent takes the event's state at the call). Thread safe.
class EventPool {
 public:
  EventPool() = default;
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  // An event ready to record; null when one cannot be created.
  cudaEvent_t get() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();  // not left for the next launch check to misreport
      return nullptr;
    }
    return e;
  }
  void put(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(e);
  }
 private:
  mutable std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

// A point on the compute stream after which a freed block is no longer used: the event
// recorded when it was freed (later ops that reuse the block are issued after it).
struct Fence {
  cudaEvent_t event = nullptr;
  uint64_t seq = 0;   // later frees have larger numbers (and later records: one lock)
  bool done = false;  // a query found it complete (it stays so); under the device's mutex
  EventPool* pool = nullptr;
  Fence() = default;
  Fence(const Fence&) = delete;
  Fence& operator=(const Fence&) = delete;
  ~Fence() {
    if (event) pool->put(event);
  }
};
using FencePtr = std::shared_ptr<Fence>;

// Whether nothing queued can still use a block with this fence. Asks the driver at most
// once per fence that has completed.
inline bool idle(const FencePtr& f) {
  if (!f || f->done) return true;
  const cudaError_t q = cudaEventQuery(f->event);
  if (q == cudaSuccess) return f->done = true;
  if (q != cudaErrorNotReady) cudaGetLastError();  // unknown: treated as busy
  return false;
}

// First fit over one slab, preferring idle blocks; blocks are coalesced with free
// neighbours, a coalesced block keeping the later of its parts' fences. Not thread safe
// (the device's mutex guards it).
class Arena {
 public:
  Arena(char* base, size_t size) : base_(base) { free_[0] = {size, nullptr}; }
  // The first free block that fits and is idle (its fence has fired, or it was never
  // used), else the first that fits: a block freed a moment ago (first fit often hands
  // back the most recent) would make copy_into_new wait for nearly all queued work,
  // while compute ops, ordered on the stream, do not care. Fences known to have fired
  // cost nothing; the driver is asked (in address order, about at most kQueries blocks
  // before the first known idle one) only where more than one block fits.
  void* take(size_t bytes) {
    constexpr size_t kQueries = 8;
    std::vector<std::map<size_t, Block>::iterator> busy;  // fitting, before a known idle one
    auto known_idle = free_.end();
    bool more = false;  // a fitting block beyond those collected
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second.len < bytes) continue;
      const FencePtr& f = it->second.fence;
      if (!f || f->done) {
        known_idle = it;
        break;
      }
      if (busy.size() == kQueries) {
        more = true;
        break;
      }
      busy.push_back(it);
    }
    auto pick = known_idle;
    if (!busy.empty() && (busy.size() > 1 || known_idle != free_.end() || more)) {
      for (auto it : busy) {
        if (idle(it->second.fence)) {
          pick = it;
          break;
        }
      }
    }
    if (pick == free_.end() && !busy.empty()) pick = busy.front();
    if (pick == free_.end()) return nullptr;
    const size_t at = pick->first, left = pick->second.len - bytes;
    const FencePtr fence = pick->second.fence;
    free_.erase(pick);
    if (left > 0) free_[at + bytes] = {left, fence};
    used_[at] = {bytes, fence};
    return base_ + at;
  }
  void give(void* p, FencePtr fence) {
    const size_t at = static_cast<size_t>(static_cast<char*>(p) - base_);
    auto u = used_.find(at);
    if (u == used_.end()) return;
    size_t start = at, len = u->second.len;
    used_.erase(u);
    auto later = [](const FencePtr& a, const FencePtr& b) { return !a ? b : !b ? a : a->seq > b->seq ? a : b; };
    auto next = free_.lower_bound(at);
    if (next != free_.end() && next->first == at + len) {
      len += next->second.len;
      fence = later(fence, next->second.fence);
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second.len == start) {
        start = prev->first;
        len += prev->second.len;
        fence = later(fence, prev->second.fence);
        free_.erase(prev);
      }
    }
    free_[start] = {len, fence};
  }
  // The fence of the allocated block holding `p` (null: never used since the slab was made).
  FencePtr fence_of(const void* p) const {
    const size_t at = static_cast<size_t>(static_cast<const char*>(p) - base_);
    auto it = used_.upper_bound(at);
    if (it == used_.begin()) return nullptr;
    --it;
    return at < it->first + it->second.len ? it->second.fence : nullptr;
  }
  size_t largest_free() const {
    size_t m = 0;
    for (const auto& [at, b] : free_) m = std::max(m, b.len);
    return m;
  }

 private:
  struct Block {
    size_t len = 0;
    FencePtr fence;
  };
  char* base_;
  std::map<size_t, Block> free_;  // offset -> block
  std::map<size_t, Block> used_;
};

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda_dev
