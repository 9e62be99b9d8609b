// The architecture registry: one descriptor per model family ferry computes, and the one
// place the rest of ferry asks what an architecture is (after llama.cpp's llama-arch.h and
// torchtitan's TrainSpec). A descriptor names the family (model.arch), says which model
// class computes it and with which switches, builds it, lays out its units, counts its
// FLOPs, and carries its Hugging Face names: the class in config.json's `architectures`,
// `model_type`, the decoder layer class FSDP wraps, the keys written on export and the
// table from ferry's tensor names to the checkpoint's. Everything here is plain data or a
// function of nn types: runtime/ reads it (runtime/config for model.arch, its rules and
// config.json; runtime/hf for tensor names; runtime/tools/plan for FLOPs), nn/ never
// includes runtime/.
//
// Adding a family: a descriptor in arch.cpp, and in nn/ whatever computation the model
// classes lack (docs/guide/adding-a-model.md walks through Qwen3).
// Threads: the registry is built once, immutable, safe to read from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "nn/device.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "nn/model.h"
#include "nn/unit.h"

namespace ferry::nn {

// Which model class computes the family, and so which shape struct describes it:
// gpt2 -> nn::GPT with GPTConfig; llama -> nn::Llama with LlamaConfig (RMSNorm, rotary
// positions, SwiGLU; the model.* keys of the llama family apply).
enum class ArchFamily { gpt2, llama };

// How the Hugging Face tensors named in a row fill ferry's tensor (runtime/hf/hf_tensors.h):
// whole: one tensor, same rows; transposed: one tensor stored [in, out] (GPT-2's Conv1D);
// qkv: q | k | v pieces of n_head*hd, n_kv_head*hd, n_kv_head*hd rows; gate_up: gate | up
// pieces of intermediate rows each.
enum class HfSplit { whole, transposed, qkv, gate_up };

// One row of a family's tensor-name table. "{l}" stands for a layer's index, in both names.
struct HfTensorName {
  std::string_view ferry;              // "layers.{l}.attention.wqkv.weight"
  HfSplit split = HfSplit::whole;
  std::vector<std::string_view> hf;    // one name, or the pieces in row order
};

// Sliding-window attention in config.json: none (no such key), always (Mistral: a window
// when `sliding_window` is set), when_used (Qwen: only with `use_sliding_window` true).
enum class SlidingWindow { none, always, when_used };

struct Arch {
  std::string_view name;     // model.arch, also the config.json model_type
  ArchFamily family = ArchFamily::llama;
  std::string_view summary;  // one clause for --help-config's model.arch
  // Switches of nn::Llama this family sets (LlamaConfig::qkv_bias, qk_norm), and whether
  // config.json's head_dim may differ from hidden_size / num_attention_heads.
  bool qkv_bias = false, qk_norm = false, free_head_dim = false;
  // Hugging Face
  std::string_view hf_architecture;   // "Qwen3ForCausalLM"
  std::string_view fsdp_block_class;  // "Qwen3DecoderLayer": what transformer_layer_cls_to_wrap names
  SlidingWindow sliding_window = SlidingWindow::none;
  std::string_view hf_export_keys;    // a JSON object of config.json keys written as they are
  const std::vector<HfTensorName>* hf_tensors = nullptr;
  std::vector<std::string_view> hf_ignored_suffixes;  // tensors in a file that hold no parameter
  std::string_view hf_optional_prefix;                // GPT-2 files written without "transformer."
  bool always_tied = false;                           // the head is the token embedding (GPT-2)

  bool rotary() const { return family == ArchFamily::llama; }
  // The LlamaConfig `l` with this family's switches set.
  void apply(LlamaConfig& l) const;
  // The model, its unit layout and its FLOPs per token: gpt2 reads `g`, the llama family `l`.
  std::unique_ptr<Model> make(const GPTConfig& g, const LlamaConfig& l, Device& device, DType dtype) const;
  std::vector<UnitSpec> layout(const GPTConfig& g, const LlamaConfig& l) const;
  double flops_per_token(const GPTConfig& g, const LlamaConfig& l, int64_t T) const;
};

// Every family, in the order --help-config lists them.
const std::vector<Arch>& architectures();
// The family named `name` (model.arch), or nullptr.
const Arch* find_arch(std::string_view name);
// The same; throws std::invalid_argument naming `name` and the families there are.
const Arch& arch(std::string_view name);
// The family whose Hugging Face class is `hf_architecture` ("LlamaForCausalLM"), or nullptr.
const Arch* find_hf_arch(std::string_view hf_architecture);
// "gpt2, llama, mistral, qwen2, qwen3" (names) or the Hugging Face classes, joined by ", ".
std::string arch_names();
std::string hf_architecture_names();

}  // namespace ferry::nn
