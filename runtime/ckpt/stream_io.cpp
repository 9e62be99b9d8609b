#include "runtime/ckpt/stream_io.h"

#include "base/crc32c.h"
#include "base/io_faults.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace ferry::runtime {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what, int err) {
  throw std::runtime_error(path + ": " + what + ": " + std::strerror(err));
}

// O_DIRECT first; file systems that refuse it (EINVAL: tmpfs) get buffered I/O.
int open_stream(const std::string& path, int flags, bool* direct) {
  int fd = ::open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, 0644);
  *direct = fd >= 0;
  if (fd < 0 && errno == EINVAL) fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, (flags & O_CREAT) ? "cannot create" : "cannot open for reading", errno);
  return fd;
}

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

StreamBuffers::StreamBuffers(size_t chunk, int count) : chunk_(round_up(chunk, kDirectAlign)) {
  for (int i = 0; i < count; ++i) {
    void* p = std::aligned_alloc(kDirectAlign, chunk_);
    if (!p) throw std::bad_alloc();
    ptrs_.push_back(static_cast<char*>(p));
  }
}

StreamBuffers::~StreamBuffers() {
  for (char* p : ptrs_) std::free(p);
}

StreamWriter::StreamWriter(const std::string& path, size_t chunk, int buffers, int threads)
    : path_(path), bufs_(chunk, buffers), busy_(static_cast<size_t>(buffers), false) {
  fd_ = open_stream(path, O_WRONLY | O_CREAT | O_TRUNC, &direct_);
  for (int t = 0; t < threads; ++t) io_.emplace_back([this] { io_loop(); });
}

StreamWriter::~StreamWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : io_) t.join();
  if (fd_ >= 0) ::close(fd_);
}

void StreamWriter::io_loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = jobs_.front();
      jobs_.pop_front();
      ++running_;
    }
    try {
      const char* p = bufs_.at(job.buffer);
      for (size_t done = 0; done < job.bytes;) {
        const ssize_t n = io_pwrite(fd_, p + done, job.bytes - done, job.offset + done, path_, direct_ ? kDirectAlign : 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail(path_, "write of " + std::to_string(job.bytes) + " bytes at offset " + std::to_string(job.offset), n < 0 ? errno : EIO);
        done += static_cast<size_t>(n);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --running_;
      busy_[static_cast<size_t>(job.buffer)] = false;
    }
    cv_.notify_all();
  }
}

void StreamWriter::rethrow() {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

void StreamWriter::hand_over(size_t bytes) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    busy_[static_cast<size_t>(current_)] = true;
    jobs_.push_back({current_, flushed_, bytes});
    flushed_ += bytes;
    current_ = (current_ + 1) % bufs_.count();
    cv_.notify_all();
    cv_.wait(lock, [&] { return !busy_[static_cast<size_t>(current_)]; });
  }
  filled_ = 0;
  rethrow();
}

void StreamWriter::append(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const size_t n = std::min(bytes, bufs_.chunk() - filled_);
    std::memcpy(bufs_.at(current_) + filled_, p, n);
    filled_ += n, p += n, bytes -= n, size_ += n;
    if (filled_ == bufs_.chunk()) hand_over(filled_);
  }
}

void StreamWriter::finish() {
  if (filled_ > 0) {
    // O_DIRECT writes whole blocks: pad the tail, then trim the file to its real size.
    const size_t padded = direct_ ? round_up(filled_, kDirectAlign) : filled_;
    std::memset(bufs_.at(current_) + filled_, 0, padded - filled_);
    hand_over(padded);
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return jobs_.empty() && running_ == 0; });
  }
  rethrow();
  if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) fail(path_, "ftruncate", errno);
  if (io_fdatasync(fd_, path_) != 0) fail(path_, "fdatasync", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(path_, "close", errno);
}

StreamReader::StreamReader(const std::string& path, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                           size_t chunk, int buffers, int threads)
    : path_(path), bufs_(chunk, buffers), filled_(static_cast<size_t>(buffers), -1) {
  fd_ = open_stream(path, O_RDONLY, &direct_);
  // Whole aligned blocks around each range; the caller sees only the wanted bytes.
  for (size_t r = 0; r < ranges.size(); ++r) {
    const auto [begin, end] = ranges[r];
    uint64_t at = direct_ ? begin / kDirectAlign * kDirectAlign : begin;
    const uint64_t stop = direct_ ? round_up(end, kDirectAlign) : end;
    while (at < stop) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(bufs_.chunk(), stop - at));
      const size_t skip = at < begin ? static_cast<size_t>(begin - at) : 0;
      const uint64_t wanted_end = std::min<uint64_t>(at + want, end);
      if (wanted_end > at + skip) chunks_.push_back({at, want, skip, static_cast<size_t>(wanted_end - at - skip), wanted_end, r});
      at += want;
    }
  }
  for (int t = 0; t < std::min<int>(threads, static_cast<int>(chunks_.size())); ++t) io_.emplace_back([this] { io_loop(); });
}

StreamReader::~StreamReader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : io_) t.join();
  ::close(fd_);
}

void StreamReader::io_loop() {
  const size_t nbuf = static_cast<size_t>(bufs_.count());
  for (;;) {
    size_t i;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Chunk i may go into buffer i % nbuf once the caller is past chunk i - nbuf.
      cv_.wait(lock, [&] { return stop_ || error_ || next_read_ >= chunks_.size() || next_read_ < next_give_ + nbuf - 1; });
      if (stop_ || error_ || next_read_ >= chunks_.size()) return;
      i = next_read_++;
    }
    Chunk& c = chunks_[i];
    char* buf = bufs_.at(static_cast<int>(i % nbuf));
    try {
      size_t got = 0;
      while (got < c.want) {
        const ssize_t n = io_pread(fd_, buf + got, c.want - got, c.at + got, path_, direct_ ? kDirectAlign : 1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail(path_, "read at offset " + std::to_string(c.at + got), errno);
        if (n == 0) break;  // end of file: the last block of a file StreamWriter trimmed
        got += static_cast<size_t>(n);
      }
      if (c.at + got < c.need_end) {
        throw std::runtime_error(path_ + ": ends at byte " + std::to_string(c.at + got) + ", before " +
                                 std::to_string(c.need_end) + " (truncated)");
      }
      c.crc = crc32c(buf + c.skip, c.bytes);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      filled_[i % nbuf] = static_cast<int64_t>(i);
    }
    cv_.notify_all();
  }
}

bool StreamReader::next(const char** data, size_t* bytes, size_t* range, uint32_t* crc) {
  const size_t nbuf = static_cast<size_t>(bufs_.count());
  std::unique_lock<std::mutex> lock(mu_);
  if (next_give_ > 0) filled_[(next_give_ - 1) % nbuf] = -1;  // the caller is done with the previous piece
  cv_.notify_all();
  if (next_give_ >= chunks_.size()) return false;
  const size_t i = next_give_;
  cv_.wait(lock, [&] { return filled_[i % nbuf] == static_cast<int64_t>(i) || error_; });
  if (filled_[i % nbuf] != static_cast<int64_t>(i)) std::rethrow_exception(error_);
  ++next_give_;
  const Chunk& c = chunks_[i];
  *data = bufs_.at(static_cast<int>(i % nbuf)) + c.skip;
  *bytes = c.bytes;
  if (range) *range = c.range;
  if (crc) *crc = c.crc;
  return true;
}

}  // namespace ferry::runtime
