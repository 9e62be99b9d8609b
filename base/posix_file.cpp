#include "base/posix_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "base/io_faults.h"

namespace ferry {

namespace {
[[noreturn]] void fail(const std::string& path, const std::string& what, int err) {
  throw std::runtime_error(path + ": " + what + ": " + std::strerror(err));
}
}  // namespace

File::File(const std::string& path, Mode mode) : path_(path) {
  fd_ = mode == read ? ::open(path.c_str(), O_RDONLY | O_CLOEXEC)
                     : ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path, mode == read ? "cannot open for reading" : "cannot create", errno);
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

void File::write_at(uint64_t offset, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = io_pwrite(fd_, p, bytes, offset, path_);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(path_, "write of " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset), n < 0 ? errno : EIO);
    p += n, offset += static_cast<uint64_t>(n), bytes -= static_cast<size_t>(n);
  }
}

void File::read_at(uint64_t offset, void* data, size_t bytes) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = io_pread(fd_, p, bytes, offset, path_);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path_, "read at offset " + std::to_string(offset), errno);
    if (n == 0) throw std::runtime_error(path_ + ": ends before offset " + std::to_string(offset + bytes) + " (truncated?)");
    p += n, offset += static_cast<uint64_t>(n), bytes -= static_cast<size_t>(n);
  }
}

uint64_t File::size() const {
  struct stat st{};
  if (::fstat(fd_, &st) != 0) fail(path_, "fstat", errno);
  return static_cast<uint64_t>(st.st_size);
}

void File::sync() {
  if (io_fdatasync(fd_, path_) != 0) fail(path_, "fdatasync", errno);
}

void File::close() {
  const int fd = fd_;
  fd_ = -1;
  if (fd >= 0 && ::close(fd) != 0) fail(path_, "close", errno);
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(dir, "cannot open directory", errno);
  const int rc = io_fsync(fd, dir);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail(dir, "fsync", err);
}

namespace {
// Runs `write` (which makes `tmp`), then renames tmp over `to`; on any error removes tmp.
template <typename Write>
void replace_atomically(const std::string& tmp, const std::string& to, Write write) {
  try {
    write();
    rename_path(tmp, to);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw;
  }
}
}  // namespace

void write_file_atomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  replace_atomically(tmp, path, [&] {
    File f(tmp, File::create);
    f.write_at(0, content.data(), content.size());
    f.sync();
    f.close();
  });
  const std::string parent = std::filesystem::path(path).parent_path().string();
  fsync_dir(parent.empty() ? "." : parent);
}

void copy_file_atomic(const std::string& from, const std::string& to) {
  File in(from, File::read);
  const uint64_t size = in.size();
  const std::string tmp = to + ".tmp";
  replace_atomically(tmp, to, [&] {
    File out(tmp, File::create);
    std::string piece;
    for (uint64_t at = 0; at < size;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(1u << 20, size - at));
      piece.resize(n);
      in.read_at(at, piece.data(), n);
      out.write_at(at, piece.data(), n);
      at += n;
    }
    out.sync();
    out.close();
  });
}

void rename_path(const std::string& from, const std::string& to) {
  if (io_rename(from, to) != 0) fail(to, "rename from " + from, errno);
}

bool exchange_paths(const std::string& a, const std::string& b) {
  if (io_exchange(a, b) == 0) return true;
  if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) return false;  // the file system cannot
  fail(b, "exchange with " + a, errno);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace ferry
