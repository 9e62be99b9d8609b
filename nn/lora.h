// LoRA adapters (PEFT's LoRA, docs/design/adapters.md): which projections get one, the
// tensors they add to the units, their initialisation, and the frozen base.
//
// An adapter is two trainable tensors in its base weight's unit, added after the unit's own
// tensors (the models' tensor indices do not move): A [r, in] and B [rows, r]. It adds
// scale x (x A^T) B^T to the rows [row0, row0 + rows) of its base's output y = x W^T: the
// whole output, or one Hugging Face module's piece of a packed projection (q_proj of
// Llama's wqkv, gate_proj of w_gate_up). The layer computes it (nn/linear.h); this file
// only decides the layout, from the architecture's Hugging Face names (nn/arch.h).
//
// Names follow PEFT: a target matches a module whose name equals it or ends in "." + it
// (so GPT-2's "c_proj" is both attn.c_proj and mlp.c_proj); "all-linear" is every block
// projection. The output layer (fused with the loss) and the embeddings take no adapter;
// modules_to_save trains them (or any other module) in full instead, matching as peft's
// _set_trainable does (the module's name ends with the entry), and a module saved in full
// gets no adapter. A tied embedding and head cannot be saved (peft would untie them).
// Everything else is frozen (TensorSpec::trainable).
// Errors: std::invalid_argument naming the target or module. Threads: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/unit.h"

namespace ferry::nn {

struct Arch;
struct LlamaConfig;

struct LoraOptions {
  int64_t r = 0;  // rank; 0: no adapters (full fine-tuning)
  double alpha = 8.0;
  bool rslora = false;       // scale alpha / sqrt(r) instead of alpha / r
  double dropout = 0.0;      // on the adapter's input (PEFT's lora_dropout)
  std::vector<std::string> target_modules;  // empty: the family's default (lora_default_targets)
  std::vector<std::string> modules_to_save;
  // Every name must match a module (a configuration's typo is an error); false for a PEFT
  // adapter_config.json, where peft itself ignores names that match nothing as long as one
  // target matches.
  bool strict_names = true;
  // QLoRA: the frozen block projections stored in NF4 (bitsandbytes' 4-bit NormalFloat,
  // nn/nf4_blob.h), each Hugging Face module quantized on its own, with double quantization
  // of the block scales unless double_quant is false; the embeddings, norms, biases, head
  // and modules to save stay as they are (transformers' bitsandbytes integration quantizes
  // every nn.Linear but lm_head).
  bool nf4 = false;
  bool double_quant = true;
  bool enabled() const { return r > 0; }
  double scale() const;
};

struct LoraAdapter {
  std::string module;  // the Hugging Face module, "model.layers.0.self_attn.q_proj"
  int unit = 0;
  size_t base = 0;     // the base weight's index in the unit
  int64_t row0 = 0, rows = 0, in = 0, r = 0;
  size_t a = 0, b = 0;  // the adapter's tensors' indices in the unit
};

// PEFT's default target_modules for the family (its model-type table).
std::vector<std::string> lora_default_targets(const Arch& arch);

// Adds each adapter's tensors to `units` and freezes every tensor that is neither an
// adapter nor part of a module to save; with options.nf4, stores the frozen block
// projections in NF4 (UnitSpec::quantize). `layers` and the llama shape give the packed
// projections' pieces (q | k | v rows, gate | up rows).
std::vector<LoraAdapter> apply_lora(std::vector<UnitSpec>& units, const Arch& arch, const LlamaConfig& llama,
                                    const LoraOptions& options);

// PEFT's initialisation: A uniform in +-1/sqrt(in) (kaiming_uniform_ with a = sqrt(5)),
// drawn from ferry's generator keyed by (seed, unit, A's tensor index); B zero. `b`: B.
std::vector<double> lora_init(const LoraAdapter& adapter, bool b, uint64_t seed);

// True for an adapter tensor's name ("....lora_A" / "....lora_B").
bool is_lora_tensor(const std::string& name);

}  // namespace ferry::nn
