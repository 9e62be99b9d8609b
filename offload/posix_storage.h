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
  void sync() override { files_->sync(); }

 protected:
  void transfer(bool is_write, uint64_t offset, char* buf, size_t len) override;

 private:
  std::unique_ptr<StripedFiles> files_;
  bool direct_;
  AioConfig aio_;
  FaultHook fault_;
};

}  // namespace ferry::offload
