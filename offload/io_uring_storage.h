// io_uring storage (liburing): requests of aio.block_size, up to aio.queue_depth in
// flight per call, on O_DIRECT files striped over the nvme_paths; buffers registered with
// register_buffers() are used as fixed buffers (no per-request page pinning).
// aio.single_submit submits requests one at a time; aio.overlap_events refills the queue
// as each completion arrives (else batch by batch). Two rings, one for reads and one for
// writes, each guarded by its mutex: a read never waits behind a write in progress (the
// overlapped step reads parameter shards ahead on one thread while another writes updated
// ones), while calls of the same direction from several threads are serialised.
// Contracts: see storage.h.
#pragma once

#include <liburing.h>

#include <memory>
#include <mutex>

#include "offload/storage.h"
#include "offload/striped_files.h"

namespace ferry::offload {

class IoUringStorage final : public Storage {
 public:
  // Throws StorageError(errno) when the ring cannot be set up (make_storage falls back).
  IoUringStorage(std::unique_ptr<StripedFiles> files, bool direct, const AioConfig& aio, FaultHook fault);
  ~IoUringStorage() override;
  std::string describe() const override;
  uint64_t capacity() const override { return files_->capacity(); }
  size_t alignment() const override { return direct_ ? 4096 : 1; }
  void sync() override { files_->sync(); }
  void register_buffers(const std::vector<std::pair<void*, size_t>>& buffers) override;
  bool has_fixed_buffers() const { return !fixed_.empty(); }

 protected:
  void transfer(bool is_write, uint64_t offset, char* buf, size_t len) override;

 private:
  int fixed_index(const char* p, size_t len) const;

  std::unique_ptr<StripedFiles> files_;
  bool direct_;
  AioConfig aio_;
  FaultHook fault_;
  struct Lane {
    io_uring ring{};
    std::mutex mu;
  };
  Lane lanes_[2];  // [0] reads, [1] writes
  std::vector<std::pair<char*, size_t>> fixed_;
};

}  // namespace ferry::offload
