// pread/pwrite storage: the fallback where io_uring is unavailable (a seccomp filter, an
// old kernel). Uses O_DIRECT when the files accept it. intra_op_parallelism threads split
// a large request. Contracts: see storage.h.
#pragma once

#include <memory>

#include "offload/storage.h"
#include "offload/striped_files.h"

namespace ferry::offload {

class PosixStorage final : public Storage {
 public:
  PosixStorage(std::unique_ptr<StripedFiles> files, bool direct, const AioConfig& aio, FaultHook fault);
  std::string describe() const override;
  uint64_t capacity() const override { return files_->capacity(); }
  size_t alignment() const override { return direct_ ? 4096 : 1; }
  void write(uint64_t offset, const void* buf, size_t len) override;
  void read(uint64_t offset, void* buf, size_t len) override;
  void sync() override { files_->sync(); }

 private:
  void transfer(bool is_write, uint64_t offset, char* buf, size_t len);
  std::unique_ptr<StripedFiles> files_;
  bool direct_;
  AioConfig aio_;
  FaultHook fault_;
};

// Checks what every Storage requires of a request: in range and aligned.
void check_request(const Storage& s, const char* op, uint64_t offset, const void* buf, size_t len);

}  // namespace ferry::offload
