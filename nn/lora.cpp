#include "nn/lora.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>

#include "nn/arch.h"
#include "nn/rng.h"

namespace ferry::nn {

namespace {

// `name` against a table pattern with "{l}": the layer index, or nullopt.
std::optional<int64_t> match(std::string_view pattern, const std::string& name) {
  const size_t at = pattern.find("{l}");
  if (at == std::string_view::npos) return pattern == name ? std::optional<int64_t>(-1) : std::nullopt;
  const std::string_view pre = pattern.substr(0, at), post = pattern.substr(at + 3);
  if (name.size() <= pre.size() + post.size() || !name.starts_with(pre) || !name.ends_with(post)) return std::nullopt;
  const std::string mid = name.substr(pre.size(), name.size() - pre.size() - post.size());
  if (mid.empty() || mid.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoll(mid);
}

std::string with_layer(std::string_view pattern, int64_t layer) {
  std::string s(pattern);
  const size_t at = s.find("{l}");
  if (at != std::string::npos) s.replace(at, 3, std::to_string(layer));
  return s;
}

// "model.layers.0.self_attn.q_proj.weight" -> "model.layers.0.self_attn.q_proj"
std::string module_of(const std::string& hf_name) { return hf_name.substr(0, hf_name.rfind('.')); }

// PEFT's rule (check_target_module_exists): the whole name, or its tail after a dot.
bool matches(const std::string& module, const std::string& target) {
  return module == target || (module.size() > target.size() && module.ends_with(target) &&
                              module[module.size() - target.size() - 1] == '.');
}

struct Piece {
  std::string module;
  int64_t row0 = 0, rows = 0;
};

// The Hugging Face modules of tensor `t` and their rows (empty: the table does not name it).
std::vector<Piece> pieces_of(const Arch& arch, const LlamaConfig& c, const TensorSpec& t, bool* in_block) {
  *in_block = false;
  for (const HfTensorName& row : *arch.hf_tensors) {
    const std::optional<int64_t> layer = match(row.ferry, t.name);
    if (!layer) continue;
    *in_block = *layer >= 0;
    std::vector<int64_t> rows;
    if (row.split == HfSplit::qkv) {
      rows = {c.n_head * c.head_dim(), c.n_kv_head * c.head_dim(), c.n_kv_head * c.head_dim()};
    } else if (row.split == HfSplit::gate_up) {
      rows = {c.intermediate, c.intermediate};
    } else {
      rows = {t.shape.at(0)};
    }
    std::vector<Piece> out;
    int64_t at = 0;
    for (size_t k = 0; k < row.hf.size() && k < rows.size(); ++k) {
      out.push_back({module_of(with_layer(row.hf[k], *layer)), at, rows[k]});
      at += rows[k];
    }
    return out;
  }
  return {};
}

}  // namespace

double LoraOptions::scale() const {
  if (r <= 0) return 0.0;
  return rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

std::vector<std::string> lora_default_targets(const Arch& arch) {
  // PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for these model types.
  if (arch.family == ArchFamily::gpt2) return {"c_attn"};
  return {"q_proj", "v_proj"};
}

bool is_lora_tensor(const std::string& name) { return name.ends_with(".lora_A") || name.ends_with(".lora_B"); }

std::vector<LoraAdapter> apply_lora(std::vector<UnitSpec>& units, const Arch& arch, const LlamaConfig& llama,
                                    const LoraOptions& o) {
  if (!o.enabled()) return {};
  if (!arch.hf_tensors) throw std::invalid_argument("lora: model.arch " + std::string(arch.name) + " has no module names");
  std::vector<std::string> targets = o.target_modules.empty() ? lora_default_targets(arch) : o.target_modules;
  const bool all_linear = targets.size() == 1 && targets[0] == "all-linear";
  for (const std::string& t : targets) {
    if (t == "all-linear" && !all_linear) {
      throw std::invalid_argument("lora.target_modules: \"all-linear\" stands alone, not in a list with other names");
    }
  }
  std::vector<bool> target_used(targets.size(), false), save_used(o.modules_to_save.size(), false);
  const bool tied = arch.always_tied || llama.tie_embeddings;
  std::vector<LoraAdapter> adapters;
  std::vector<std::vector<bool>> keep(units.size());
  struct Quantize {
    size_t unit, tensor;
    std::vector<std::pair<int64_t, int64_t>> pieces;
  };
  std::vector<Quantize> quantize;
  for (size_t u = 0; u < units.size(); ++u) {
    const size_t own = units[u].tensors.size();
    keep[u].assign(own, false);
    for (size_t i = 0; i < own; ++i) {
      const TensorSpec t = units[u].tensors[i];
      bool in_block = false;
      const std::vector<Piece> pieces = pieces_of(arch, llama, t, &in_block);
      bool saved = false;
      for (size_t s = 0; s < o.modules_to_save.size(); ++s) {
        const std::string& m = o.modules_to_save[s];
        // PEFT's _set_trainable: a module whose name ends with the entry (no dot needed).
        bool hit = false;
        for (const Piece& p : pieces) hit = hit || p.module.ends_with(m);
        if (tied && u == 0 && i == 0 && (hit || m == "lm_head")) {
          // PEFT would train an untied copy of the one it names and leave the other.
          throw std::invalid_argument("lora.modules_to_save: '" + m + "' is " + t.name +
                                      ", which this model ties to its output layer; PEFT would untie the two, ferry "
                                      "keeps one matrix: train neither in full, or start from an untied model");
        }
        if (hit && pieces.size() > 1) {
          throw std::invalid_argument("lora.modules_to_save: '" + m + "' is one piece of " + t.name +
                                      ", which ferry keeps packed with its neighbours (q, k, v or gate, up) and "
                                      "cannot train in part: give it an adapter with lora.target_modules instead");
        }
        if (hit) keep[u][i] = true, save_used[s] = true, saved = true;
      }
      const bool linear = in_block && t.shape.size() == 2;
      if (o.nf4 && linear && !saved) {
        std::vector<std::pair<int64_t, int64_t>> rows;
        for (const Piece& p : pieces) rows.emplace_back(p.row0, p.rows);
        quantize.push_back({u, i, rows});
      }
      for (const Piece& p : pieces) {
        // PEFT never puts an adapter on a module it trains in full.
        if (saved) continue;
        bool wanted = all_linear && linear;
        for (size_t k = 0; k < targets.size(); ++k) {
          if (all_linear || !matches(p.module, targets[k])) continue;
          if (t.shape.size() == 1 && t.name.ends_with(".bias")) continue;  // the bias of an adapted projection
          if (!linear) {
            throw std::invalid_argument(
                "lora.target_modules: '" + targets[k] + "' names " + p.module +
                ", which takes no adapter (only the blocks' projections do; the output layer is fused with the loss); "
                "train it in full with lora.modules_to_save instead");
          }
          wanted = true;
          target_used[k] = true;
        }
        if (!wanted) continue;
        if (all_linear) target_used[0] = true;
        LoraAdapter a;
        a.module = p.module;
        a.unit = static_cast<int>(u);
        a.base = i;
        a.row0 = p.row0;
        a.rows = p.rows;
        a.in = t.shape.at(1);
        a.r = o.r;
        std::string stem = t.name.substr(0, t.name.rfind('.'));  // "layers.0.attention.wqkv"
        const std::string leaf = p.module.substr(p.module.rfind('.') + 1);
        if (pieces.size() > 1 || !stem.ends_with("." + leaf)) stem += "." + leaf;
        a.a = units[u].tensors.size();
        units[u].add(stem + ".lora_A", {o.r, a.in}, true);
        a.b = units[u].tensors.size();
        units[u].add(stem + ".lora_B", {a.rows, o.r}, true);
        adapters.push_back(a);
      }
    }
  }
  // The lm_head of a model without one (tied) is still a name PEFT users write.
  for (size_t k = 0; k < targets.size(); ++k) {
    if (targets[k] == "lm_head") {
      throw std::invalid_argument("lora.target_modules: 'lm_head' is the output layer, fused with the loss: it takes no "
                                  "adapter; train it in full with lora.modules_to_save = [\"lm_head\"]");
    }
    if (!target_used[k] && (o.strict_names || std::none_of(target_used.begin(), target_used.end(), [](bool b) { return b; }))) {
      throw std::invalid_argument("lora.target_modules: no module of this " + std::string(arch.name) +
                                  " model matches '" + targets[k] +
                                  "' (Hugging Face module names: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                                  "down_proj for the llama family; c_attn, c_proj, c_fc for gpt2; or all-linear)");
    }
  }
  for (size_t s = 0; s < o.modules_to_save.size(); ++s) {
    if (!save_used[s] && o.strict_names) {
      throw std::invalid_argument("lora.modules_to_save: no module of this " + std::string(arch.name) +
                                  " model matches '" + o.modules_to_save[s] + "'");
    }
  }
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t i = 0; i < keep[u].size(); ++i)
      if (!keep[u][i]) units[u].set_trainable(i, false);
  for (const Quantize& q : quantize) units[q.unit].quantize(q.tensor, q.pieces, o.double_quant);
  return adapters;
}

std::vector<double> lora_init(const LoraAdapter& adapter, bool b, uint64_t seed) {
  if (b) return std::vector<double>(static_cast<size_t>(adapter.rows * adapter.r), 0.0);
  std::vector<double> v(static_cast<size_t>(adapter.r * adapter.in));
  Rng rng = Rng::derive({seed, static_cast<uint64_t>(adapter.unit), adapter.a});
  const double bound = 1.0 / std::sqrt(static_cast<double>(adapter.in));
  for (double& x : v) x = (2.0 * rng.uniform() - 1.0) * bound;
  return v;
}

}  // namespace ferry::nn
