#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "base/crc32c.h"
#include "base/nesting_limit.h"
#include "base/posix_file.h"
#include "base/version.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/ckpt/stream_io.h"

namespace ferry::runtime {

namespace fs = std::filesystem;
using nlohmann::json;

const char* const kArrayNames[3] = {"master", "m", "v"};

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string rank_file(int rank, const char* ext) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.%s", rank, ext);
  return buf;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.starts_with("step-")) names.push_back(n);
  }
  std::sort(names.begin(), names.end());  // zero-padded: lexical order is step order
  return names;
}

std::string resolve_resume(const std::string& spec, const std::string& dir) {
  if (spec == "none" || spec.empty()) return "";
  if (spec != "auto") return spec;
  if (dir.empty()) throw CheckpointError("--resume auto needs checkpoint.dir");
  const fs::path latest = fs::path(dir) / "latest";
  if (!fs::exists(latest)) return "";
  std::string name = read_text_file(latest.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  const fs::path target = fs::path(dir) / name;
  // A name in `dir` (a '/' would leave it: "/x" replaces dir), and a folder; is_directory's
  // error_code form: a name too long for the file system is no exception of its own.
  std::error_code ec;
  if (name.empty() || name == "." || name == ".." || name.find_first_of(std::string("/\0", 2)) != std::string::npos ||
      !fs::is_directory(target, ec)) {
    throw CheckpointError(latest.string() + " names '" + name + "', which is not a checkpoint directory there");
  }
  return target.string();
}

namespace {

json read_json(const std::string& path, const std::string& what) {
  if (!fs::exists(path)) throw CheckpointError(path + " is missing (" + what + ")");
  try {
    return base::parse_json<CheckpointError>(read_text_file(path), path);
  } catch (const json::exception& e) {
    throw CheckpointError(path + ": not valid JSON (" + e.what() + "); the file is damaged");
  }
}

// An integer field of a manifest or index that T holds. json's get<T>() would convert a
// float outside T's range (undefined behaviour) or wrap a negative one into an unsigned T.
template <class T>
T integer(const json& v, const std::string& path, const std::string& what) {
  if (v.is_number_unsigned() && std::in_range<T>(v.get<uint64_t>())) return static_cast<T>(v.get<uint64_t>());
  if (v.is_number_integer() && !v.is_number_unsigned() && std::in_range<T>(v.get<int64_t>())) {
    return static_cast<T>(v.get<int64_t>());
  }
  throw CheckpointError(path + ": " + what + " is " + v.dump() + ", not an integer in range; the file is damaged");
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& step_dir) : dir_(step_dir) {
  if (!fs::is_directory(dir_)) throw CheckpointError(dir_ + " is not a directory");
  const std::string mpath = (fs::path(dir_) / "manifest.json").string();
  manifest_ = read_json(mpath, "an incomplete checkpoint: the manifest is written last");
  try {
    if (manifest_.value("format", "") != "ferry-checkpoint") throw CheckpointError(mpath + ": not a ferry checkpoint manifest");
    const int version = integer<int>(manifest_.at("format_version"), mpath, "format_version");
    if (version < 1 || version > kCheckpointFormat) {
      throw CheckpointError(mpath + ": checkpoint format version " + std::to_string(version) + " (written by ferry " +
                            manifest_.value("ferry_version", "?") + "); this ferry (" + kVersion + ") reads versions 1 to " +
                            std::to_string(kCheckpointFormat));
    }
    world_ = integer<int>(manifest_.at("world_size"), mpath, "world_size");
    if (world_ < 1) throw CheckpointError(mpath + ": world_size " + std::to_string(world_) + " is not a number of ranks");
    for (const json& u : manifest_.at("units")) {
      UnitInfo info;
      info.name = u.at("name").get<std::string>();
      // The elements the slices tile: the trainable span (adapters' checkpoints), else the unit.
      info.numel = integer<int64_t>(u.contains("trainable_numel") ? u.at("trainable_numel") : u.at("numel"), mpath,
                                    std::string("unit ") + info.name + "'s numel");
      if (info.numel < 0) throw CheckpointError(mpath + ": unit " + info.name + " has numel " + std::to_string(info.numel));
      info.segments.resize(3);  // one segment per saving rank is added as each rank's index is read
      units_.push_back(std::move(info));
    }
    (void)integer<int64_t>(manifest_.at("step"), mpath, "step");
  } catch (const json::exception& e) {
    throw CheckpointError(mpath + ": missing or malformed field (" + std::string(e.what()) + ")");
  }
  for (int r = 0; r < world_; ++r) {
    const std::string ipath = (fs::path(dir_) / rank_file(r, "json")).string();
    const std::string dpath = (fs::path(dir_) / rank_file(r, "bin")).string();
    const json index = read_json(ipath, "saved by " + std::to_string(world_) + " ranks, each writes one");
    for (UnitInfo& info : units_)
      for (std::vector<Segment>& by_rank : info.segments) by_rank.emplace_back();
    uint64_t bytes = 0;
    try {
      bytes = integer<uint64_t>(index.at("bytes"), ipath, "bytes");
      for (const json& s : index.at("segments")) {
        const size_t u = integer<size_t>(s.at("unit"), ipath, "a segment's unit");
        const int a = integer<int>(s.at("array"), ipath, "a segment's array");
        if (u >= units_.size() || a < 0 || a > 2) throw CheckpointError(ipath + ": segment for unit " + std::to_string(u) + " array " + std::to_string(a) + " does not exist in the manifest");
        const Segment seg{integer<int64_t>(s.at("begin"), ipath, "a segment's begin"),
                          integer<int64_t>(s.at("count"), ipath, "a segment's count"),
                          integer<uint64_t>(s.at("offset"), ipath, "a segment's offset"),
                          integer<uint32_t>(s.at("crc32c"), ipath, "a segment's crc32c")};
        // Within the unit and within the data file the index describes (so that nothing
        // read or allocated later is sized by a damaged number).
        if (seg.begin < 0 || seg.count < 0 || seg.count > units_[u].numel - seg.begin || seg.offset > bytes ||
            static_cast<uint64_t>(seg.count) > (bytes - seg.offset) / 4) {
          throw CheckpointError(ipath + ": segment for unit " + std::to_string(u) + " array " + std::to_string(a) +
                                " (elements from " + std::to_string(seg.begin) + ", " + std::to_string(seg.count) +
                                " at byte " + std::to_string(seg.offset) + ") lies outside the unit's " +
                                std::to_string(units_[u].numel) + " elements or the data file's " +
                                std::to_string(bytes) + " bytes");
        }
        units_[u].segments[static_cast<size_t>(a)][static_cast<size_t>(r)] = seg;
      }
    } catch (const json::exception& e) {
      throw CheckpointError(ipath + ": missing or malformed field (" + std::string(e.what()) + ")");
    }
    if (!fs::exists(dpath)) throw CheckpointError(dpath + " is missing (saved by " + std::to_string(world_) + " ranks)");
    File f(dpath, File::read);
    if (f.size() != bytes) {
      throw CheckpointError(dpath + " is " + std::to_string(f.size()) + " bytes, its index " + rank_file(r, "json") +
                            " says " + std::to_string(bytes) + (f.size() < bytes ? " (truncated)" : " (damaged)"));
    }
  }
  // Each unit's slices must tile [0, numel): anything else is a damaged index.
  for (size_t u = 0; u < units_.size(); ++u) {
    for (int a = 0; a < 3; ++a) {
      int64_t at = 0;
      for (const Segment& s : units_[u].segments[static_cast<size_t>(a)]) {
        if (s.count > 0 && s.begin != at) at = -1;
        if (at >= 0) at += s.count;
      }
      if (at != units_[u].numel) {
        throw CheckpointError(dir_ + ": the rank indexes do not cover unit " + std::to_string(u) + " (" + units_[u].name +
                              ") " + kArrayNames[a] + " exactly; an index file is damaged");
      }
    }
  }
  (void)layout();  // the tensors of the manifest, checked here rather than at first use
}

std::vector<nn::UnitSpec> CheckpointReader::layout() const {
  const std::string mpath = (fs::path(dir_) / "manifest.json").string();
  std::vector<nn::UnitSpec> out;
  try {
    for (const json& u : manifest_.at("units")) {
      nn::UnitSpec spec;
      spec.name = u.at("name").get<std::string>();
      spec.numel = integer<int64_t>(u.at("numel"), mpath, std::string("unit ") + spec.name + "'s numel");
      spec.trainable_numel = u.contains("trainable_numel")
                                 ? integer<int64_t>(u.at("trainable_numel"), mpath, "unit " + spec.name + "'s trainable_numel")
                                 : spec.numel;  // format 1: every tensor trained
      if (spec.trainable_numel < 0 || spec.trainable_numel > spec.numel) {
        throw CheckpointError(mpath + ": unit " + spec.name + "'s trainable_numel is outside its numel");
      }
      for (const json& t : u.at("tensors")) {
        nn::TensorSpec ts{t.at("name").get<std::string>(), {}, integer<int64_t>(t.at("offset"), mpath, "a tensor's offset"),
                          t.at("decay").get<bool>()};
        ts.trainable = t.value("trainable", true);
        if (!t.at("shape").is_array()) throw CheckpointError(mpath + ": tensor " + ts.name + "'s shape is not a list");
        for (const json& d : t.at("shape")) ts.shape.push_back(integer<int64_t>(d, mpath, std::string("tensor ") + ts.name + "'s shape"));
        if (const auto q = t.find("nf4"); q != t.end()) {  // NF4 blobs: the extent is theirs, not the shape's
          if (ts.trainable || ts.shape.size() != 2 || !q->at("pieces").is_array()) {
            throw CheckpointError(mpath + ": tensor " + ts.name + "'s nf4 entry needs a frozen matrix and a list of pieces");
          }
          // Dimensions bounded before any product: a blob holds at least half a byte a value,
          // so an NF4 matrix of more than 4 x the unit's elements cannot fit it.
          const int64_t cap = int64_t{1} << 31;
          if (ts.shape[0] < 1 || ts.shape[1] < 1 || ts.shape[0] > cap || ts.shape[1] > cap ||
              ts.shape[0] * ts.shape[1] > 4 * std::min<int64_t>(spec.numel, int64_t{1} << 60)) {
            throw CheckpointError(mpath + ": tensor " + ts.name + "'s nf4 shape does not fit its unit");
          }
          int64_t row = 0, at = 0;
          for (const json& p : q->at("pieces")) {
            if (!p.is_array() || p.size() != 2) throw CheckpointError(mpath + ": tensor " + ts.name + "'s nf4 pieces are [row0, rows] pairs");
            const int64_t row0 = integer<int64_t>(p[0], mpath, "an nf4 piece's row0");
            const int64_t rows = integer<int64_t>(p[1], mpath, "an nf4 piece's rows");
            if (row0 != row || rows <= 0 || rows > ts.shape[0] - row) {
              throw CheckpointError(mpath + ": tensor " + ts.name + "'s nf4 pieces do not cover its rows in order");
            }
            const nn::Nf4Layout l = nn::nf4_layout(rows, ts.shape[1], q->at("double_quant").get<bool>());
            ts.nf4.push_back({row0, l, at});
            at += l.bytes;
            row += rows;
          }
          if (row != ts.shape[0]) throw CheckpointError(mpath + ": tensor " + ts.name + "'s nf4 pieces do not cover its rows");
        }
        // Inside the unit: the tensor's elements are read (export) by offset and shape.
        int64_t n = 1;
        bool inside = ts.offset >= 0 && ts.offset <= spec.numel;
        for (const int64_t d : ts.shape) {
          if (ts.quantized()) break;  // its extent is its blobs' (checked below), not its values'
          inside = inside && d >= 0 && (d == 0 || n <= (spec.numel - ts.offset) / d);
          if (inside) n *= d;
        }
        if (ts.quantized()) n = ts.stored_numel();
        inside = inside && n <= spec.numel - ts.offset;
        if (!inside) {
          throw CheckpointError(mpath + ": unit " + spec.name + ": tensor " + ts.name + " " + t.at("shape").dump() +
                                " at offset " + std::to_string(ts.offset) + " does not fit the unit's " +
                                std::to_string(spec.numel) + " elements");
        }
        spec.tensors.push_back(std::move(ts));
      }
      out.push_back(std::move(spec));
    }
  } catch (const json::exception& e) {
    throw CheckpointError(mpath + ": missing or malformed field (" + std::string(e.what()) + ")");
  }
  return out;
}

void CheckpointReader::check_layout(const std::vector<nn::UnitSpec>& layout) const {
  const std::vector<nn::UnitSpec> saved = this->layout();
  const std::string where = (fs::path(dir_) / "manifest.json").string();
  if (saved.size() != layout.size()) {
    throw CheckpointError(where + ": the checkpoint has " + std::to_string(saved.size()) + " units, the model " +
                          std::to_string(layout.size()) + " (another model.n_layer?)");
  }
  for (size_t u = 0; u < saved.size(); ++u) {
    const auto& a = saved[u].tensors;
    const auto& b = layout[u].tensors;
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
      if (i < a.size() && i < b.size() && a[i].name == b[i].name && a[i].trainable != b[i].trainable) {
        throw CheckpointError(where + ": unit " + saved[u].name + ": " + a[i].name + " is " +
                              (a[i].trainable ? "trained" : "frozen") + " in the checkpoint but " +
                              (b[i].trainable ? "trained" : "frozen") + " in this run (another lora.* setting)");
      }
      const auto storage = [](const nn::TensorSpec& t) {
        return !t.quantized() ? std::string("values") : std::string(t.nf4.front().layout.double_quant ? "nf4 (double quantized)" : "nf4");
      };
      if (i < a.size() && i < b.size() && a[i].name == b[i].name && storage(a[i]) != storage(b[i])) {
        throw CheckpointError(where + ": unit " + saved[u].name + ": " + a[i].name + " is stored as " + storage(a[i]) +
                              " in the checkpoint but as " + storage(b[i]) +
                              " in this run (lora.base_dtype or lora.double_quant changed)");
      }
      if (i >= a.size() || i >= b.size() || a[i].name != b[i].name || a[i].shape != b[i].shape || a[i].offset != b[i].offset) {
        const auto shape = [](const std::vector<nn::TensorSpec>& v, size_t k) {
          return k < v.size() ? v[k].name + " " + nn::shape_str(v[k].shape) : std::string("nothing");
        };
        throw CheckpointError(where + ": unit " + saved[u].name + " holds " + shape(a, i) + " in the checkpoint but " +
                              shape(b, i) + " in the model (another model shape)");
      }
    }
  }
}

void CheckpointReader::read(int unit, int array, int64_t begin, int64_t n, float* dst) {
  const UnitInfo& info = units_.at(static_cast<size_t>(unit));
  if (begin < 0 || n < 0 || begin + n > info.numel) throw std::out_of_range("CheckpointReader::read outside the unit");
  for (int r = 0; r < world_; ++r) {
    const Segment& s = info.segments[static_cast<size_t>(array)][static_cast<size_t>(r)];
    const int64_t lo = std::max(begin, s.begin), hi = std::min(begin + n, s.begin + s.count);
    if (lo >= hi) continue;
    const std::string path = (fs::path(dir_) / rank_file(r, "bin")).string();
    uint32_t crc = 0;
    int64_t at = s.begin;  // element of the piece's start
    try {
      const bool planned = !planned_.empty() && !planned_[static_cast<size_t>(r)].empty() &&
                           planned_[static_cast<size_t>(r)].front() == std::pair{unit, array};
      std::unique_ptr<StreamReader> own;
      StreamReader* in = planned ? streams_[static_cast<size_t>(r)].get() : nullptr;
      if (planned) {
        planned_[static_cast<size_t>(r)].pop_front();
      } else {
        own = std::make_unique<StreamReader>(path, std::vector<std::pair<uint64_t, uint64_t>>{{s.offset, s.offset + static_cast<uint64_t>(s.count) * 4}});
        in = own.get();
      }
      const char* data = nullptr;
      size_t bytes = 0;
      uint32_t piece_crc = 0;
      while (at < s.begin + s.count && in->next(&data, &bytes, nullptr, &piece_crc)) {
        crc = crc32c_combine(crc, piece_crc, bytes);
        const int64_t len = static_cast<int64_t>(bytes / 4);
        const int64_t clo = std::max(lo, at), chi = std::min(hi, at + len);
        if (clo < chi) std::memcpy(dst + (clo - begin), data + (clo - at) * 4, static_cast<size_t>(chi - clo) * 4);
        at += len;
      }
    } catch (const CheckpointError&) {
      throw;
    } catch (const std::exception& e) {
      throw CheckpointError(e.what());
    }
    if (crc != s.crc) {
      char buf[160];
      std::snprintf(buf, sizeof buf, ": unit %d (%s) %s, elements [%lld, %lld): checksum mismatch (index 0x%08x, data 0x%08x)",
                    unit, info.name.c_str(), kArrayNames[array], static_cast<long long>(s.begin),
                    static_cast<long long>(s.begin + s.count), s.crc, crc);
      throw CheckpointError(path + buf);
    }
  }
}

void CheckpointReader::plan(const std::vector<Read>& reads) {
  streams_.clear();
  planned_.assign(static_cast<size_t>(world_), {});
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges(static_cast<size_t>(world_));
  for (const Read& q : reads) {
    for (int r = 0; r < world_; ++r) {
      const Segment& s = units_.at(static_cast<size_t>(q.unit)).segments.at(static_cast<size_t>(q.array))[static_cast<size_t>(r)];
      if (std::max(q.begin, s.begin) >= std::min(q.begin + q.n, s.begin + s.count)) continue;
      auto& rr = ranges[static_cast<size_t>(r)];
      if (!rr.empty() && rr.back().second > s.offset) return planned_.clear();  // not in file order: no plan
      rr.emplace_back(s.offset, s.offset + static_cast<uint64_t>(s.count) * 4);
      planned_[static_cast<size_t>(r)].emplace_back(q.unit, q.array);
    }
  }
  for (int r = 0; r < world_; ++r) {
    const std::string path = (fs::path(dir_) / rank_file(r, "bin")).string();
    streams_.push_back(ranges[static_cast<size_t>(r)].empty() ? nullptr
                                                              : std::make_unique<StreamReader>(path, ranges[static_cast<size_t>(r)]));
  }
}

}  // namespace ferry::runtime
