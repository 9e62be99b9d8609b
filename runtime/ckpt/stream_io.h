// Sequential streams over one file for checkpoints: O_DIRECT where the file system allows
// it (the page cache bypassed, as fio --direct=1 measures the disk), with a background
// thread doing the system calls while the caller copies and checksums the next chunk.
// Where O_DIRECT is refused (tmpfs) the same code runs buffered.
// Memory: `buffers` aligned chunks of `chunk` bytes per stream.
// Threads: one caller thread per stream (plus the stream's own I/O thread).
// Errors: std::runtime_error naming the path, the offset and errno, raised to the caller
// at its next call.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ferry::runtime {

constexpr size_t kDirectAlign = 4096;

// Aligned buffers shared by the stream and its I/O thread.
class StreamBuffers {
 public:
  StreamBuffers(size_t chunk, int count);
  ~StreamBuffers();
  StreamBuffers(const StreamBuffers&) = delete;
  StreamBuffers& operator=(const StreamBuffers&) = delete;
  char* at(int i) const { return ptrs_[static_cast<size_t>(i)]; }
  int count() const { return static_cast<int>(ptrs_.size()); }
  size_t chunk() const { return chunk_; }

 private:
  size_t chunk_;
  std::vector<char*> ptrs_;
};

// Writes a byte stream to a new file (created or truncated). Chunk i goes to buffer
// i % buffers; `threads` I/O threads write different chunks at once (the queue depth).
class StreamWriter {
 public:
  explicit StreamWriter(const std::string& path, size_t chunk = 4u << 20, int buffers = 8, int threads = 4);
  ~StreamWriter();  // abandons an unfinished file (no sync)
  void append(const void* data, size_t bytes);
  uint64_t size() const { return size_; }
  // Writes the tail, trims the file to size(), fdatasyncs and closes it.
  void finish();

 private:
  void hand_over(size_t bytes);  // the current buffer goes to the I/O threads
  void io_loop();
  void rethrow();

  std::string path_;
  int fd_ = -1;
  bool direct_ = false;
  StreamBuffers bufs_;
  int current_ = 0;
  size_t filled_ = 0;
  uint64_t size_ = 0, flushed_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  struct Job {
    int buffer;
    uint64_t offset;
    size_t bytes;
  };
  std::deque<Job> jobs_;
  std::vector<bool> busy_;
  int running_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> io_;
};

// Reads byte ranges of a file in order (ascending, not overlapping), chunks read ahead
// by `threads` I/O threads into `buffers` buffers. Pieces never cross a range's end.
class StreamReader {
 public:
  StreamReader(const std::string& path, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
               size_t chunk = 2u << 20, int buffers = 16, int threads = 8);
  ~StreamReader();
  // The next piece (valid until the following call), the index of its range and the
  // piece's CRC-32C (computed on the I/O thread); false after the last.
  bool next(const char** data, size_t* bytes, size_t* range = nullptr, uint32_t* crc = nullptr);

 private:
  void io_loop();

  std::string path_;
  int fd_ = -1;
  bool direct_ = false;
  struct Chunk {
    uint64_t at;           // file offset of the read (aligned when direct)
    size_t want;           // bytes to read
    size_t skip, bytes;    // the wanted part
    uint64_t need_end;     // the file must reach this offset
    size_t range;
    uint32_t crc = 0;      // of the wanted part, once read
  };
  std::vector<Chunk> chunks_;
  StreamBuffers bufs_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t next_read_ = 0;      // next chunk an I/O thread takes
  size_t next_give_ = 0;      // next chunk the caller gets
  std::vector<int64_t> filled_;  // per buffer: the chunk it holds, -1 if none
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> io_;
};

}  // namespace ferry::runtime
