// Hugging Face model folders' config.json, translated to ferry's model.* keys and back.
//
// Reading (model.init_from): the architectures ferry computes are the registry's (nn/arch.h):
// GPT2LMHeadModel, LlamaForCausalLM (Llama 2 and 3.x, rope_scaling "llama3" or none),
// MistralForCausalLM, Qwen2ForCausalLM (q/k/v biases) and Qwen3ForCausalLM (q/k norms, its
// own head_dim), tied or untied. Both spellings that transformers
// versions wrote are read: rope_theta/rope_scaling and torch_dtype (4.x), rope_parameters
// and dtype (5.x). Anything that would change the computation and that ferry does not do
// (another architecture or activation, attention or MLP biases Llama does not have, a
// head_dim other than hidden_size / num_attention_heads where the family has none of its
// own, another rope type, a LayerNorm epsilon other than 1e-5 for GPT-2) is refused by
// name: ConfigError naming the file and the key. A sliding window (Mistral's; Qwen's with
// use_sliding_window) is returned as "sliding_window" so that the rules can refuse it once
// the block size is known (it changes attention only beyond it).
//
// Writing (ferry export --hf): the config.json transformers' AutoConfig reads for the model
// a run trained, in the 4.x spelling, which 5.x still reads.
// Threads: pure functions.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace ferry::runtime {

struct Config;

struct HfModelConfig {
  nlohmann::json keys;        // ferry keys under model.*: arch, n_layer, n_head, ... (see hf_config.cpp)
  int64_t max_positions = 0;  // max_position_embeddings (n_positions for GPT-2): block_size's bound
  int64_t sliding_window = 0; // 0: none in use
  std::string dtype;          // torch_dtype / dtype as written ("" when absent)
  std::string architecture;   // e.g. "LlamaForCausalLM"
  // quantization_config of a folder bitsandbytes saved in 4-bit NF4 (the only quantized
  // folders read): its block projections are NF4 states, read as they are (HfWeights).
  bool nf4 = false;
  bool nf4_double_quant = false;  // bnb_4bit_use_double_quant
};

// `hf` is the parsed config.json at `path` (named in errors).
HfModelConfig hf_model_config(const nlohmann::json& hf, const std::string& path);
// Reads and parses DIR/config.json.
HfModelConfig read_hf_model_config(const std::string& dir);

// The config.json of a model with the resolved model.* keys `model` (a checkpoint's
// manifest "model" or Config::resolved["model"]); dtype "float32", "bfloat16", "float16".
nlohmann::json hf_config_json(const nlohmann::json& model, const std::string& dtype);

// The Hugging Face class for a ferry arch ("gpt2" -> "GPT2LMHeadModel", ...).
std::string hf_architecture(const std::string& arch);

}  // namespace ferry::runtime
