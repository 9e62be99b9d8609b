// Where each of ferry's tensors lives in a Hugging Face checkpoint, both directions.
//
// A ferry tensor of shape [R, K] (a 1-D one is [R, 1]) is filled by pieces: piece p covers
// ferry rows [row_begin, row_begin + rows) and is the Hugging Face tensor `name`, stored
// either as the same rows ([rows, K], or [rows] for 1-D) or, for GPT-2's Conv1D weights,
// transposed ([K, R], one piece for the whole tensor). So:
//   GPT-2:   "h.0.attn.c_attn.weight" [3C, C] <- "transformer.h.0.attn.c_attn.weight" [C, 3C]
//   Llama:   "layers.0.attention.wqkv.weight" [(NH+2KVH)hd, C] <- q_proj | k_proj | v_proj
//            "layers.0.feed_forward.w_gate_up.weight" [2I, C] <- gate_proj | up_proj
//   Qwen2:   "layers.0.attention.bqkv.bias" <- q_proj.bias | k_proj.bias | v_proj.bias
// The names are the registry's (nn/arch.h, Arch::hf_tensors): this file only applies them.
// Hugging Face's Llama and ferry's both rotate halves (rotate_half), so q and k need no
// permutation (../shared/HF-NOTES.md).
// Threads: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/unit.h"

namespace ferry::runtime {

struct HfPiece {
  std::string name;
  int64_t row_begin = 0, rows = 0;
  bool transposed = false;
};

struct HfTensorMap {
  int unit = 0;
  size_t tensor = 0;             // index in the unit's UnitSpec
  int64_t rows = 0, cols = 1;    // the ferry tensor as [rows, cols]
  bool one_dim = false;
  std::vector<HfPiece> pieces;
  std::vector<int64_t> piece_shape(const HfPiece& p) const;  // the Hugging Face tensor's shape
};

struct HfLayout {
  std::vector<HfTensorMap> tensors;   // every ferry tensor but LoRA adapters (nn/lora.h), in unit order
  // Tensors a Hugging Face file may hold that carry no parameter ferry keeps: GPT-2's
  // attention mask buffers, old Llama files' rotary inv_freq, a tied model's lm_head copy.
  bool ignorable(const std::string& hf_name) const;
  // The names to look for, in order: GPT-2 files written before transformers prefixed
  // them have "h.0.ln_1.weight" for "transformer.h.0.ln_1.weight".
  std::vector<std::string> spellings(const std::string& hf_name) const;
  bool tied = false;
  std::string arch;
  int64_t head_dim = 0;  // the llama family's head size, read off the layout's wqkv (0 for gpt2)
};

// `model` holds the resolved model.* keys (Config::resolved["model"] or a checkpoint
// manifest's "model"); `layout` is the model's unit layout. Throws std::runtime_error for
// an arch without a Hugging Face form or a tensor the registry's table does not name.
HfLayout hf_layout(const nlohmann::json& model, const std::vector<nn::UnitSpec>& layout);

}  // namespace ferry::runtime
