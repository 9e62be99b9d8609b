// PyTorch FSDP configurations as the runtime part of a ferry run:
//   ferry train --config ferry.json --fsdp FSDP
// where FSDP, read unchanged, is one of the three forms users have:
//   1. the Hugging Face Trainer's `fsdp_config` JSON (keys with or without `fsdp_`);
//   2. an `accelerate config` YAML file: its `fsdp_config:` block (the `fsdp_` prefix
//      optional, as accelerate allows) and the top-level keys that matter
//      (distributed_type must be FSDP; mixed_precision; num_processes, num_machines);
//   3. the Trainer's `--fsdp` string ("full_shard auto_wrap offload"): an argument that is
//      not an existing file and holds only the Trainer's words.
// A file starting with '{' (or named *.json) is JSON, any other YAML (yaml-cpp).
//
// Every key falls in one of three kinds (docs/guide/deepspeed-fsdp.md, "Coming from FSDP or accelerate"):
//   mapped    onto ferry's keys: sharding_strategy / reshard_after_forward -> ZeRO stage
//             (FULL_SHARD 3, SHARD_GRAD_OP 2, NO_SHARD 0, HYBRID_SHARD 3 and
//             _HYBRID_SHARD_ZERO2 2 with shard_group_size = ranks per node), offload_params
//             -> offload_optimizer (and offload_param at stage 3) on cpu, prefetch ->
//             zero_optimization.overlap_comm, mixed precision -> bf16/fp16.enabled,
//             activation_checkpointing -> activation_checkpointing.enabled; keys that
//             already match ferry (TRANSFORMER_BASED_WRAP, state dict types,
//             cpu_ram_efficient_loading) are reported with what ferry does instead;
//   ignored   keys that do not change what is computed (use_orig_params, sync_module_states,
//             version, min_num_params, xla..., accelerate's machine keys): listed in one warning;
//   refused   values ferry cannot honour without changing the run, and keys it does not know:
//             a ConfigError "FILE: key 'fsdp_config.fsdp_x': why".
// Malformed input (bad JSON or YAML, wrong types) is a ConfigError naming the file and,
// where there is one, the key; never a crash. Pure functions of their inputs (read_fsdp
// reads the file); thread-safe.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ferry::runtime {

struct FsdpImport {
  nlohmann::json runtime = nlohmann::json::object();  // ferry key paths, nested
  std::vector<std::string> resolved;      // "fsdp key = value -> ferry key = value", one per mapped key
  std::vector<std::string> ignored;       // key paths that do not change what is computed
  std::vector<std::string> wrap_classes;  // transformer_layer_cls_to_wrap (checked against the model)
  bool hybrid = false;                    // HYBRID_SHARD / _HYBRID_SHARD_ZERO2: needs shard_group_size
  int num_processes = 0;                  // accelerate's num_processes; 0 = not given
  int num_machines = 0;                   // accelerate's num_machines; 0 = not given
};

// True when `arg` is the Trainer's string form: words from full_shard, shard_grad_op,
// no_shard, hybrid_shard, hybrid_shard_zero2, offload, auto_wrap (at least one).
bool is_fsdp_trainer_string(const std::string& arg);

// Reads --fsdp's argument: an existing file (JSON or YAML), else the Trainer's string
// form, else ConfigError "cannot open".
FsdpImport read_fsdp(const std::string& arg);

// Translates a parsed document (either file form) read from `source`.
FsdpImport translate_fsdp(const nlohmann::json& doc, const std::string& source);

// Parses YAML text into JSON (scalars typed as PyYAML reads them: true/false/yes/no/on/off,
// null/~, integers, floats; quoted scalars stay strings). Throws ConfigError naming `source`.
nlohmann::json yaml_to_json(const std::string& text, const std::string& source);

// The Hugging Face class of a transformer block of `model_arch` (gpt2 -> GPT2Block,
// llama -> LlamaDecoderLayer, ...: the registry's fsdp_block_class, nn/arch.h).
std::string fsdp_block_class(const std::string& model_arch);

}  // namespace ferry::runtime
