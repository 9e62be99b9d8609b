// A read-only memory map of a whole file (mmap, MAP_PRIVATE): pages are read on first
// touch, so a corpus larger than memory is used without reading it whole.
// Errors: std::runtime_error naming the path. Threads: immutable after construction.
#pragma once

#include <cstddef>
#include <string>

namespace ferry {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ferry
