#include "runtime/ckpt/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/nesting_limit.h"

namespace ferry::runtime {

using nlohmann::json;

size_t safetensors_dtype_size(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "U32") return 4;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
  throw std::runtime_error("safetensors: unknown dtype '" + dtype + "'");
}

namespace {
// An integer of the header that T holds: json's get<T>() converts a float outside T's range
// (undefined behaviour) and wraps a negative one into an unsigned T.
template <class T>
T header_integer(const json& v, const std::string& what) {
  if (v.is_number_unsigned() && std::in_range<T>(v.get<uint64_t>())) return static_cast<T>(v.get<uint64_t>());
  if (v.is_number_integer() && !v.is_number_unsigned() && std::in_range<T>(v.get<int64_t>())) {
    return static_cast<T>(v.get<int64_t>());
  }
  throw std::runtime_error(what + " is " + v.dump() + ", not an integer in range");
}

// UINT64_MAX for a shape no file can hold (a negative or overflowing dimension).
uint64_t expected_bytes(const SafetensorsEntry& e) {
  uint64_t n = safetensors_dtype_size(e.dtype);
  for (int64_t d : e.shape) {
    if (d < 0 || (d > 0 && n > (uint64_t{1} << 62) / static_cast<uint64_t>(d))) return UINT64_MAX;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}
}  // namespace

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<SafetensorsEntry> entries,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), file_(path + ".tmp", File::create), entries_(std::move(entries)) {
  try {
    json header = json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    uint64_t at = 0;
    for (SafetensorsEntry& e : entries_) {
      e.begin = at;
      e.end = at += expected_bytes(e);
      header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
    const uint64_t n = text.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    file_.write_at(0, len, 8);
    file_.write_at(8, text.data(), text.size());
    data_start_ = 8 + n;
  } catch (...) {  // no destructor runs for a writer never built: remove the file here
    std::error_code ignored;
    std::filesystem::remove(path_ + ".tmp", ignored);
    throw;
  }
}

void SafetensorsWriter::write(size_t index, const void* data, size_t bytes) {
  const SafetensorsEntry& e = entries_.at(index);
  if (bytes != e.end - e.begin) throw std::logic_error("safetensors: wrong byte count for " + e.name);
  file_.write_at(data_start_ + e.begin, data, bytes);
}

SafetensorsWriter::~SafetensorsWriter() {
  if (finished_) return;
  std::error_code ignored;
  std::filesystem::remove(path_ + ".tmp", ignored);
}

void SafetensorsWriter::finish() {
  file_.sync();
  file_.close();
  rename_path(path_ + ".tmp", path_);
  finished_ = true;
  try {
    const std::string parent = std::filesystem::path(path_).parent_path().string();
    fsync_dir(parent.empty() ? "." : parent);
  } catch (...) {  // not known to be durable: an error leaves no file, as everywhere else
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
    throw;
  }
}

SafetensorsReader::SafetensorsReader(const std::string& path) : file_(path, File::read), path_(path) {
  const uint64_t size = file_.size();
  if (size < 8) throw std::runtime_error(path + ": too short for a safetensors file");
  unsigned char len[8];
  file_.read_at(0, len, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > size - 8 || n > (100u << 20)) throw std::runtime_error(path + ": header length " + std::to_string(n) + " is past the end");
  std::string text(n, '\0');
  file_.read_at(8, text.data(), n);
  data_start_ = 8 + n;
  json header;
  try {
    header = base::parse_json<std::runtime_error>(text, path);
    for (const auto& [name, v] : header.items()) {
      if (name == "__metadata__") {
        if (v.is_object()) {
        for (const auto& [k, mv] : v.items())
          if (mv.is_string()) metadata_[k] = mv.get<std::string>();
      }
        continue;
      }
      SafetensorsEntry e{name, v.at("dtype").get<std::string>(), {},
                         header_integer<uint64_t>(v.at("data_offsets").at(0), std::string("tensor ") + name + "'s data_offsets"),
                         header_integer<uint64_t>(v.at("data_offsets").at(1), std::string("tensor ") + name + "'s data_offsets")};
      if (!v.at("shape").is_array()) throw std::runtime_error(std::string("tensor ") + name + "'s shape is not a list");
      for (const json& d : v.at("shape")) e.shape.push_back(header_integer<int64_t>(d, std::string("tensor ") + name + "'s shape"));
      if (e.end < e.begin || e.end - e.begin != expected_bytes(e))
        throw std::runtime_error(path + ": tensor " + name + " has offsets that do not match its shape and dtype");
      entries_.push_back(std::move(e));
    }
  } catch (const json::exception& ex) {
    throw std::runtime_error(path + ": bad safetensors header: " + ex.what());
  } catch (const std::runtime_error& ex) {
    const std::string what = ex.what();
    if (what.starts_with(path)) throw;
    throw std::runtime_error(path + ": bad safetensors header: " + what);
  }
  std::vector<SafetensorsEntry> sorted = entries_;
  // By (begin, end), as the safetensors library validates: an empty tensor at the start of
  // another sorts first (by begin alone, their order was the sort's choice).
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t at = 0;
  for (const auto& e : sorted) {
    if (e.begin != at) throw std::runtime_error(path + ": tensor " + e.name + " does not start where the previous ends");
    at = e.end;
  }
  if (data_start_ + at != size) throw std::runtime_error(path + ": the data is " + std::to_string(size - data_start_) + " bytes, the header covers " + std::to_string(at));
}

std::vector<char> SafetensorsReader::read(const SafetensorsEntry& e) {
  std::vector<char> out(e.end - e.begin);
  file_.read_at(data_start_ + e.begin, out.data(), out.size());
  return out;
}

}  // namespace ferry::runtime

namespace ferry::runtime {

void SafetensorsReader::read_range(const SafetensorsEntry& e, uint64_t offset, size_t bytes, void* dst) {
  if (offset > e.end - e.begin || bytes > e.end - e.begin - offset) {
    throw std::logic_error("safetensors: range past the end of " + e.name);
  }
  file_.read_at(data_start_ + e.begin + offset, dst, bytes);
}

}  // namespace ferry::runtime
