// Storage: a byte-addressed store for shards that live off the device (NVMe files).
//
// Implementations: IoUringStorage (liburing, O_DIRECT, registered buffers, queue depth,
// striping over several paths) and PosixStorage (pread/pwrite), the fallback where
// io_uring or O_DIRECT is refused. make_storage() picks one and says why once.
//
// Contracts:
// - Alignment: offsets, lengths and buffer addresses must be multiples of alignment()
//   (4096 with O_DIRECT); StorageError otherwise.
// - Errors: short transfers are resubmitted, EINTR and EAGAIN retried; anything else
//   throws StorageError naming the path, the offset, the length and errno. A failed write
//   leaves every byte outside its own range untouched.
// - Space: files are preallocated (fallocate) to capacity() at construction, so running
//   out of disk shows up then, not in the middle of a run.
// - Threads: read()/write() may be called from several threads at once; each call is
//   synchronous for its caller.
// - Faults: every system request (and the syncs) passes through base/io_faults.h, the
//   process-wide seam that tests and FERRY_IO_FAULTS use to inject EIO, ENOSPC, short and
//   torn transfers and delays; FaultHook below is a per-store hook on completed requests.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace ferry::offload {

class StorageError : public std::runtime_error {
 public:
  StorageError(const std::string& path, uint64_t offset, size_t length, int err, const std::string& what);
  std::string path;
  uint64_t offset;
  size_t length;
  int err;  // errno
};

// DeepSpeed's `aio` section.
struct AioConfig {
  size_t block_size = 1 << 20;  // bytes per request
  int queue_depth = 8;          // requests in flight per call
  int intra_op_parallelism = 1; // threads splitting one large request (posix path)
  bool single_submit = false;   // submit requests one by one instead of in batches
  bool overlap_events = true;   // refill the queue as completions arrive instead of per batch
  // ferry plan: make_storage returns a CountingStorage (no files, no I/O; requests are
  // still checked). Never set by a configuration.
  bool count_only = false;
};

// Test hooks: called with each completed system request (write or read, path, offset,
// requested length, result: bytes or -errno); may change the result to inject a fault
// (-EIO, -ENOSPC, -EINTR, -EAGAIN, or a short count). Tests only; empty in production.
using FaultHook =
    std::function<void(bool write, const std::string& path, uint64_t offset, size_t len, int64_t& result)>;

class Storage {
 public:
  virtual ~Storage() = default;
  virtual std::string describe() const = 0;
  virtual uint64_t capacity() const = 0;
  virtual size_t alignment() const = 0;
  // Check the request (range, alignment), then transfer it.
  void write(uint64_t offset, const void* buf, size_t len);
  void read(uint64_t offset, void* buf, size_t len);
  virtual void sync() = 0;  // written data reaches the device (fdatasync)
  // Buffers used for I/O that the implementation may register (io_uring fixed buffers),
  // replacing those registered before (none: only unregisters). Optional: the default does
  // nothing.
  virtual void register_buffers(const std::vector<std::pair<void*, size_t>>&) {}

 protected:
  // A checked request: in range and aligned.
  virtual void transfer(bool is_write, uint64_t offset, char* buf, size_t len) = 0;
};

struct StorageOptions {
  std::vector<std::string> paths;  // folders; one file per folder, striped by block_size
  std::string name = "ferry";      // file name stem: NAME.swp in each folder
  uint64_t capacity = 0;           // bytes in all (rounded up to alignment x paths)
  AioConfig aio;
  bool allow_io_uring = true;      // false: the pread/pwrite path
  bool allow_direct = true;        // false: buffered I/O
  FaultHook fault;                 // tests only
};

// A Storage without files: `capacity` bytes (rounded up to 4096) that accepts every
// checked request and transfers nothing (reads leave the buffer as it was). What `ferry
// plan` runs the engine's nvme tier on: the bytes it is asked to hold are capacity().
class CountingStorage final : public Storage {
 public:
  CountingStorage(std::string name, uint64_t capacity);
  std::string describe() const override { return "counting storage " + name_; }
  uint64_t capacity() const override { return capacity_; }
  size_t alignment() const override { return 4096; }
  void sync() override {}
  uint64_t transferred() const { return transferred_; }  // bytes written and read so far

 protected:
  void transfer(bool, uint64_t, char*, size_t len) override { transferred_ += len; }

 private:
  std::string name_;
  uint64_t capacity_;
  uint64_t transferred_ = 0;
};

// Creates the files and the best storage the system allows: io_uring with O_DIRECT, else
// pread/pwrite (O_DIRECT if possible); with aio.count_only, a CountingStorage instead. `warning` receives why a fallback was taken ("" if
// none). Throws StorageError naming the path when a folder is missing, not writable or too
// small for its share of `capacity`.
std::unique_ptr<Storage> make_storage(const StorageOptions& options, std::string* warning);

}  // namespace ferry::offload
