#include "offload/posix_storage.h"

#include <unistd.h>

#include <cerrno>
#include <thread>

#include "base/io_faults.h"

namespace ferry::offload {

PosixStorage::PosixStorage(std::unique_ptr<StripedFiles> files, bool direct, const AioConfig& aio, FaultHook fault)
    : files_(std::move(files)), direct_(direct), aio_(aio), fault_(std::move(fault)) {}

std::string PosixStorage::describe() const { return files_->describe("pread/pwrite", direct_); }

void PosixStorage::transfer(bool is_write, uint64_t offset, char* buf, size_t len) {
  struct Piece {
    size_t file;
    uint64_t foff;
    char* ptr;
    size_t len;
  };
  std::vector<Piece> pieces;
  files_->for_each_segment(offset, len, [&](size_t f, uint64_t foff, size_t boff, size_t n) {
    for (size_t k = 0; k < n; k += aio_.block_size) pieces.push_back({f, foff + k, buf + boff + k, std::min(aio_.block_size, n - k)});
  });
  auto run = [&](size_t first, size_t step) {
    for (size_t i = first; i < pieces.size(); i += step) {
      const Piece& p = pieces[i];
      size_t done = 0;
      int retries = 0;
      while (done < p.len) {
        const size_t align = direct_ ? 4096 : 1;
        const ssize_t r = is_write ? io_pwrite(files_->fd(p.file), p.ptr + done, p.len - done, p.foff + done, files_->path(p.file), align)
                                   : io_pread(files_->fd(p.file), p.ptr + done, p.len - done, p.foff + done, files_->path(p.file), align);
        int64_t result = r < 0 ? -errno : r;
        if (fault_) fault_(is_write, files_->path(p.file), p.foff + done, p.len - done, result);
        if ((result == -EINTR || result == -EAGAIN) && ++retries < 1000) continue;
        if (result < 0) {
          throw StorageError(files_->path(p.file), p.foff + done, p.len - done, static_cast<int>(-result),
                             is_write ? "write" : "read");
        }
        if (result == 0) {
          throw StorageError(files_->path(p.file), p.foff + done, p.len - done, EIO,
                             is_write ? "write made no progress on" : "read hit the end of");
        }
        done += static_cast<size_t>(result);  // a short transfer continues where it stopped
      }
    }
  };
  const size_t threads = std::min<size_t>(static_cast<size_t>(std::max(1, aio_.intra_op_parallelism)), pieces.size());
  if (threads <= 1) return run(0, 1);
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(threads);
  for (size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        run(t, threads);
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace ferry::offload
