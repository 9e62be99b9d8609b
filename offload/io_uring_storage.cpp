#include "offload/io_uring_storage.h"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <deque>

#include "base/io_faults.h"

namespace ferry::offload {

IoUringStorage::IoUringStorage(std::unique_ptr<StripedFiles> files, bool direct, const AioConfig& aio,
                               FaultHook fault)
    : files_(std::move(files)), direct_(direct), aio_(aio), fault_(std::move(fault)) {
  const unsigned entries = static_cast<unsigned>(std::max(1, aio_.queue_depth));
  for (int k = 0; k < 2; ++k) {
    const int rc = io_uring_queue_init(entries, &lanes_[k].ring, 0);
    if (rc < 0) {
      if (k == 1) io_uring_queue_exit(&lanes_[0].ring);
      throw StorageError(files_->path(0), 0, 0, -rc, "io_uring_queue_init refused for");
    }
  }
}

IoUringStorage::~IoUringStorage() {
  for (Lane& lane : lanes_) io_uring_queue_exit(&lane.ring);
}

std::string IoUringStorage::describe() const { return files_->describe("io_uring", direct_); }

void IoUringStorage::register_buffers(const std::vector<std::pair<void*, size_t>>& buffers) {
  std::scoped_lock lock(lanes_[0].mu, lanes_[1].mu);
  if (!fixed_.empty()) {
    for (Lane& lane : lanes_) io_uring_unregister_buffers(&lane.ring);
    fixed_.clear();
  }
  if (buffers.empty()) return;  // only unregistered
  std::vector<iovec> iov;
  for (const auto& [p, n] : buffers) iov.push_back({p, n});
  for (int k = 0; k < 2; ++k) {
    const int rc = io_uring_register_buffers(&lanes_[k].ring, iov.data(), static_cast<unsigned>(iov.size()));
    if (rc < 0) {
      if (k == 1) io_uring_unregister_buffers(&lanes_[0].ring);
      throw StorageError(files_->path(0), 0, 0, -rc,
                         "io_uring_register_buffers (pinned pool as fixed buffers; RLIMIT_MEMLOCK?) for");
    }
  }
  for (const auto& [p, n] : buffers) fixed_.emplace_back(static_cast<char*>(p), n);
}

int IoUringStorage::fixed_index(const char* p, size_t len) const {
  for (size_t i = 0; i < fixed_.size(); ++i) {
    if (p >= fixed_[i].first && p + len <= fixed_[i].first + fixed_[i].second) return static_cast<int>(i);
  }
  return -1;
}

void IoUringStorage::transfer(bool is_write, uint64_t offset, char* buf, size_t len) {
  struct Request {
    size_t file;
    uint64_t foff;
    char* ptr;
    size_t len;
    size_t done = 0;
    int retries = 0;
  };
  std::vector<Request> reqs;
  files_->for_each_segment(offset, len, [&](size_t f, uint64_t foff, size_t boff, size_t n) {
    for (size_t k = 0; k < n; k += aio_.block_size) reqs.push_back({f, foff + k, buf + boff + k, std::min(aio_.block_size, n - k)});
  });
  Lane& lane = lanes_[is_write ? 1 : 0];
  io_uring* const ring = &lane.ring;
  std::lock_guard<std::mutex> lock(lane.mu);
  std::deque<size_t> ready;
  for (size_t i = 0; i < reqs.size(); ++i) ready.push_back(i);
  const size_t depth = static_cast<size_t>(std::max(1, aio_.queue_depth));
  size_t inflight = 0;
  std::string error_path;
  int error = 0;
  uint64_t error_off = 0;
  size_t error_len = 0;
  auto prep = [&](size_t i) {
    Request& r = reqs[i];
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    char* p = r.ptr + r.done;
    const unsigned n = static_cast<unsigned>(r.len - r.done);
    const uint64_t off = r.foff + r.done;
    const int idx = fixed_index(p, n);
    const int fd = files_->fd(r.file);
    if (is_write) {
      idx >= 0 ? io_uring_prep_write_fixed(sqe, fd, p, n, off, idx) : io_uring_prep_write(sqe, fd, p, n, off);
    } else {
      idx >= 0 ? io_uring_prep_read_fixed(sqe, fd, p, n, off, idx) : io_uring_prep_read(sqe, fd, p, n, off);
    }
    io_uring_sqe_set_data64(sqe, i);
    ++inflight;
    if (aio_.single_submit) io_uring_submit(ring);
  };
  while (!ready.empty() || inflight > 0) {
    // Fill the queue (after an error, only drain what is in flight).
    if (error == 0 && (aio_.overlap_events || inflight == 0)) {
      while (!ready.empty() && inflight < depth) {
        prep(ready.front());
        ready.pop_front();
      }
      if (!aio_.single_submit) io_uring_submit(ring);
    }
    if (inflight == 0) break;
    io_uring_cqe* cqe = nullptr;
    int rc = io_uring_wait_cqe(ring, &cqe);
    if (rc == -EINTR) continue;
    if (rc < 0) throw StorageError(files_->path(0), offset, len, -rc, "io_uring_wait_cqe");
    const size_t i = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
    int64_t result = cqe->res;
    io_uring_cqe_seen(ring, cqe);
    --inflight;
    Request& r = reqs[i];
    io_fault_completion(is_write, files_->path(r.file), r.foff + r.done, r.len - r.done, direct_ ? 4096 : 1, result);
    if (fault_) fault_(is_write, files_->path(r.file), r.foff + r.done, r.len - r.done, result);
    if ((result == -EINTR || result == -EAGAIN) && ++r.retries < 1000) {
      ready.push_front(i);  // retried as is
    } else if (result <= 0) {
      if (error == 0) {
        error = result < 0 ? static_cast<int>(-result) : EIO;
        error_path = files_->path(r.file);
        error_off = r.foff + r.done;
        error_len = r.len - r.done;
      }
      ready.clear();
    } else {
      r.done += static_cast<size_t>(result);
      if (r.done < r.len) ready.push_front(i);  // short: the rest goes again
    }
  }
  if (error) throw StorageError(error_path, error_off, error_len, error, is_write ? "write" : "read");
}

}  // namespace ferry::offload
