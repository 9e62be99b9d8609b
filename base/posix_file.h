// A file descriptor with whole-buffer reads and writes, and the fsync steps that make a
// rename durable. Used for checkpoints and exported weights (sequential, buffered I/O:
// the page cache does the batching; fsync before anything is declared complete).
// Errors: std::runtime_error naming the path, the operation, the offset and errno's text.
// Threads: one thread per File. Ownership: the File owns and closes its descriptor.
#pragma once

#include <cstdint>
#include <string>

namespace ferry {

class File {
 public:
  enum Mode { read, create };  // create: write-only, created or truncated
  File(const std::string& path, Mode mode);
  ~File();
  File(File&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_) { o.fd_ = -1; }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  void write_at(uint64_t offset, const void* data, size_t bytes);
  void read_at(uint64_t offset, void* data, size_t bytes);  // throws on a short file
  uint64_t size() const;
  void sync();   // fdatasync
  void close();  // reports close's error (NFS reports write errors there)
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }

 private:
  std::string path_;
  int fd_ = -1;
};

void fsync_dir(const std::string& dir);
// Writes `content` to path.tmp, syncs it, renames it over `path`, syncs the directory.
void write_file_atomic(const std::string& path, const std::string& content);
// Copies a file to path.tmp through File (so through the fault seam), syncs it and renames
// it over `to`; throws naming the file that failed. For the small files a checkpoint and an
// export carry (config.json, tokenizer.json): the copy is read and written in 1 MiB pieces.
void copy_file_atomic(const std::string& from, const std::string& to);
// rename(2) through the I/O fault seam (base/io_faults.h); throws naming both paths.
void rename_path(const std::string& from, const std::string& to);
// Swaps two existing paths atomically (renameat2's RENAME_EXCHANGE): no moment where either
// name is missing. False where the file system cannot (then nothing changed); throws naming
// both paths on any other error.
bool exchange_paths(const std::string& a, const std::string& b);
std::string read_text_file(const std::string& path);  // throws naming the path

}  // namespace ferry
