#include "runtime/hf/peft.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>

#include "base/nesting_limit.h"
#include "base/posix_file.h"
#include "base/version.h"
#include "nn/dtype.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/ckpt/safetensors.h"
#include "runtime/config/config.h"
#include "runtime/hf/hf_tensors.h"
#include "runtime/hf/hf_weights.h"

namespace ferry::runtime {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kPrefix = "base_model.model.";

std::vector<float> to_f32(const std::string& dtype, const std::vector<char>& bytes, const std::string& what) {
  std::vector<float> out;
  if (dtype == "F32") {
    out.resize(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), out.size() * 4);
  } else if (dtype == "BF16" || dtype == "F16") {
    out.resize(bytes.size() / 2);
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t h = 0;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      out[i] = dtype == "BF16" ? nn::bf16_to_f32(h) : nn::f16_to_f32(h);
    }
  } else {
    throw std::runtime_error(what + " is " + dtype + "; adapters are read in F32, BF16 or F16");
  }
  return out;
}

// The modules saved in full: trainable tensors that are not adapters, with their Hugging
// Face pieces (one each: nn/lora.h refuses a piece of a packed projection).
struct Saved {
  int unit = 0;
  size_t tensor = 0;
  HfPiece piece;
  int64_t rows = 0, cols = 1;
  std::vector<int64_t> shape;  // as the Hugging Face file stores it
};
std::vector<Saved> saved_modules(const json& model, const std::vector<nn::UnitSpec>& layout) {
  std::vector<Saved> out;
  const HfLayout hfl = hf_layout(model, layout);
  for (const HfTensorMap& m : hfl.tensors) {
    const nn::TensorSpec& t = layout.at(static_cast<size_t>(m.unit)).tensors.at(m.tensor);
    if (!t.trainable) continue;
    for (const HfPiece& p : m.pieces) out.push_back({m.unit, m.tensor, p, m.rows, m.cols, m.piece_shape(p)});
  }
  return out;
}

const nn::TensorSpec& tensor_named(const nn::UnitSpec& u, const std::string& name, const std::string& where) {
  for (const nn::TensorSpec& t : u.tensors)
    if (t.name == name) return t;
  throw std::runtime_error(where + ": unit " + u.name + " has no tensor " + name);
}

}  // namespace

std::string peft_adapter_name(const std::string& module, bool b) {
  return kPrefix + module + (b ? ".lora_B.weight" : ".lora_A.weight");
}
std::string peft_saved_name(const std::string& hf_tensor) { return kPrefix + hf_tensor; }

json adapters_json(const std::vector<nn::LoraAdapter>& adapters, const std::vector<nn::UnitSpec>& layout) {
  json out = json::array();
  for (const nn::LoraAdapter& a : adapters) {
    const nn::UnitSpec& u = layout.at(static_cast<size_t>(a.unit));
    out.push_back({{"module", a.module},
                   {"unit", a.unit},
                   {"base", u.tensors.at(a.base).name},
                   {"row0", a.row0},
                   {"rows", a.rows},
                   {"a", u.tensors.at(a.a).name},
                   {"b", u.tensors.at(a.b).name}});
  }
  return out;
}

