#include "base/scratch_files.h"

#include <unistd.h>

#include <atomic>
#include <cstring>

namespace ferry {

namespace {

// A slot is free, being written, holding a path, or being removed. A slot changes hands
// only by compare-and-swap, so a path is read only once it is whole.
enum : int { kFree = 0, kWriting = 1, kHeld = 2, kRemoving = 3 };

struct Slot {
  std::atomic<int> state{kFree};
  char path[kMaxScratchPath];
};

Slot g_slots[kMaxScratchFiles];  // static storage: untouched pages cost nothing
std::atomic<bool> g_ending{false};

}  // namespace

bool register_scratch_file(const std::string& path) {
  if (path.empty() || path.size() >= kMaxScratchPath) return false;
  for (Slot& s : g_slots) {
    int expected = kFree;
    if (!s.state.compare_exchange_strong(expected, kWriting)) continue;
    std::memcpy(s.path, path.c_str(), path.size() + 1);
    s.state.store(kHeld);
    // Sequentially consistent with end_scratch_files(): either its sweep sees this slot
    // held, or this load sees it ending (both unlinking is harmless).
    if (g_ending.load()) {
      remove_scratch_files();
      return false;
    }
    return true;
  }
  return false;
}

void unregister_scratch_file(const std::string& path) {
  for (Slot& s : g_slots) {
    if (s.state.load(std::memory_order_acquire) != kHeld || path != s.path) continue;
    int expected = kHeld;
    if (!s.state.compare_exchange_strong(expected, kWriting)) continue;  // an abort took it meanwhile
    if (path == s.path) {
      s.state.store(kFree, std::memory_order_release);
      return;
    }
    s.state.store(kHeld, std::memory_order_release);  // reused for another path meanwhile
  }
}

bool is_scratch_file(const std::string& path) {
  for (const Slot& s : g_slots)
    if (s.state.load(std::memory_order_acquire) == kHeld && path == s.path) return true;
  return false;
}

int remove_scratch_files() noexcept {
  int removed = 0;
  for (Slot& s : g_slots) {
    int expected = kHeld;
    if (!s.state.compare_exchange_strong(expected, kRemoving)) continue;
    if (::unlink(s.path) == 0) ++removed;
    s.state.store(kFree, std::memory_order_release);
  }
  return removed;
}

void end_scratch_files() noexcept {
  g_ending.store(true);
  remove_scratch_files();
}

}  // namespace ferry
