// DeviceMemory: the half of a Device (nn/device.h) that holds and moves bytes: allocation
// against a byte budget, copies between host and device and within the device, the
// offload path's asynchronous transfers, ordering (synchronize, the errors queued ops
// recorded) and the device's clock. The other half, the math, is nn/device_ops.h.
//
// Contracts, for every implementation:
// - Memory: allocate() never exceeds capacity(); past it, it throws OutOfDeviceMemory
//   naming the bytes asked for, the bytes in use and the cap. Nothing is allocated lazily.
// - Ordering: ops issued from one host thread execute in issue order. synchronize()
//   returns when all of them have finished (a no-op on the CPU device, whose ops are
//   synchronous). Tensors passed to an op must stay alive until the op has finished.
// - Threads: one host thread issues ops to a device at a time; memory accounting
//   (allocate/deallocate/memory) is thread safe.
// Every method with a body here is a synchronous default that a device with queues
// replaces (a counting or host device keeps it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "base/trace.h"
#include "nn/tensor.h"

namespace ferry::nn {

struct MemoryStats {
  size_t in_use = 0;    // bytes currently allocated
  size_t peak = 0;      // high-water mark since construction or reset_peak()
  size_t capacity = 0;  // the budget
};

class OutOfDeviceMemory : public std::runtime_error {
 public:
  OutOfDeviceMemory(const std::string& device, size_t requested, size_t in_use, size_t capacity);
  size_t requested, in_use, capacity;
};

std::string format_bytes(size_t bytes);  // "1.50 GiB (1610612736 bytes)"

// An asynchronous copy between a device and host memory (DeviceMemory::upload/download).
// done() polls without blocking; wait() blocks. Either may be called from any one thread
// at a time. A transfer that failed throws from done()/wait() naming the copy.
class Transfer {
 public:
  virtual ~Transfer() = default;
  // Finished: the host may read the memory the copy wrote and reuse what it read.
  virtual bool done() = 0;
  virtual void wait() = 0;
  // When the copy ran, on the device's clock (DeviceMemory::clock; null marks on devices without one).
  struct Span {
    DeviceClock::Mark begin, end;
  };
  virtual Span span() const { return {}; }
};
using TransferPtr = std::shared_ptr<Transfer>;

// A transfer that completed before it was handed out (devices that copy synchronously).
class CompletedTransfer final : public Transfer {
 public:
  bool done() override { return true; }
  void wait() override {}
};

// Bytes copied between host memory and a device since it was made, by direction: every
// copy of every kind (the PCIe traffic on a GPU). Host-accessible devices move nothing.
struct TransferBytes {
  uint64_t to_device = 0, to_host = 0;
};

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  // ---- memory --------------------------------------------------------------------------
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) noexcept = 0;
  virtual MemoryStats memory() const = 0;
  virtual void reset_peak() = 0;

  // ---- copies ---------------------------------------------------------------------------
  virtual void copy_from_host(const Tensor& dst, const void* src) = 0;  // dst.nbytes() bytes
  // The same, for a `dst` allocated since the last op that could use its memory (a tensor
  // just made to receive these bytes): a device with queues may then start the copy
  // without waiting for the queued ops that do not touch it (the CUDA device overlaps it
  // with them). Returns, like copy_from_host, once `src` may be reused.
  virtual void copy_into_new(const Tensor& dst, const void* src) { copy_from_host(dst, src); }
  virtual void copy_to_host(void* dst, const Tensor& src) = 0;  // src.nbytes() bytes
  // The tiered offload path's copies (ZeRO-Infinity's shards over PCIe), which return at
  // once on a device with copy queues and never make the host wait:
  // upload: dst (allocated as for copy_into_new) <- src; every op issued after this call
  // sees dst's data. `src` must stay unchanged until the transfer is done; it overlaps
  // only from page-locked memory (pageable memory is staged by the call).
  virtual TransferPtr upload(const Tensor& dst, const void* src) {
    copy_from_host(dst, src);
    return std::make_shared<CompletedTransfer>();
  }
  // download: dst (host memory, src.nbytes() bytes) <- src, after every op issued before
  // this call, or, when `after` is given (a device marker: a collective's
  // comm::Work::device_marker), after that marker only. The host must neither read nor
  // write dst, and src must stay allocated, until the transfer is done.
  virtual TransferPtr download(void* dst, const Tensor& src, const std::shared_ptr<void>& after = nullptr) {
    (void)after;
    copy_to_host(dst, src);
    return std::make_shared<CompletedTransfer>();
  }
  virtual TransferBytes transfer_bytes() const { return {}; }
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;  // same dtype and numel

  // ---- ordering and time ------------------------------------------------------------------
  virtual void synchronize() = 0;
  // Throws the first error a queued op recorded on the device (a token outside the
  // vocabulary, a target outside the logits) that has not been thrown yet. Devices that
  // check at once have nothing pending. Host reads and synchronize() check too.
  virtual void check_errors() {}
  // The device's clock for traces (base/trace.h), and a mark recorded now in its compute
  // queue. Host devices have none: their work is done when a call returns, so host-clock
  // spans are device time. A GPU's spans must be timed with these (review F6).
  virtual DeviceClock* clock() { return nullptr; }
  virtual DeviceClock::Mark mark() { return nullptr; }
};

}  // namespace ferry::nn