PeftWeights::PeftWeights(const std::string& dir, const json& model, const std::vector<nn::UnitSpec>& layout,
                         const std::vector<nn::LoraAdapter>& adapters)
    : path_((fs::path(dir) / "adapter_model.safetensors").string()) {
  if (!fs::exists(path_)) {
    const bool pickle = fs::exists(fs::path(dir) / "adapter_model.bin");
    throw std::runtime_error(dir + ": no adapter_model.safetensors" +
                             (pickle ? std::string(" (adapter_model.bin is a pickle, which ferry does not read: save "
                                                   "the adapter with safe_serialization=True)")
                                     : std::string()));
  }
  reader_ = std::make_unique<SafetensorsReader>(path_);
  for (const nn::LoraAdapter& a : adapters) {
    const nn::UnitSpec& u = layout.at(static_cast<size_t>(a.unit));
    sources_.push_back({a.unit, u.tensors.at(a.a).offset, a.r, a.in, false, peft_adapter_name(a.module, false), {a.r, a.in}});
    sources_.push_back({a.unit, u.tensors.at(a.b).offset, a.rows, a.r, false, peft_adapter_name(a.module, true), {a.rows, a.r}});
  }
  for (const Saved& s : saved_modules(model, layout)) {
    const nn::TensorSpec& t = layout.at(static_cast<size_t>(s.unit)).tensors.at(s.tensor);
    sources_.push_back({s.unit, t.offset + s.piece.row_begin * s.cols, s.piece.rows, s.cols, s.piece.transposed,
                        peft_saved_name(s.piece.name), s.shape});
  }
  std::set<std::string> wanted;
  for (const Source& s : sources_) {
    wanted.insert(s.name);
    const SafetensorsEntry* e = nullptr;
    for (const SafetensorsEntry& x : reader_->entries())
      if (x.name == s.name) e = &x;
    if (!e) {
      throw std::runtime_error(path_ + ": no tensor " + s.name + " (the run's lora.target_modules and "
                               "lora.modules_to_save must be the adapter's)");
    }
    if (e->dtype != "F32" && e->dtype != "BF16" && e->dtype != "F16") {
      throw std::runtime_error(path_ + ": " + s.name + " is " + e->dtype + "; adapters are read in F32, BF16 or F16");
    }
    const std::vector<int64_t>& shape = s.shape;
    if (e->shape != shape) {
      throw std::runtime_error(path_ + ": " + s.name + " is " + nn::shape_str(e->shape) + ", the run's is " +
                               nn::shape_str(shape) + " (another r, or another base model)");
    }
  }
  for (const SafetensorsEntry& x : reader_->entries()) {
    if (!wanted.count(x.name)) {
      throw std::runtime_error(path_ + ": holds " + x.name + ", which this run has no place for (another "
                               "lora.target_modules or lora.modules_to_save, or another base model)");
    }
  }
}

PeftWeights::~PeftWeights() = default;

void PeftWeights::fill(int unit, int64_t begin, int64_t n, float* dst) {
  for (const Source& s : sources_) {
    if (s.unit != unit) continue;
    const int64_t lo = std::max(begin, s.offset), hi = std::min(begin + n, s.offset + s.rows * s.cols);
    if (lo >= hi) continue;
    const SafetensorsEntry* e = nullptr;
    for (const SafetensorsEntry& x : reader_->entries())
      if (x.name == s.name) e = &x;
    // Only the bytes [lo, hi) needs (pread): a rank's share of a module saved in full (an
    // embedding of 128k rows) is read, not the whole module.
    const uint64_t esize = e->dtype == "F32" ? 4 : 2;
    auto read = [&](int64_t first, int64_t count) {
      std::vector<char> bytes(static_cast<size_t>(count) * esize);
      reader_->read_range(*e, static_cast<uint64_t>(first) * esize, bytes.size(), bytes.data());
      return to_f32(e->dtype, bytes, path_ + ": " + s.name);
    };
    const int64_t i0 = lo - s.offset, i1 = hi - s.offset;
    if (!s.transposed) {
      const std::vector<float> v = read(i0, i1 - i0);
      std::copy(v.begin(), v.end(), dst + (lo - begin));
      continue;
    }
    // Stored [cols, rows]: rows r0..r1 of ours are one run of each row of the file.
    const int64_t r0 = i0 / s.cols, r1 = (i1 - 1) / s.cols;
    for (int64_t col = 0; col < s.cols; ++col) {
      const std::vector<float> v = read(col * s.rows + r0, r1 - r0 + 1);
      for (int64_t r = r0; r <= r1; ++r) {
        const int64_t i = r * s.cols + col;
        if (i >= i0 && i < i1) dst[s.offset + i - begin] = v[static_cast<size_t>(r - r0)];
      }
    }
  }
}

void check_adapter_base(const json& manifest, const HfWeights& base, const std::string& checkpoint) {
  const json saved = manifest.at("lora").value("base_files", json::object()), now = base.file_fingerprints();
  for (const auto& [name, print] : saved.items()) {
    const std::string here = (fs::path(base.dir()) / name).string();
    if (!now.contains(name) || now.at(name) != print) {
      throw CheckpointError(checkpoint + ": its adapters were trained on a base whose " + name + " was " + print.dump() +
                            "; " + here + (now.contains(name) ? " is " + now.at(name).dump() : std::string(" is not there")) +
                            " (another base model: give the one the run started from)");
    }
  }
}

