#include "runtime/hf/hf_weights.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/crc32c.h"
#include <fstream>
#include <set>
#include <stdexcept>

#include "base/nesting_limit.h"
#include "nn/dtype.h"

namespace ferry::runtime {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Top-level names of what transformers' save_pretrained writes for a causal LM's tokenizer
// (fast and slow), its chat templates and generation: the files to carry.
bool side_file(const std::string& name) {
  static const char* const kNames[] = {
      "config.json",        "generation_config.json", "tokenizer.json",          "tokenizer_config.json",
      "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",     "chat_template.json",
      "vocab.json",         "vocab.txt",              "merges.txt",              "tokenizer.model",
      "spiece.model",       "sentencepiece.bpe.model", "preprocessor_config.json", "processor_config.json"};
  for (const char* n : kNames)
    if (name == n) return true;
  return name.ends_with(".tiktoken");
}

}  // namespace

std::vector<std::string> hf_side_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file(ec) && side_file(name)) out.push_back(name);
  }
  // transformers 5 saves named templates other than the default one here.
  for (const fs::directory_entry& e : fs::directory_iterator(fs::path(dir) / "additional_chat_templates", ec)) {
    if (e.is_regular_file(ec) && e.path().extension() == ".jinja") {
      out.push_back("additional_chat_templates/" + e.path().filename().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// The weight files of the folder: the index's files in name order, or model.safetensors.
std::vector<std::string> weight_files(const std::string& dir) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    const json doc = base::parse_json<std::runtime_error>(in, index.string(), /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.is_object() || !doc.contains("weight_map") || !doc["weight_map"].is_object()) {
      throw std::runtime_error(index.string() + ": not a safetensors index (no weight_map object)");
    }
    std::set<std::string> files;
    for (const auto& [name, file] : doc["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {
        throw std::runtime_error(index.string() + ": weight_map['" + name + "'] must name a file in the folder");
      }
      files.insert(file.get<std::string>());
    }
    if (files.empty()) throw std::runtime_error(index.string() + ": weight_map is empty");
    std::vector<std::string> out;
    for (const std::string& f : files) out.push_back((fs::path(dir) / f).string());
    return out;
  }
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (!fs::exists(single)) {
    const bool torch_bin = fs::exists(fs::path(dir) / "pytorch_model.bin") ||
                           fs::exists(fs::path(dir) / "pytorch_model.bin.index.json");
    throw std::runtime_error(dir + ": no model.safetensors or model.safetensors.index.json" +
                             std::string(torch_bin ? " (only pytorch_model.bin: convert it to safetensors first, "
                                                     "e.g. save_pretrained(..., safe_serialization=True))"
                                                   : ""));
  }
  return {single.string()};
}

}  // namespace

