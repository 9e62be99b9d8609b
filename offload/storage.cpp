#include "offload/storage.h"

#include <cerrno>

#include "base/log.h"
#include "offload/io_uring_storage.h"
#include "offload/posix_storage.h"

namespace ferry::offload {

namespace {

void check_request(const Storage& s, const char* op, uint64_t offset, const void* buf, size_t len) {
  const size_t a = s.alignment();
  if (offset + len > s.capacity()) {
    throw StorageError(s.describe(), offset, len, EINVAL,
                       std::string(op) + " past the end (capacity " + std::to_string(s.capacity()) + ") of");
  }
  if (offset % a || len % a || reinterpret_cast<uintptr_t>(buf) % a) {
    throw StorageError(s.describe(), offset, len, EINVAL,
                       std::string(op) + " not aligned to " + std::to_string(a) + " bytes (offset, length, buffer) on");
  }
}

}  // namespace

void Storage::write(uint64_t offset, const void* buf, size_t len) {
  check_request(*this, "write", offset, buf, len);
  transfer(true, offset, static_cast<char*>(const_cast<void*>(buf)), len);
}

void Storage::read(uint64_t offset, void* buf, size_t len) {
  check_request(*this, "read", offset, buf, len);
  transfer(false, offset, static_cast<char*>(buf), len);
}

CountingStorage::CountingStorage(std::string name, uint64_t capacity)
    : name_(std::move(name)), capacity_((capacity + 4095) / 4096 * 4096) {}

std::unique_ptr<Storage> make_storage(const StorageOptions& o, std::string* warning) {
  if (o.aio.count_only) {
    if (warning) warning->clear();
    return std::make_unique<CountingStorage>(o.name, o.capacity);
  }
  std::string why;
  bool direct = o.allow_direct;
  const uint64_t stripe = std::max<uint64_t>(4096, (o.aio.block_size + 4095) / 4096 * 4096);
  auto files = std::make_unique<StripedFiles>(o.paths, o.name, o.capacity, stripe, direct, &why);
  if (o.allow_io_uring) {
    try {
      auto s = std::make_unique<IoUringStorage>(std::move(files), direct, o.aio, o.fault);
      if (warning) *warning = why;
      log::info(log::Subsys::offload, "storage " + o.name + ": io_uring, " + (direct ? "O_DIRECT" : "buffered") + ", " +
                                          std::to_string(o.capacity) + " bytes over " + std::to_string(o.paths.size()) +
                                          " folder(s)" + (o.paths.empty() ? "" : ", first " + o.paths.front()));
      return s;
    } catch (const StorageError& e) {
      why += std::string(why.empty() ? "" : "; ") + "io_uring unavailable (" + e.what() + "): pread/pwrite";
      bool d2 = direct;
      files = std::make_unique<StripedFiles>(o.paths, o.name, o.capacity, stripe, d2, nullptr);
    }
  }
  if (warning) *warning = why;
  log::info(log::Subsys::offload, "storage " + o.name + ": pread/pwrite, " + (direct ? "O_DIRECT" : "buffered") + ", " +
                                      std::to_string(o.capacity) + " bytes");
  return std::make_unique<PosixStorage>(std::move(files), direct, o.aio, o.fault);
}

}  // namespace ferry::offload