void merge_adapters(const json& manifest, const std::vector<nn::UnitSpec>& layout, int unit, float* unit_w) {
  const json& lora = manifest.at("lora");
  const double scale = lora.at("scale").get<double>();
  const nn::UnitSpec& u = layout.at(static_cast<size_t>(unit));
  for (const json& a : lora.at("adapters")) {
    if (a.at("unit").get<int>() != unit) continue;
    const nn::TensorSpec& w = tensor_named(u, a.at("base").get<std::string>(), "the manifest's adapters");
    const nn::TensorSpec& ta = tensor_named(u, a.at("a").get<std::string>(), "the manifest's adapters");
    const nn::TensorSpec& tb = tensor_named(u, a.at("b").get<std::string>(), "the manifest's adapters");
    const int64_t r = ta.shape.at(0), in = ta.shape.at(1), row0 = a.at("row0").get<int64_t>();
    const int64_t rows = tb.shape.at(0);
    if (w.shape.size() != 2 || w.shape[1] != in || row0 < 0 || row0 + rows > w.shape[0]) {
      throw std::runtime_error("the manifest's adapter " + a.at("module").get<std::string>() + " does not fit " + w.name);
    }
    // W[row0 + i, j] += scale sum_k B[i, k] A[k, j], summed in double.
    const float* A = unit_w + ta.offset;
    const float* B = unit_w + tb.offset;
    float* W = unit_w + w.offset;
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < in; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < r; ++k) acc += static_cast<double>(B[i * r + k]) * A[k * in + j];
        W[(row0 + i) * in + j] = static_cast<float>(W[(row0 + i) * in + j] + scale * acc);
      }
    }
  }
}

