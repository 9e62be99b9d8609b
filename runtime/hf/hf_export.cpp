#include "runtime/hf/hf_export.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/nesting_limit.h"
#include "base/posix_file.h"
#include "base/version.h"
#include "nn/dtype.h"
#include "nn/nf4.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/ckpt/safetensors.h"
#include "runtime/config/hf_config.h"
#include "runtime/hf/hf_tensors.h"
#include "runtime/hf/hf_weights.h"
#include "runtime/hf/peft.h"

namespace ferry::runtime {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The frozen base of unit u in `values`'s layout (every tensor as values) from a folder
// opened with the checkpoint's own layout `stored`. A QLoRA base (TensorSpec::nf4) becomes
// what training multiplied by: the folder's NF4 state where bitsandbytes saved one, else its
// values rounded to the compute dtype (the manifest's quantized_from) and quantized as the
// run did (nn::Model::quantized_bytes), then dequantized. Merging into the folder's own
// values instead would give a model that computes something the adapters were not trained
// with. Trained tensors are left to the checkpoint.
void base_values(const json& lora, HfWeights& base, const nn::UnitSpec& stored, const nn::UnitSpec& values, int u,
                 float* unit_w) {
  std::fill(unit_w, unit_w + values.numel, 0.0f);
  const std::string from = lora.value("quantized_from", "bf16");
  for (size_t i = 0; i < stored.tensors.size(); ++i) {
    const nn::TensorSpec& t = stored.tensors[i];
    if (t.trainable) continue;
    float* w = unit_w + values.tensors.at(i).offset;
    if (!t.quantized()) {
      base.read_rows(u, i, 0, t.shape.at(0), w);
      continue;
    }
    for (const nn::Nf4Piece& p : t.nf4) {
      float* piece = w + p.row0 * p.layout.cols;
      nn::Nf4Tensor q;
      if (!base.read_nf4(u, i, p.row0, &q)) {
        base.read_rows(u, i, p.row0, p.layout.rows, piece);
        const int64_t n = p.layout.numel();
        for (int64_t k = 0; k < n; ++k) {
          piece[k] = from == "fp16" ? nn::f16_to_f32(nn::f32_to_f16(piece[k])) : nn::bf16_to_f32(nn::f32_to_bf16(piece[k]));
        }
        q = nn::nf4_quantize(piece, n, p.layout.double_quant, nullptr, nullptr);
      }
      nn::nf4_dequantize(q, piece);
    }
  }
}

struct OutTensor {
  size_t map = 0, piece = 0;  // HfLayout::tensors[map].pieces[piece]
  int file = 0;
  size_t index = 0;           // in its file's entries
};

std::string torch_dtype(const std::string& d) { return d == "fp32" ? "float32" : d == "bf16" ? "bfloat16" : "float16"; }

json read_json(const fs::path& p) {
  std::ifstream in(p);
  json j = base::parse_json<std::runtime_error>(in, p.string(), /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw std::runtime_error(p.string() + ": not a JSON object");
  return j;
}

}  // namespace

HfExportReport export_hf(const std::string& checkpoint, const std::string& out, const std::string& dtype,
                         uint64_t max_shard_bytes, bool merge, const std::string& base) {
  if (dtype != "fp32" && dtype != "bf16" && dtype != "fp16") {
    throw std::runtime_error("--dtype must be fp32, bf16 or fp16, got '" + dtype + "'");
  }
  if (max_shard_bytes == 0) throw std::runtime_error("--max-shard-size must be positive");
  HfExportReport rep;
  rep.checkpoint = fs::exists(fs::path(checkpoint) / "latest") ? resolve_resume("auto", checkpoint) : checkpoint;
  CheckpointReader reader(rep.checkpoint);
  rep.step = reader.step();
  // A QLoRA checkpoint's units hold NF4 blobs: the export reads values, at their extents.
  const std::vector<nn::UnitSpec> stored = reader.layout();
  std::vector<nn::UnitSpec> layout;
  for (const nn::UnitSpec& u : stored) layout.push_back(u.with_values());
  const json& model = reader.manifest().at("model");
  const HfLayout hfl = hf_layout(model, layout);
  const bool adapters = reader.manifest().contains("lora");
  if (adapters && !merge) {
    throw CheckpointError(rep.checkpoint + " holds LoRA adapters, not a whole model: export them with --peft DIR, or "
                          "the merged model with --hf DIR --merge (the base read from the folder the run started from)");
  }
  if (!adapters && merge) throw CheckpointError(rep.checkpoint + " holds a full fine-tune: --merge is for adapters");
  std::unique_ptr<HfWeights> base_weights;
  if (adapters) {
    const std::string from = !base.empty() ? base : reader.manifest().at("lora").value("base", "");
    if (from.empty() || !fs::exists(fs::path(from) / "config.json")) {
      throw std::runtime_error("--merge needs the base model folder: " +
                               (from.empty() ? std::string("the checkpoint names none") : from + " has no config.json") +
                               "; give it with --base DIR");
    }
    base_weights = std::make_unique<HfWeights>(from, model, stored);
    check_adapter_base(reader.manifest(), *base_weights, rep.checkpoint);
  }
  rep.architecture = hf_architecture(hfl.arch);
  if (fs::exists(fs::path(out) / "model.safetensors") || fs::exists(fs::path(out) / "model.safetensors.index.json")) {
    throw std::runtime_error(out + ": already holds a model; choose an empty folder");
  }
  fs::create_directories(out);

  // Which file each tensor goes to: in order, a new shard when the next tensor would pass
  // the limit (a tensor larger than the limit gets a shard of its own, as transformers does).
  const size_t esize = dtype == "fp32" ? 4 : 2;
  const std::string st_dtype = dtype == "fp32" ? "F32" : dtype == "bf16" ? "BF16" : "F16";
  std::vector<OutTensor> order;
  std::vector<std::vector<SafetensorsEntry>> files(1);
  uint64_t in_file = 0;
  for (size_t m = 0; m < hfl.tensors.size(); ++m) {
    const HfTensorMap& tm = hfl.tensors[m];
    for (size_t p = 0; p < tm.pieces.size(); ++p) {
      const std::vector<int64_t> shape = tm.piece_shape(tm.pieces[p]);
      uint64_t bytes = esize;
      for (int64_t d : shape) bytes *= static_cast<uint64_t>(d);
      if (in_file > 0 && in_file + bytes > max_shard_bytes) {
        files.emplace_back();
        in_file = 0;
      }
      in_file += bytes;
      files.back().push_back({tm.pieces[p].name, st_dtype, shape});
      order.push_back({m, p, static_cast<int>(files.size() - 1), files.back().size() - 1});
    }
  }
  const int nfiles = static_cast<int>(files.size());
  auto file_name = [&](int f) {
    if (nfiles == 1) return std::string("model.safetensors");
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", f + 1, nfiles);
    return std::string(buf);
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                   {"producer", std::string("ferry ") + kVersion},
                                                   {"ferry_step", std::to_string(rep.step)}};
  std::vector<std::unique_ptr<SafetensorsWriter>> writers;
  for (int f = 0; f < nfiles; ++f) {
    writers.push_back(std::make_unique<SafetensorsWriter>((fs::path(out) / file_name(f)).string(),
                                                          files[static_cast<size_t>(f)], meta));
  }

  std::vector<CheckpointReader::Read> reads;
  for (int u = 0; u < static_cast<int>(layout.size()); ++u) {
    const int64_t n = adapters ? layout[static_cast<size_t>(u)].trainable_numel : layout[static_cast<size_t>(u)].numel;
    if (n > 0) reads.push_back({u, /*master*/ 0, 0, n});
  }
  reader.plan(reads);
  std::vector<float> unit_w, piece_w;
  std::vector<uint16_t> half;
  size_t next = 0;  // order is unit-major, as the layout
  for (int u = 0; u < static_cast<int>(layout.size()); ++u) {
    const nn::UnitSpec& spec = layout[static_cast<size_t>(u)];
    unit_w.resize(static_cast<size_t>(spec.numel));
    rep.largest_unit_bytes = std::max<uint64_t>(rep.largest_unit_bytes, unit_w.size() * 4);
    if (base_weights) {
      // The base, then the trained span over it (adapters, modules saved in full), merged.
      base_values(reader.manifest().at("lora"), *base_weights, stored[static_cast<size_t>(u)], spec, u, unit_w.data());
      if (spec.trainable_numel > 0) reader.read(u, /*master*/ 0, 0, spec.trainable_numel, unit_w.data());
      merge_adapters(reader.manifest(), layout, u, unit_w.data());
    } else {
      reader.read(u, /*master*/ 0, 0, spec.numel, unit_w.data());
    }
    for (; next < order.size() && hfl.tensors[order[next].map].unit == u; ++next) {
      const OutTensor& o = order[next];
      const HfTensorMap& tm = hfl.tensors[o.map];
      const HfPiece& p = tm.pieces[o.piece];
      const float* src = unit_w.data() + spec.tensors[tm.tensor].offset + p.row_begin * tm.cols;
      const int64_t n = p.rows * tm.cols;
      if (p.transposed) {  // ferry [rows, cols] -> stored [cols, rows]
        piece_w.resize(static_cast<size_t>(n));
        for (int64_t r = 0; r < tm.rows; ++r)
          for (int64_t c = 0; c < tm.cols; ++c) piece_w[static_cast<size_t>(c * tm.rows + r)] = src[r * tm.cols + c];
        src = piece_w.data();
      }
      SafetensorsWriter& w = *writers[static_cast<size_t>(o.file)];
      if (dtype == "fp32") {
        w.write(o.index, src, static_cast<size_t>(n) * 4);
      } else {
        half.resize(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i)
          half[static_cast<size_t>(i)] = dtype == "bf16" ? nn::f32_to_bf16(src[i]) : nn::f32_to_f16(src[i]);
        w.write(o.index, half.data(), half.size() * 2);
      }
      rep.parameters += n;
      rep.bytes += static_cast<uint64_t>(n) * esize;
      ++rep.tensors;
    }
  }
  // What transformers looks for comes last: config.json and the side files first, then the
  // weights renamed into place, then (sharded) the index. An export that fails on the way
  // leaves no model.safetensors or index behind (the writers remove their .tmp files), so
  // the folder is never taken for a whole model and a retry into it is allowed.
  rep.files = nfiles;
  // config.json: the source's, with ferry's shape keys written over it, or ferry's alone.
  const fs::path carried = fs::path(rep.checkpoint) / "hf";
  json shape = model;  // the head size from the layout where the manifest has none (Qwen3's own head_dim)
  if (hfl.head_dim > 0 && !shape.contains("head_dim")) shape["head_dim"] = hfl.head_dim;
  json config = hf_config_json(shape, torch_dtype(dtype));
  if (fs::exists(carried / "config.json")) {
    json source = read_json(carried / "config.json");
    source.erase("rope_parameters");  // 5.x spelling: the 4.x keys below say the same
    if (source.contains("dtype")) source["dtype"] = torch_dtype(dtype);
    source.update(config);
    config = source;
  } else {
    // No tokenizer came with the run: no token ids to claim (GPT2Config would default to
    // 50256, outside a byte-level vocabulary).
    config["bos_token_id"] = nullptr;
    config["eos_token_id"] = nullptr;
  }
  write_file_atomic((fs::path(out) / "config.json").string(), config.dump(2) + "\n");
  // Every file the run carried (hf_side_files: tokenizer, chat templates, generation), as it
  // was: a fine-tuned chat model comes back with its chat format.
  std::vector<fs::path> side;
  if (fs::is_directory(carried)) {
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(carried)) {
      if (e.is_regular_file() && e.path() != carried / "config.json") side.push_back(e.path().lexically_relative(carried));
    }
  }
  std::sort(side.begin(), side.end());
  for (const fs::path& f : side) {
    fs::create_directories((fs::path(out) / f).parent_path());
    copy_file_atomic((carried / f).string(), (fs::path(out) / f).string());
    rep.carried.push_back(f.string());
  }
  for (auto& w : writers) w->finish();
  if (nfiles > 1) {
    json index = {{"metadata", {{"total_size", rep.bytes}}}, {"weight_map", json::object()}};
    for (const OutTensor& o : order) {
      index["weight_map"][hfl.tensors[o.map].pieces[o.piece].name] = file_name(o.file);
    }
    const std::string path = (fs::path(out) / "model.safetensors.index.json").string();
    try {
      write_file_atomic(path, index.dump(2) + "\n");
    } catch (...) {  // renamed but the folder's sync failed: not a model until a retry succeeds
      std::error_code ignored;
      fs::remove(path, ignored);
      throw;
    }
  }
  return rep;
}

}  // namespace ferry::runtime
