#include "runtime/ckpt/export.h"

#include <filesystem>
#include <stdexcept>
#include <vector>

#include "base/version.h"
#include "nn/dtype.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/ckpt/safetensors.h"

namespace ferry::runtime {

bool gpt2_conv1d_weight(const std::string& name) {
  return name.ends_with("attn.c_attn.weight") || name.ends_with("attn.c_proj.weight") ||
         name.ends_with("mlp.c_fc.weight") || name.ends_with("mlp.c_proj.weight");
}

ExportReport export_safetensors(const std::string& checkpoint, const std::string& out, const std::string& dtype) {
  if (dtype != "fp32" && dtype != "bf16") throw std::runtime_error("--dtype must be fp32 or bf16, got '" + dtype + "'");
  ExportReport rep;
  rep.checkpoint = std::filesystem::exists(std::filesystem::path(checkpoint) / "latest")
                       ? resolve_resume("auto", checkpoint)
                       : checkpoint;
  CheckpointReader reader(rep.checkpoint);
  rep.step = reader.step();
  const std::vector<nn::UnitSpec> layout = reader.layout();
  if (reader.manifest().contains("lora")) {
    throw CheckpointError(rep.checkpoint + " holds LoRA adapters, not a whole model: export them with --peft DIR, or "
                          "the merged model with --hf DIR --merge");
  }
  const bool bf16 = dtype == "bf16";
  std::vector<SafetensorsEntry> entries;
  for (const nn::UnitSpec& u : layout) {
    for (const nn::TensorSpec& t : u.tensors) {
      std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
      if (gpt2_conv1d_weight(t.name)) std::swap(shape[0], shape[1]);
      entries.push_back({t.name + (t.name == "wte" || t.name == "wpe" ? ".weight" : ""), bf16 ? "BF16" : "F32", shape});
    }
  }
  const nlohmann::json& model = reader.manifest().at("model");
  SafetensorsWriter writer(out, entries,
                           {{"format", "pt"},
                            {"producer", std::string("ferry ") + kVersion},
                            {"ferry_step", std::to_string(rep.step)},
                            {"ferry_model", model.dump()}});
  std::vector<CheckpointReader::Read> reads;
  for (int u = 0; u < static_cast<int>(layout.size()); ++u) reads.push_back({u, /*master*/ 0, 0, layout[static_cast<size_t>(u)].numel});
  reader.plan(reads);
  std::vector<float> unit_w, tensor_w;
  std::vector<uint16_t> half;
  size_t index = 0;
  for (int u = 0; u < static_cast<int>(layout.size()); ++u) {
    const nn::UnitSpec& spec = layout[static_cast<size_t>(u)];
    unit_w.resize(static_cast<size_t>(spec.numel));
    rep.largest_unit_bytes = std::max<uint64_t>(rep.largest_unit_bytes, unit_w.size() * 4);
    reader.read(u, /*master*/ 0, 0, spec.numel, unit_w.data());
    for (const nn::TensorSpec& t : spec.tensors) {
      const float* src = unit_w.data() + t.offset;
      const int64_t n = t.numel();
      if (gpt2_conv1d_weight(t.name)) {  // [out, in] -> [in, out]
        const int64_t rows = t.shape[0], cols = t.shape[1];
        tensor_w.resize(static_cast<size_t>(n));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) tensor_w[static_cast<size_t>(c * rows + r)] = src[r * cols + c];
        src = tensor_w.data();
      }
      if (bf16) {
        half.resize(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) half[static_cast<size_t>(i)] = nn::f32_to_bf16(src[i]);
        writer.write(index++, half.data(), half.size() * 2);
      } else {
        writer.write(index++, src, static_cast<size_t>(n) * 4);
      }
      rep.parameters += n;
      ++rep.tensors;
    }
  }
  writer.finish();
  rep.bytes = writer.entries().empty() ? 0 : writer.entries().back().end;
  return rep;
}

}  // namespace ferry::runtime