HfWeights::HfWeights(const std::string& dir, const json& model, const std::vector<nn::UnitSpec>& layout)
    : dir_(dir), hf_(hf_layout(model, layout)), layout_(layout) {
  std::map<std::string, std::pair<SafetensorsReader*, const SafetensorsEntry*>> found;
  std::set<std::string> dtypes;
  for (const std::string& f : weight_files(dir)) {
    readers_.push_back(std::make_unique<SafetensorsReader>(f));
    SafetensorsReader* r = readers_.back().get();
    for (const SafetensorsEntry& e : r->entries()) {
      if (!found.emplace(e.name, std::make_pair(r, &e)).second) {
        throw std::runtime_error(f + ": tensor '" + e.name + "' is also in " + found[e.name].first->path());
      }
    }
  }
  std::set<std::string> used;
  unit_tensors_.resize(layout.size());
  for (size_t i = 0; i < hf_.tensors.size(); ++i) {
    const HfTensorMap& m = hf_.tensors[i];
    unit_tensors_[static_cast<size_t>(m.unit)].push_back(i);
    const std::string& ferry_name = layout[static_cast<size_t>(m.unit)].tensors[m.tensor].name;
    for (const HfPiece& p : m.pieces) {
      const SafetensorsEntry* e = nullptr;
      SafetensorsReader* r = nullptr;
      for (const std::string& spelling : hf_.spellings(p.name)) {
        if (const auto it = found.find(spelling); it != found.end()) {
          r = it->second.first;
          e = it->second.second;
          break;
        }
      }
      if (!e) {
        throw std::runtime_error(dir + ": tensor '" + p.name + "' is missing (ferry's " + ferry_name + " needs it; " +
                                 std::to_string(found.size()) + " tensors in " + std::to_string(readers_.size()) +
                                 " file(s))");
      }
      if (const auto qs = found.find(e->name + ".quant_state.bitsandbytes__nf4"); qs != found.end()) {
        if (!layout[static_cast<size_t>(m.unit)].tensors[m.tensor].quantized()) {
          throw std::runtime_error(r->path() + ": tensor '" + e->name + "' is bitsandbytes' NF4 state, for a base ferry "
                                   "keeps as values here: train on it with lora.base_dtype \"nf4\" (QLoRA)");
        }
        Nf4Source s;
        s.reader = r;
        s.weight = e;
        s.state = qs->second.second;
        const std::vector<int64_t> shape = m.piece_shape(p);
        s.rows = shape.at(0);
        s.cols = shape.size() > 1 ? shape[1] : 1;
        const auto part = [&](const char* suffix, bool required) -> const SafetensorsEntry* {
          const auto it = found.find(e->name + suffix);
          if (it == found.end()) {
            if (required) throw std::runtime_error(dir + ": tensor '" + e->name + suffix + "' is missing (the NF4 state of " + e->name + ")");
            return nullptr;
          }
          if (it->second.first != r) {
            throw std::runtime_error(it->second.first->path() + ": tensor '" + e->name + suffix + "' is not in " + r->path() +
                                     " with the rest of its NF4 state");
          }
          used.insert(it->first);
          return it->second.second;
        };
        s.absmax = part(".absmax", true);
        s.quant_map = part(".quant_map", true);
        s.nested_absmax = part(".nested_absmax", false);
        s.nested_quant_map = part(".nested_quant_map", false);
        used.insert(qs->first);
        used.insert(e->name);
        dtypes.insert("NF4 (bitsandbytes)");
        nf4_sources_[p.name] = s;
        continue;
      }
      if (e->shape != m.piece_shape(p)) {
        throw std::runtime_error(r->path() + ": tensor '" + e->name + "' has shape " + shape_text(e->shape) +
                                 " but the model of config.json needs " + shape_text(m.piece_shape(p)));
      }
      if (e->dtype != "F32" && e->dtype != "BF16" && e->dtype != "F16") {
        throw std::runtime_error(r->path() + ": tensor '" + e->name + "' is " + e->dtype +
                                 "; ferry loads F32, BF16 and F16 weights");
      }
      dtypes.insert(e->dtype);
      used.insert(e->name);
      sources_[p.name] = Source{r, e, safetensors_dtype_size(e->dtype)};
    }
  }
  for (const auto& [name, where] : found) {
    if (used.count(name) || hf_.ignorable(name)) continue;
    throw std::runtime_error(where.first->path() + ": tensor '" + name + "' has no place in ferry's " + hf_.arch +
                             " model (an architecture variant ferry does not compute?)");
  }
  for (const std::string& d : dtypes) dtypes_ += (dtypes_.empty() ? "" : ", ") + d;
}

HfWeights::~HfWeights() = default;

nlohmann::json HfWeights::file_fingerprints() const {
  nlohmann::json out = nlohmann::json::object();
  constexpr uint64_t kEnd = uint64_t{1} << 20;
  for (const auto& r : readers_) {
    const std::filesystem::path p(r->path());
    const uint64_t size = std::filesystem::file_size(p);
    std::ifstream in(p, std::ios::binary);
    std::vector<char> buf(static_cast<size_t>(std::min(size, kEnd)));
    uint32_t crc = 0;
    for (const uint64_t at : {uint64_t{0}, size > kEnd ? size - kEnd : uint64_t{0}}) {
      in.seekg(static_cast<std::streamoff>(at));
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      if (!in) throw std::runtime_error(p.string() + ": cannot read it back");
      crc = crc32c(buf.data(), buf.size(), crc);
    }
    out[p.filename().string()] = {{"bytes", size}, {"crc32c_ends", crc}};
  }
  return out;
}

std::string HfWeights::describe() const {
  return dir_ + " (" + std::to_string(readers_.size()) + " safetensors file" + (readers_.size() == 1 ? "" : "s") +
         ", " + dtypes_ + ")";
}

