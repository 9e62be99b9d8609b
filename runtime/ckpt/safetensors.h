// The safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON
// header mapping each tensor name to {dtype, shape, data_offsets [begin, end)} relative to
// the data that follows, and "__metadata__". The data is written in the order the tensors
// are declared, without holes, each tensor's bytes contiguous (row-major).
// Errors: std::runtime_error naming the file. Threads: one thread per object.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/posix_file.h"

namespace ferry::runtime {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16"
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data offsets, bytes
};

size_t safetensors_dtype_size(const std::string& dtype);  // throws for an unknown one

// Declare every tensor up front (the header needs every offset), then write each one's
// bytes, in any order, with write(); finish() syncs and closes.
// Writes PATH.tmp; finish() syncs it, renames it to PATH and syncs the folder, so PATH is
// only ever a whole file and an error (which removes what it wrote, PATH.tmp or PATH) leaves
// none. Destroyed unfinished, it removes PATH.tmp.
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<SafetensorsEntry> entries,
                    const std::map<std::string, std::string>& metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  void write(size_t index, const void* data, size_t bytes);  // bytes == end - begin
  void finish();
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }

 private:
  std::string path_;
  bool finished_ = false;
  File file_;
  std::vector<SafetensorsEntry> entries_;
  uint64_t data_start_ = 0;
};

// Reads the header (and checks it: offsets within the file, contiguous, sizes matching
// shape x dtype); read() returns one tensor's bytes.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::vector<char> read(const SafetensorsEntry& e);
  // Bytes [offset, offset + bytes) of one tensor's data (pread: only those bytes are read).
  void read_range(const SafetensorsEntry& e, uint64_t offset, size_t bytes, void* dst);
  const std::string& path() const { return path_; }

 private:
  File file_;
  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_start_ = 0;
};

}  // namespace ferry::runtime
