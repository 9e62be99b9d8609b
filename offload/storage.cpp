#include "offload/storage.h"

#include "offload/io_uring_storage.h"
#include "offload/posix_storage.h"

namespace ferry::offload {

std::unique_ptr<Storage> make_storage(const StorageOptions& o, std::string* warning) {
  std::string why;
  bool direct = o.allow_direct;
  const uint64_t stripe = std::max<uint64_t>(4096, (o.aio.block_size + 4095) / 4096 * 4096);
  auto files = std::make_unique<StripedFiles>(o.paths, o.name, o.capacity, stripe, direct, &why);
  if (o.allow_io_uring) {
    try {
      auto s = std::make_unique<IoUringStorage>(std::move(files), direct, o.aio, o.fault);
      if (warning) *warning = why;
      return s;
    } catch (const StorageError& e) {
      why += std::string(why.empty() ? "" : "; ") + "io_uring unavailable (" + e.what() + "): pread/pwrite";
      bool d2 = direct;
      files = std::make_unique<StripedFiles>(o.paths, o.name, o.capacity, stripe, d2, nullptr);
    }
  }
  if (warning) *warning = why;
  return std::make_unique<PosixStorage>(std::move(files), direct, o.aio, o.fault);
}

}  // namespace ferry::offload
