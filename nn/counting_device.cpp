#include "nn/counting_device.h"

#include <sys/mman.h>

#include <new>

#include "nn/cpu_device.h"
#include "nn/nf4_matmul.h"
#include "nn/op_checks.h"

namespace ferry::nn {

namespace {

constexpr const char* kDev = "counting";

size_t mapped_bytes(size_t bytes) { return (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096; }

}  // namespace

CountingDevice::CountingDevice(std::string label, size_t capacity_bytes, bool host_accessible, DeviceKind kind)
    : ShapeOnlyOps(kDev), label_(std::move(label)), host_accessible_(host_accessible), kind_(kind) {
  stats_.capacity = capacity_bytes;
}

std::string CountingDevice::name() const { return "counting " + label_ + " (cap " + format_bytes(stats_.capacity) + ")"; }

void* CountingDevice::allocate(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes > stats_.capacity - stats_.in_use) throw OutOfDeviceMemory(name(), bytes, stats_.in_use, stats_.capacity);
    stats_.in_use += bytes;
    stats_.peak = std::max(stats_.peak, stats_.in_use);
    ++allocations_;
  }
  // Address space only: MAP_NORESERVE commits nothing, and no page exists until written.
  void* p = mmap(nullptr, mapped_bytes(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.in_use -= bytes;
    throw std::bad_alloc();
  }
  return p;
}

void CountingDevice::deallocate(void* ptr, size_t bytes) noexcept {
  munmap(ptr, mapped_bytes(bytes));
  std::lock_guard<std::mutex> lock(mu_);
  stats_.in_use -= bytes;
}

MemoryStats CountingDevice::memory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CountingDevice::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak = stats_.in_use;
}

size_t CountingDevice::allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocations_;
}

bool CountingDevice::nf4_gemm(const Tensor& c, int64_t, const Tensor& a, int64_t,
                              const std::vector<Nf4Weight>& pieces, bool, double) {
  if (kind_ == DeviceKind::cuda) {
    return nf4_fused_ && is_low_precision(a.dtype()) && c.dtype() != DType::f64 && c.dtype() != DType::i32 &&
           pieces.size() <= kNf4FusedMaxPieces;
  }
  return CpuDevice::nf4_gemm_direct(c.dtype(), a.dtype());
}

void CountingDevice::copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() != src.dtype()) checks::fail(kDev, "copy", dst.describe() + " <- " + src.describe());
  if (dst.numel() != src.numel()) checks::fail(kDev, "copy", dst.describe() + " vs " + src.describe());
}

}  // namespace ferry::nn