void HfWeights::convert(const Source& src, const void* bytes, int64_t n, float* out) const {
  const std::string& dt = src.entry->dtype;
  if (dt == "F32") {
    std::memcpy(out, bytes, static_cast<size_t>(n) * 4);
    return;
  }
  const auto* h = static_cast<const uint16_t*>(bytes);
  if (dt == "BF16") {
    for (int64_t i = 0; i < n; ++i) out[i] = nn::bf16_to_f32(h[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = nn::f16_to_f32(h[i]);
  }
}

// Ferry elements [a, b) of tensor m (tensor-relative, inside piece p) into dst[0, b - a).
void HfWeights::read_piece(const HfTensorMap& m, const HfPiece& p, const Source& src, int64_t a, int64_t b, float* dst) {
  const size_t ds = src.dsize;
  if (!p.transposed) {
    const int64_t first = a - p.row_begin * m.cols, n = b - a;
    bytes_.resize(static_cast<size_t>(n) * ds);
    src.reader->read_range(*src.entry, static_cast<uint64_t>(first) * ds, bytes_.size(), bytes_.data());
    bytes_read_ += bytes_.size();
    convert(src, bytes_.data(), n, dst);
    return;
  }
  // Stored [cols, rows]: ferry element r * cols + c is stored at c * rows + r. The ferry
  // rows r0..r1 touched are a contiguous run in each stored row c.
  const int64_t r0 = a / m.cols, r1 = (b - 1) / m.cols, run = r1 - r0 + 1;
  bytes_.resize(static_cast<size_t>(run) * ds);
  std::vector<float> vals(static_cast<size_t>(run));
  for (int64_t c = 0; c < m.cols; ++c) {
    src.reader->read_range(*src.entry, static_cast<uint64_t>(c * m.rows + r0) * ds, bytes_.size(), bytes_.data());
    bytes_read_ += bytes_.size();
    convert(src, bytes_.data(), run, vals.data());
    for (int64_t r = r0; r <= r1; ++r) {
      const int64_t e = r * m.cols + c;
      if (e >= a && e < b) dst[e - a] = vals[static_cast<size_t>(r - r0)];
    }
  }
}

void HfWeights::fill(int unit, int64_t begin, int64_t n, float* dst) {
  std::fill(dst, dst + n, 0.0f);
  const nn::UnitSpec& spec = layout_.at(static_cast<size_t>(unit));
  for (const size_t i : unit_tensors_.at(static_cast<size_t>(unit))) {
    const HfTensorMap& m = hf_.tensors[i];
    const nn::TensorSpec& t = spec.tensors[m.tensor];
    if (t.quantized()) continue;
    const int64_t lo = std::max(begin, t.offset), hi = std::min(begin + n, t.offset + t.numel());
    if (lo >= hi) continue;
    for (const HfPiece& p : m.pieces) {
      const int64_t pa = std::max(lo - t.offset, p.row_begin * m.cols);
      const int64_t pb = std::min(hi - t.offset, (p.row_begin + p.rows) * m.cols);
      if (pa >= pb) continue;
      read_piece(m, p, sources_.at(p.name), pa, pb, dst + (t.offset + pa - begin));
    }
  }
}

void HfWeights::read_rows(int unit, size_t tensor, int64_t row0, int64_t rows, float* dst) {
  for (const size_t i : unit_tensors_.at(static_cast<size_t>(unit))) {
    const HfTensorMap& m = hf_.tensors[i];
    if (m.tensor != tensor) continue;
    const int64_t lo = row0 * m.cols, hi = (row0 + rows) * m.cols;
    if (row0 < 0 || rows < 0 || row0 + rows > m.rows) {
      throw std::invalid_argument("HfWeights::read_rows: rows [" + std::to_string(row0) + ", +" + std::to_string(rows) +
                                  ") of a tensor of " + std::to_string(m.rows));
    }
    for (const HfPiece& p : m.pieces) {
      const int64_t pa = std::max(lo, p.row_begin * m.cols), pb = std::min(hi, (p.row_begin + p.rows) * m.cols);
      if (pa < pb) read_piece(m, p, sources_.at(p.name), pa, pb, dst + (pa - lo));
    }
    return;
  }
  throw std::invalid_argument("HfWeights::read_rows: tensor " + std::to_string(tensor) + " of unit " +
                              std::to_string(unit) + " has no Hugging Face source");
}

bool HfWeights::read_nf4(int unit, size_t tensor, int64_t row0, nn::Nf4Tensor* out) {
  for (const size_t i : unit_tensors_.at(static_cast<size_t>(unit))) {
    const HfTensorMap& m = hf_.tensors[i];
    if (m.tensor != tensor) continue;
    for (const HfPiece& p : m.pieces) {
      if (p.row_begin != row0) continue;
      const auto it = nf4_sources_.find(p.name);
      if (it == nf4_sources_.end()) return false;
      const Nf4Source& s = it->second;
      const std::string where = s.reader->path() + ": tensor '" + s.weight->name + "'";
      const auto fail = [&](const std::string& what) { throw std::runtime_error(where + "'s NF4 state: " + what); };
      const auto floats = [&](const SafetensorsEntry* e, size_t n, const char* what) {
        if (e->dtype != "F32" || e->end - e->begin != n * 4) fail(std::string(what) + " must be F32 of " + std::to_string(n) + " values");
        std::vector<float> v(n);
        s.reader->read_range(*e, 0, n * 4, v.data());
        return v;
      };
      const int64_t numel = s.rows * s.cols, blocks = (numel + nn::kNf4BlockSize - 1) / nn::kNf4BlockSize;
      // The quant_state: bitsandbytes' JSON, a few hundred bytes.
      if (s.state->dtype != "U8" || s.state->end - s.state->begin > 65536) fail("quant_state must be U8 JSON of at most 64 KiB");
      std::string text(static_cast<size_t>(s.state->end - s.state->begin), '\0');
      s.reader->read_range(*s.state, 0, text.size(), text.data());
      const json st = base::parse_json<std::runtime_error>(text, where + "'s quant_state", /*allow_exceptions=*/false);
      if (!st.is_object()) fail("quant_state is not a JSON object");
      const auto key = [&](const char* k) -> const json& {
        const auto f = st.find(k);
        if (f == st.end()) fail(std::string("quant_state has no '") + k + "'");
        return *f;
      };
      if (key("quant_type") != "nf4" || key("blocksize") != nn::kNf4BlockSize) fail("quant_state must be nf4 in blocks of 64");
      if (key("shape") != json::array({s.rows, s.cols})) {
        fail("quant_state's shape " + key("shape").dump() + " is not the model's [" + std::to_string(s.rows) + ", " +
             std::to_string(s.cols) + "]");
      }
      nn::Nf4Tensor q;
      q.numel = numel;
      if (s.weight->dtype != "U8" || s.weight->end - s.weight->begin != static_cast<uint64_t>((numel + 1) / 2)) {
        fail("the packed weight must be U8 of " + std::to_string((numel + 1) / 2) + " bytes");
      }
      q.packed.resize(static_cast<size_t>((numel + 1) / 2));
      s.reader->read_range(*s.weight, 0, q.packed.size(), q.packed.data());
      const std::vector<float> table = floats(s.quant_map, 16, "quant_map");
      for (size_t k = 0; k < 16; ++k) {
        if (table[k] != nn::kNf4Table[k]) fail("quant_map is not NF4's table (another 4-bit type?)");
      }
      q.double_quant = s.nested_absmax != nullptr;
      if (q.double_quant) {
        if (!s.nested_quant_map || key("nested_blocksize") != nn::kNf4NestedBlockSize || !key("nested_offset").is_number()) {
          fail("a double-quantized state needs nested_quant_map, nested_blocksize 256 and nested_offset");
        }
        if (s.absmax->dtype != "U8" || s.absmax->end - s.absmax->begin != static_cast<uint64_t>(blocks)) {
          fail("absmax must be U8 of " + std::to_string(blocks) + " codes");
        }
        q.absmax_code.resize(static_cast<size_t>(blocks));
        s.reader->read_range(*s.absmax, 0, q.absmax_code.size(), q.absmax_code.data());
        q.nested_absmax = floats(s.nested_absmax, static_cast<size_t>((blocks + nn::kNf4NestedBlockSize - 1) / nn::kNf4NestedBlockSize),
                                 "nested_absmax");
        q.code = floats(s.nested_quant_map, 256, "nested_quant_map");
        q.offset = key("nested_offset").get<float>();
      } else {
        q.absmax = floats(s.absmax, static_cast<size_t>(blocks), "absmax");
      }
      try {
        nn::nf4_check(q);
      } catch (const std::invalid_argument& e) {
        fail(e.what());
      }
      bytes_read_ += q.packed.size() + q.absmax_code.size() + 4 * (q.absmax.size() + q.nested_absmax.size() + q.code.size());
      *out = std::move(q);
      return true;
    }
  }
  return false;
}

}  // namespace ferry::runtime
