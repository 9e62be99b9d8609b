#include "runtime/hf/hf_tensors.h"

#include <algorithm>
#include <stdexcept>
#include <string_view>

#include "nn/arch.h"
#include "nn/lora.h"

namespace ferry::runtime {

namespace {

// `name` matched against a registry pattern ("layers.{l}.attention.wo.weight"): true with
// `layer` set to the digits standing for "{l}" ("" for a pattern without one).
bool matches(std::string_view pattern, const std::string& name, std::string& layer) {
  const size_t at = pattern.find("{l}");
  if (at == std::string_view::npos) {
    layer.clear();
    return pattern == name;
  }
  const std::string_view head = pattern.substr(0, at), tail = pattern.substr(at + 3);
  if (name.size() <= head.size() + tail.size() || !name.starts_with(head) || !name.ends_with(tail)) return false;
  layer = name.substr(head.size(), name.size() - head.size() - tail.size());
  return std::all_of(layer.begin(), layer.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

std::string with_layer(std::string_view pattern, const std::string& layer) {
  std::string out(pattern);
  if (const size_t at = out.find("{l}"); at != std::string::npos) out.replace(at, 3, layer);
  return out;
}

// Fills m.pieces from the registry row that names `name`.
void pieces(HfTensorMap& m, const std::string& name, const nn::Arch& arch, int64_t q_rows, int64_t kv_rows,
            int64_t inter) {
  std::string layer;
  for (const nn::HfTensorName& row : *arch.hf_tensors) {
    if (!matches(row.ferry, name, layer)) continue;
    auto piece = [&](size_t i, int64_t begin, int64_t rows) {
      m.pieces.push_back({with_layer(row.hf.at(i), layer), begin, rows, row.split == nn::HfSplit::transposed});
    };
    switch (row.split) {
      case nn::HfSplit::whole:
      case nn::HfSplit::transposed:
        piece(0, 0, m.rows);
        break;
      case nn::HfSplit::qkv:
        piece(0, 0, q_rows);
        piece(1, q_rows, kv_rows);
        piece(2, q_rows + kv_rows, kv_rows);
        break;
      case nn::HfSplit::gate_up:
        piece(0, 0, inter);
        piece(1, inter, inter);
        break;
    }
    return;
  }
  throw std::runtime_error("hf_layout: no Hugging Face name for '" + name + "' in " + std::string(arch.name));
}

}  // namespace

std::vector<int64_t> HfTensorMap::piece_shape(const HfPiece& p) const {
  if (p.transposed) return {cols, rows};
  if (one_dim) return {p.rows};
  return {p.rows, cols};
}

bool HfLayout::ignorable(const std::string& n) const {
  for (std::string_view suffix : nn::arch(arch).hf_ignored_suffixes)
    if (n.ends_with(suffix)) return true;
  return tied && n == "lm_head.weight";
}

std::vector<std::string> HfLayout::spellings(const std::string& n) const {
  const std::string_view prefix = nn::arch(arch).hf_optional_prefix;
  if (!prefix.empty() && n.starts_with(prefix)) return {n, n.substr(prefix.size())};
  return {n};
}

HfLayout hf_layout(const nlohmann::json& model, const std::vector<nn::UnitSpec>& layout) {
  HfLayout out;
  out.arch = model.at("arch").get<std::string>();
  const nn::Arch* arch = nn::find_arch(out.arch);
  if (!arch || !arch->hf_tensors) throw std::runtime_error("model.arch '" + out.arch + "' has no Hugging Face form");
  out.tied = arch->always_tied || model.value("tie_word_embeddings", false);
  int64_t q_rows = 0, kv_rows = 0, inter = 0;
  if (arch->family == nn::ArchFamily::llama) {
    // The head size as the layout has it (Qwen3's may differ from n_embd / n_head; a
    // checkpoint's manifest records only the shape keys, the layout has the rest).
    const int64_t C = model.at("n_embd").get<int64_t>(), NH = model.at("n_head").get<int64_t>();
    const int64_t KVH = model.at("n_kv_head").get<int64_t>();
    int64_t hd = C / NH;
    for (const nn::UnitSpec& u : layout)
      for (const nn::TensorSpec& t : u.tensors)
        if (t.name.ends_with(".attention.wqkv.weight")) hd = t.shape.at(0) / (NH + 2 * KVH);
    out.head_dim = hd;
    q_rows = NH * hd;
    kv_rows = KVH * hd;
    inter = model.at("intermediate_size").get<int64_t>();
  }
  for (size_t u = 0; u < layout.size(); ++u) {
    for (size_t i = 0; i < layout[u].tensors.size(); ++i) {
      const nn::TensorSpec& t = layout[u].tensors[i];
      if (nn::is_lora_tensor(t.name)) continue;  // adapters live in PEFT folders (runtime/hf/peft.h)
      HfTensorMap m;
      m.unit = static_cast<int>(u);
      m.tensor = i;
      m.rows = t.shape.at(0);
      m.one_dim = t.shape.size() == 1;
      m.cols = m.one_dim ? 1 : t.shape.at(1);
      pieces(m, t.name, *arch, q_rows, kv_rows, inter);
      out.tensors.push_back(std::move(m));
    }
  }
  return out;
}

}  // namespace ferry::runtime
