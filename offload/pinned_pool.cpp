#include "offload/pinned_pool.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <utility>

namespace ferry::offload {

bool may_exceed_memlock() {
  if (geteuid() == 0) return true;
  // CAP_IPC_LOCK in the effective set lifts the limit. Read it from /proc to avoid libcap.
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return false;
  char line[256];
  unsigned long long caps = 0;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "CapEff: %llx", &caps) == 1) break;
  }
  std::fclose(f);
  return (caps >> 14) & 1ull;  // CAP_IPC_LOCK = 14
}

std::string memlock_problem(size_t bytes, size_t limit, bool privileged) {
  if (privileged || bytes <= limit) return "";
  return "pinning the " + std::to_string(bytes) + "-byte host pool needs RLIMIT_MEMLOCK >= that, but it is " +
         std::to_string(limit) +
         " bytes. Raise it: `ulimit -l unlimited` in the launching shell, `* - memlock unlimited` in "
         "/etc/security/limits.conf, `--ulimit memlock=-1` for docker, or `#SBATCH --propagate=MEMLOCK` under "
         "Slurm; or set zero_optimization.offload_optimizer.pin_memory: false to run unpinned (slower transfers)";
}

PinnedPool::PinnedPool(const PinnedPoolOptions& options, HostRegistration registration)
    : options_(options), registration_(std::move(registration)) {
  if (options_.buffer_count < 1 || options_.buffer_size == 0) {
    throw std::invalid_argument("PinnedPool: buffer_count and buffer_size must be positive");
  }
  options_.buffer_size = (options_.buffer_size + 4095) / 4096 * 4096;
  bytes_ = options_.buffer_size * static_cast<size_t>(options_.buffer_count);
  if (options_.count_only) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    slab_ = static_cast<char*>(p);
    for (int i = options_.buffer_count - 1; i >= 0; --i) free_.push_back(slab_ + static_cast<size_t>(i) * options_.buffer_size);
    return;
  }
  if (options_.pin) {
    struct rlimit rl{};
    getrlimit(RLIMIT_MEMLOCK, &rl);
    const size_t limit = rl.rlim_cur == RLIM_INFINITY ? SIZE_MAX : static_cast<size_t>(rl.rlim_cur);
    const std::string problem = memlock_problem(bytes_, limit, may_exceed_memlock());
    if (!problem.empty() && !options_.allow_unpinned) throw PinnedMemoryError(problem);
    warning_ = problem;
  }
  // On 2 MiB boundaries and asked for transparent huge pages (before the first touch): O_DIRECT
  // pins the buffer's pages for every request, and with huge pages there are 512x fewer of
  // them. Measured on the development machine (ext4 on virtio, 1 GiB read at 1 MiB blocks,
  // depth 8, mlocked both): 3.9-4.1 GB/s against 3.3-3.4 with 4 KiB pages, and 2.2-2.3
  // unlocked. Where THP is off ("never") the advice is ignored and the pages stay 4 KiB.
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t allocated = (bytes_ + kHugePage - 1) / kHugePage * kHugePage;
  slab_ = static_cast<char*>(std::aligned_alloc(kHugePage, allocated));
  if (!slab_) throw std::bad_alloc();
  (void)madvise(slab_, allocated, MADV_HUGEPAGE);  // advice only: EINVAL without THP support
  std::memset(slab_, 0, bytes_);  // touch every page now: the cost is paid before the run
  if (options_.pin && warning_.empty()) {
    if (mlock(slab_, bytes_) == 0) {
      pinned_ = true;
    } else {
      const std::string why = "mlock of " + std::to_string(bytes_) + " bytes failed: " + std::strerror(errno);
      if (!options_.allow_unpinned) {
        std::free(slab_);
        throw PinnedMemoryError(why + "; raise RLIMIT_MEMLOCK or set pin_memory: false");
      }
      warning_ = why + "; continuing unpinned";
    }
  }
  if (options_.pin && registration_.add) {
    const std::string why = registration_.add(slab_, bytes_);
    cuda_registered_ = why.empty();
    if (!cuda_registered_) warning_ += (warning_.empty() ? "" : "; ") + why;
  }
  for (int i = options_.buffer_count - 1; i >= 0; --i) free_.push_back(slab_ + static_cast<size_t>(i) * options_.buffer_size);
}

PinnedPool::~PinnedPool() {
  if (cuda_registered_ && registration_.remove) registration_.remove(slab_);
  if (pinned_) munlock(slab_, bytes_);
  if (options_.count_only) {
    munmap(slab_, bytes_);
    return;
  }
  std::free(slab_);
}

void* PinnedPool::acquire() {
  std::unique_lock<std::mutex> lock(mu_);
  ++waiting_;
  cv_.wait(lock, [&] { return !free_.empty(); });
  --waiting_;
  char* p = free_.back();
  free_.pop_back();
  return p;
}

std::vector<std::pair<void*, size_t>> PinnedPool::regions() const {
  std::vector<std::pair<void*, size_t>> out;
  const size_t b = options_.buffer_size;
  const size_t per = b <= kMaxFixedBuffer ? kMaxFixedBuffer / b * b : kMaxFixedBuffer;
  for (size_t at = 0; at < bytes_; at += per) out.emplace_back(slab_ + at, std::min(per, bytes_ - at));
  return out;
}

int PinnedPool::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_;
}

void PinnedPool::release(void* buffer) {
  char* p = static_cast<char*>(buffer);
  if (p < slab_ || p >= slab_ + bytes_ || (p - slab_) % static_cast<std::ptrdiff_t>(options_.buffer_size) != 0) {
    throw std::invalid_argument("PinnedPool::release of a pointer that is not one of its buffers");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(p);
  }
  cv_.notify_one();
}

int PinnedPool::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return options_.buffer_count - static_cast<int>(free_.size());
}

}  // namespace ferry::offload
