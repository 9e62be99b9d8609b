// data.format tokens: token files memory-mapped, never read whole. A file of uint16 or
// uint32 little-endian ids, a folder of such *.bin files (one stream, in name order), or a
// folder `ferry tokenize` wrote (meta.json: a stream or records with their loss flags).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "base/mapped_file.h"
#include "base/nesting_limit.h"
#include "base/posix_file.h"
#include "runtime/train/data.h"

namespace ferry::runtime {

namespace fs = std::filesystem;

class TokenFiles {
 public:
  static TokenData load(const DataOptions& o);
};

TokenData load_token_files(const DataOptions& o) { return TokenFiles::load(o); }

namespace {

std::shared_ptr<MappedFile> map(const fs::path& p) { return std::make_shared<MappedFile>(p.string()); }

void append_file(TokenView& view, const fs::path& p, const std::string& dtype) {
  auto m = map(p);
  const size_t width = dtype == "uint16" ? 2 : 4;
  if (m->size() % width != 0) {
    throw std::runtime_error("data.path '" + p.string() + "': a " + dtype + " token file must have a size divisible by " +
                             std::to_string(width) + ", it has " + std::to_string(m->size()) + " bytes");
  }
  if (width == 2) {
    view.append(static_cast<const uint16_t*>(m->data()), m->size() / 2, m);
  } else {
    view.append(static_cast<const uint32_t*>(m->data()), m->size() / 4, m);
  }
}

}  // namespace

TokenData TokenFiles::load(const DataOptions& o) {
  TokenData d;
  d.source_ = o.path;
  const std::string dtype = o.dtype != "auto" ? o.dtype : o.vocab_size <= 65536 ? "uint16" : "uint32";
  const fs::path path(o.path);
  if (!fs::exists(path)) throw std::runtime_error("data.path: cannot open '" + o.path + "'");
  if (!fs::is_directory(path)) {
    append_file(d.all_, path, dtype);
    d.split(o.val_fraction);
    return d;
  }
  if (!fs::exists(path / "meta.json")) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(path))
      if (e.is_regular_file() && e.path().extension() == ".bin") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    if (files.empty()) throw std::runtime_error("data.path '" + o.path + "': a folder without *.bin token files or meta.json");
    for (const fs::path& f : files) append_file(d.all_, f, dtype);
    d.split(o.val_fraction);
    return d;
  }
  std::ifstream in(path / "meta.json");
  const nlohmann::json meta = base::parse_json<std::runtime_error>(in, (path / "meta.json").string(), /*allow_exceptions=*/false);
  // Compared as JSON values: value("format", "") would throw json's type_error for a number.
  if (meta.is_discarded() || !meta.is_object() || !meta.contains("format") || meta["format"] != "ferry-tokens") {
    throw std::runtime_error((path / "meta.json").string() + ": not a ferry tokenize folder (format \"ferry-tokens\")");
  }
  if (meta.contains("records") && !meta["records"].is_boolean()) {
    throw std::runtime_error((path / "meta.json").string() + ": \"records\" must be true or false, got " + meta["records"].dump());
  }
  auto tokens = map(path / "tokens.bin");
  if (tokens->size() % 4 != 0) throw std::runtime_error((path / "tokens.bin").string() + ": not a whole number of uint32 ids");
  const size_t n = tokens->size() / 4;
  d.all_.append(static_cast<const uint32_t*>(tokens->data()), n, tokens);
  if (!meta.value("records", false)) {
    d.split(o.val_fraction);
    return d;
  }
  auto counted = map(path / "counted.bin");
  auto starts = map(path / "starts.bin");
  if (counted->size() != n || starts->size() % 8 != 0 || starts->size() < 16) {
    throw std::runtime_error(o.path + ": counted.bin (" + std::to_string(counted->size()) + " bytes) and starts.bin (" +
                             std::to_string(starts->size()) + " bytes) do not match tokens.bin's " + std::to_string(n) +
                             " ids");
  }
  const auto* s = static_cast<const uint64_t*>(starts->data());
  const size_t records = starts->size() / 8 - 1;
  d.starts_.assign(s, s + records + 1);
  for (size_t r = 0; r < records; ++r) {
    if (d.starts_[r] >= d.starts_[r + 1] || d.starts_[r + 1] > n) {
      throw std::runtime_error((path / "starts.bin").string() + ": record " + std::to_string(r) + " has bounds [" +
                               std::to_string(d.starts_[r]) + ", " + std::to_string(d.starts_[r + 1]) + ") outside " +
                               std::to_string(n) + " ids");
    }
  }
  if (d.starts_[0] != 0 || d.starts_[records] != n) {
    throw std::runtime_error((path / "starts.bin").string() + ": the records do not cover tokens.bin");
  }
  d.rec_tokens_ = static_cast<const uint32_t*>(tokens->data());
  d.counted_ = static_cast<const uint8_t*>(counted->data());
  d.keep_ = {counted, starts};
  const auto n_val = std::min(records, static_cast<size_t>(std::llround(o.val_fraction * static_cast<double>(records))));
  d.n_train_records_ = records - n_val;
  d.n_train_ = d.starts_[d.n_train_records_];
  for (size_t i = 0; i < n; ++i) {
    if (d.rec_tokens_[i] >= static_cast<uint32_t>(std::min<int64_t>(o.vocab_size, UINT32_MAX))) {
      throw std::runtime_error((path / "tokens.bin").string() + ": token " + std::to_string(d.rec_tokens_[i]) +
                               " at index " + std::to_string(i) + " is not below model.vocab_size " +
                               std::to_string(o.vocab_size));
    }
  }
  return d;
}

void TokenData::save(const std::string& dir) const {
  if (val_file_) {
    // One folder holds one file's tokens and its split; the validation file is a second run
    // of ferry tokenize (its data.path), read back with data.val_path.
    throw std::runtime_error("ferry tokenize writes one data file: tokenize " + val_file_->source() +
                             " (data.val_path) as a run of its own, with it as data.path");
  }
  fs::create_directories(dir);
  {
    File f((fs::path(dir) / "tokens.bin").string(), File::create);
    std::vector<uint32_t> chunk;
    for (size_t at = 0; at < all_.size(); at += chunk.size()) {
      chunk.resize(std::min<size_t>(size_t{1} << 20, all_.size() - at));
      all_.copy(at, chunk.size(), chunk.data());
      f.write_at(at * 4, chunk.data(), chunk.size() * 4);
    }
    f.sync();
    f.close();
  }
  nlohmann::json meta = {{"format", "ferry-tokens"}, {"dtype", "uint32"}, {"tokens", all_.size()},
                         {"records", records()}, {"source", source_}};
  if (records()) {
    File c((fs::path(dir) / "counted.bin").string(), File::create);
    if (all_.size() > 0) c.write_at(0, counted_, all_.size());
    c.sync();
    c.close();
    std::vector<uint64_t> s(starts_.begin(), starts_.end());
    File f((fs::path(dir) / "starts.bin").string(), File::create);
    f.write_at(0, s.data(), s.size() * 8);
    f.sync();
    f.close();
    meta["record_count"] = starts_.size() - 1;
  }
  std::ofstream((fs::path(dir) / "meta.json").string()) << meta.dump(1) << "\n";
}

}  // namespace ferry::runtime