PeftExportReport export_peft(const std::string& checkpoint, const std::string& out, const std::string& dtype) {
  if (dtype != "fp32" && dtype != "bf16" && dtype != "fp16") {
    throw std::runtime_error("--dtype must be fp32, bf16 or fp16, got '" + dtype + "'");
  }
  PeftExportReport rep;
  rep.checkpoint = fs::exists(fs::path(checkpoint) / "latest") ? resolve_resume("auto", checkpoint) : checkpoint;
  CheckpointReader reader(rep.checkpoint);
  rep.step = reader.step();
  const json& manifest = reader.manifest();
  if (!manifest.contains("lora")) {
    throw CheckpointError(rep.checkpoint + " holds a full fine-tune (no adapters): export it with --hf");
  }
  const json& model = manifest.at("model");
  const json& opts = model.at("lora");
  const std::vector<nn::UnitSpec> layout = reader.layout();
  // What goes out: every adapter's A and B, and every module saved in full.
  struct Out {
    int unit;
    int64_t offset, rows, cols;
    bool transposed;
    std::string name;
    std::vector<int64_t> shape;
  };
  std::vector<Out> outs;
  std::vector<std::string> modules;
  for (const json& a : manifest.at("lora").at("adapters")) {
    const int u = a.at("unit").get<int>();
    const nn::UnitSpec& spec = layout.at(static_cast<size_t>(u));
    const nn::TensorSpec& ta = tensor_named(spec, a.at("a").get<std::string>(), rep.checkpoint);
    const nn::TensorSpec& tb = tensor_named(spec, a.at("b").get<std::string>(), rep.checkpoint);
    const std::string module = a.at("module").get<std::string>();
    modules.push_back(module);
    outs.push_back({u, ta.offset, ta.shape.at(0), ta.shape.at(1), false, peft_adapter_name(module, false), ta.shape});
    outs.push_back({u, tb.offset, tb.shape.at(0), tb.shape.at(1), false, peft_adapter_name(module, true), tb.shape});
  }
  for (const Saved& s : saved_modules(model, layout)) {
    const nn::TensorSpec& t = layout.at(static_cast<size_t>(s.unit)).tensors.at(s.tensor);
    outs.push_back({s.unit, t.offset + s.piece.row_begin * s.cols, s.piece.rows, s.cols, s.piece.transposed,
                    peft_saved_name(s.piece.name), s.shape});
  }
  std::stable_sort(outs.begin(), outs.end(), [](const Out& a, const Out& b) { return a.unit < b.unit; });
  const size_t esize = dtype == "fp32" ? 4 : 2;
  const std::string st = dtype == "fp32" ? "F32" : dtype == "bf16" ? "BF16" : "F16";
  std::vector<SafetensorsEntry> entries;
  for (const Out& o : outs) entries.push_back({o.name, st, o.shape});
  // adapter_config.json: what peft's LoraConfig needs to rebuild the same adapters.
  json targets = json::array();
  {
    std::set<std::string> leaves;
    for (const std::string& m : modules) leaves.insert(m.substr(m.rfind('.') + 1));
    // Leaf names when they name exactly the adapted modules (peft's own short form), else
    // the full module names (GPT-2's c_proj is two modules, maybe one of them adapted).
    std::set<std::string> all_with_leaf;
    const HfLayout hfl = hf_layout(model, layout);
    for (const HfTensorMap& m : hfl.tensors) {
      for (const HfPiece& p : m.pieces) {
        const std::string mod = p.name.substr(0, p.name.rfind('.'));
        if (leaves.count(mod.substr(mod.rfind('.') + 1))) all_with_leaf.insert(mod);
      }
    }
    const std::set<std::string> adapted(modules.begin(), modules.end());
    if (all_with_leaf == adapted) {
      for (const std::string& l : leaves) targets.push_back(l);
    } else {
      for (const std::string& m : adapted) targets.push_back(m);
    }
  }
  const std::string arch = model.at("arch").get<std::string>();
  json config = {{"peft_type", "LORA"},
                 {"task_type", "CAUSAL_LM"},
                 {"base_model_name_or_path", manifest.at("lora").value("base", "")},
                 {"r", opts.at("r")},
                 {"lora_alpha", opts.at("lora_alpha")},
                 {"lora_dropout", 0.0},
                 {"use_rslora", opts.at("use_rslora")},
                 {"target_modules", targets},
                 {"modules_to_save", opts.contains("modules_to_save") ? opts.at("modules_to_save") : json(nullptr)},
                 {"bias", "none"},
                 {"fan_in_fan_out", arch == "gpt2"},
                 {"init_lora_weights", true},
                 {"inference_mode", true},
                 {"use_dora", false},
                 {"rank_pattern", json::object()},
                 {"alpha_pattern", json::object()},
                 {"layers_to_transform", nullptr},
                 {"layers_pattern", nullptr},
                 {"revision", nullptr}};
  fs::create_directories(out);
  write_file_atomic((fs::path(out) / "adapter_config.json").string(), config.dump(2) + "\n");
  SafetensorsWriter w((fs::path(out) / "adapter_model.safetensors").string(), entries,
                      {{"format", "pt"}, {"producer", std::string("ferry ") + kVersion},
                       {"ferry_step", std::to_string(rep.step)}});
  std::vector<float> unit_w, piece;
  std::vector<uint16_t> half;
  int loaded = -1;
  for (size_t i = 0; i < outs.size(); ++i) {
    const Out& o = outs[i];
    if (o.unit != loaded) {
      const int64_t n = layout[static_cast<size_t>(o.unit)].trainable_numel;
      unit_w.assign(static_cast<size_t>(n), 0.0f);
      reader.read(o.unit, /*master*/ 0, 0, n, unit_w.data());
      loaded = o.unit;
    }
    const int64_t n = o.rows * o.cols;
    if (o.offset + n > static_cast<int64_t>(unit_w.size())) {
      throw CheckpointError(rep.checkpoint + ": " + o.name + " lies outside the unit's trained span");
    }
    const float* src = unit_w.data() + o.offset;
    if (o.transposed) {
      piece.resize(static_cast<size_t>(n));
      for (int64_t r = 0; r < o.rows; ++r)
        for (int64_t c = 0; c < o.cols; ++c) piece[static_cast<size_t>(c * o.rows + r)] = src[r * o.cols + c];
      src = piece.data();
    }
    if (esize == 4) {
      w.write(i, src, static_cast<size_t>(n) * 4);
    } else {
      half.resize(static_cast<size_t>(n));
      for (int64_t k = 0; k < n; ++k) half[static_cast<size_t>(k)] = dtype == "bf16" ? nn::f32_to_bf16(src[k]) : nn::f32_to_f16(src[k]);
      w.write(i, half.data(), half.size() * 2);
    }
    rep.parameters += n;
    ++rep.tensors;
  }
  w.finish();
  return rep;
}

}  // namespace ferry::runtime
