#include "runtime/hf/hf_tensors.h"

#include <stdexcept>

namespace ferry::runtime {

namespace {

bool conv1d(const std::string& name) {
  return name.ends_with("attn.c_attn.weight") || name.ends_with("attn.c_proj.weight") ||
         name.ends_with("mlp.c_fc.weight") || name.ends_with("mlp.c_proj.weight");
}

std::string after(const std::string& s, const std::string& prefix) { return s.substr(prefix.size()); }

// "layers.3.attention.wo.weight" -> ("3", "attention.wo.weight")
std::pair<std::string, std::string> layer_split(const std::string& name) {
  const size_t dot = name.find('.', 7);
  return {name.substr(7, dot - 7), name.substr(dot + 1)};
}

void gpt2_pieces(HfTensorMap& m, const std::string& name) {
  const std::string hf = "transformer." + name + (name == "wte" || name == "wpe" ? ".weight" : "");
  m.pieces.push_back({hf, 0, m.rows, conv1d(name)});
}

void llama_pieces(HfTensorMap& m, const std::string& name, int64_t q_rows, int64_t kv_rows, int64_t inter) {
  auto whole = [&](const std::string& hf) { m.pieces.push_back({hf, 0, m.rows, false}); };
  if (name == "tok_embeddings.weight") return whole("model.embed_tokens.weight");
  if (name == "norm.weight") return whole("model.norm.weight");
  if (name == "output.weight") return whole("lm_head.weight");
  if (!name.starts_with("layers.")) throw std::runtime_error("hf_layout: no Hugging Face name for '" + name + "'");
  const auto [l, rest] = layer_split(name);
  const std::string p = "model.layers." + l + ".";
  if (rest == "attention_norm.weight") return whole(p + "input_layernorm.weight");
  if (rest == "ffn_norm.weight") return whole(p + "post_attention_layernorm.weight");
  if (rest == "attention.wo.weight") return whole(p + "self_attn.o_proj.weight");
  if (rest == "feed_forward.w_down.weight") return whole(p + "mlp.down_proj.weight");
  if (rest == "attention.wqkv.weight" || rest == "attention.bqkv.bias") {
    const std::string kind = rest == "attention.wqkv.weight" ? ".weight" : ".bias";
    m.pieces.push_back({p + "self_attn.q_proj" + kind, 0, q_rows, false});
    m.pieces.push_back({p + "self_attn.k_proj" + kind, q_rows, kv_rows, false});
    m.pieces.push_back({p + "self_attn.v_proj" + kind, q_rows + kv_rows, kv_rows, false});
    return;
  }
  if (rest == "feed_forward.w_gate_up.weight") {
    m.pieces.push_back({p + "mlp.gate_proj.weight", 0, inter, false});
    m.pieces.push_back({p + "mlp.up_proj.weight", inter, inter, false});
    return;
  }
  throw std::runtime_error("hf_layout: no Hugging Face name for '" + name + "'");
}

}  // namespace

std::vector<int64_t> HfTensorMap::piece_shape(const HfPiece& p) const {
  if (p.transposed) return {cols, rows};
  if (one_dim) return {p.rows};
  return {p.rows, cols};
}

bool HfLayout::ignorable(const std::string& n) const {
  if (arch == "gpt2") return n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias") || n == "lm_head.weight";
  return n.ends_with(".rotary_emb.inv_freq") || (tied && n == "lm_head.weight");
}

std::vector<std::string> HfLayout::spellings(const std::string& n) const {
  if (arch == "gpt2" && n.starts_with("transformer.")) return {n, after(n, "transformer.")};
  return {n};
}

HfLayout hf_layout(const nlohmann::json& model, const std::vector<nn::UnitSpec>& layout) {
  HfLayout out;
  out.arch = model.at("arch").get<std::string>();
  if (out.arch != "gpt2" && out.arch != "llama" && out.arch != "mistral" && out.arch != "qwen2") {
    throw std::runtime_error("model.arch '" + out.arch + "' has no Hugging Face form");
  }
  out.tied = out.arch == "gpt2" || model.value("tie_word_embeddings", false);
  int64_t q_rows = 0, kv_rows = 0, inter = 0;
  if (out.arch != "gpt2") {
    const int64_t C = model.at("n_embd").get<int64_t>(), NH = model.at("n_head").get<int64_t>();
    q_rows = C;
    kv_rows = model.at("n_kv_head").get<int64_t>() * (C / NH);
    inter = model.at("intermediate_size").get<int64_t>();
  }
  for (size_t u = 0; u < layout.size(); ++u) {
    for (size_t i = 0; i < layout[u].tensors.size(); ++i) {
      const nn::TensorSpec& t = layout[u].tensors[i];
      HfTensorMap m;
      m.unit = static_cast<int>(u);
      m.tensor = i;
      m.rows = t.shape.at(0);
      m.one_dim = t.shape.size() == 1;
      m.cols = m.one_dim ? 1 : t.shape.at(1);
      if (out.arch == "gpt2") {
        gpt2_pieces(m, t.name);
      } else {
        llama_pieces(m, t.name, q_rows, kv_rows, inter);
      }
      out.tensors.push_back(std::move(m));
    }
  }
  return out;
}

}  // namespace ferry::runtime
