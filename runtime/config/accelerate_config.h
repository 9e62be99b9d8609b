// accelerate's `accelerate config` YAML files, as TRL, alignment-handbook, open-instruct and
// accelerate itself ship them, of the DeepSpeed kind (distributed_type: DEEPSPEED), read by
//   ferry train --config ferry.json --deepspeed accelerate.yaml     (or --fsdp: the same)
// and what both readers of outside runtime files share: telling JSON from YAML, the
// accelerate top-level keys, the mixed-precision names.
//
// The `deepspeed_config:` block is either
//   inline keys, which accelerate turns into a DeepSpeed document (DeepSpeedPlugin):
//     zero_stage (default 2)          -> zero_optimization.stage
//     offload_optimizer_device/_param_device (default none) -> offload_*.device
//     offload_*_nvme_path             -> offload_*.nvme_path (with device nvme; else unused)
//     gradient_accumulation_steps, gradient_clipping (absent: "auto")
//     train_batch_size, train_micro_batch_size_per_gpu: always "auto"
//     zero3_init_flag, zero3_save_16bit_model, deepspeed_multinode_launcher,
//     deepspeed_hostfile, deepspeed_inclusion/exclusion_filter, deepspeed_moe_layer_cls_names:
//     ignored (construction, saving and launching; not what is computed)
//     any other key: accelerate drops it without a word (DeepSpeed never sees it), so ferry
//     lists it as ignored, saying so; within two letters of a key above it is refused as
//     a typo;
//   or `deepspeed_config_file:` a DeepSpeed JSON, relative to the YAML's folder (else to
//     the working directory, where accelerate looks); inline keys that accelerate refuses
//     beside it (ValueError "will be ignored") are refused too, naming the file to set them in.
// Top level: mixed_precision (no, fp16, bf16; fp8 refused) sets bf16/fp16.enabled where the
// DeepSpeed document leaves them absent or "auto", as accelerate's set_mixed_precision does;
// a contradiction is refused; num_processes is the caller's (a warning when it is not the
// world size); the machine and launcher keys are ignored; parallelism_config with tensor or
// context parallelism over more than one rank is refused; unknown keys are refused, as
// accelerate refuses them ("had unknown keys").
// Pure functions of their inputs (no file is read here); thread-safe; errors are ConfigError
// "FILE: key 'k': why", the key as the YAML writes it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ferry::runtime {

// True when `text` (a file's contents; `path` for its extension) is JSON: its first
// character after whitespace, a UTF-8 byte-order mark and JSON comments (// and /* */) is
// '{' or '[', or the file is named *.json. Anything else is YAML.
bool looks_like_json(const std::string& text, const std::string& path);

// accelerate's distributed_type in upper case ("DEEPSPEED", "FSDP", "MULTI_GPU", ...), or ""
// when `doc` is not an accelerate file (none of distributed_type, compute_environment,
// deepspeed_config, fsdp_config at its top level).
std::string accelerate_distributed_type(const nlohmann::json& doc);

// accelerate's top-level keys that do not change what is computed (machines, launcher,
// TPU, compilation back end).
bool accelerate_ignorable_key(const std::string& key);

// A mixed-precision name of accelerate (no, fp16, bf16) or of FSDP's policies (BFLOAT16,
// FP16, FP32, ...), or PyYAML's false for an unquoted `no`: "no", "fp16" or "bf16". fp8 and
// unknown names are refused naming `source` and `key`.
std::string mixed_precision_name(const nlohmann::json& v, const std::string& source, const std::string& key);

struct AccelerateDeepSpeed {
  nlohmann::json ds = nlohmann::json::object();  // the DeepSpeed document (inline keys translated)
  std::string config_file;                      // deepspeed_config_file resolved ("" = inline keys)
  std::string config_file_key;                  // how the YAML names it
  std::string mixed_precision;                  // "" (absent), "no", "fp16" or "bf16"
  std::map<std::string, std::string> names;     // DeepSpeed key path -> the YAML's key
  std::vector<std::string> resolved;            // "deepspeed_config.zero_stage = 3 -> zero_optimization.stage = 3"
  std::vector<std::string> ignored;             // keys that do not change what is computed
  int num_processes = 0;                        // 0 = not given
};

// Translates an accelerate document of distributed_type DEEPSPEED read from `source`
// (relative nvme paths stay relative: translate_deepspeed resolves them against the YAML's
// folder). With deepspeed_config_file, `ds` is empty until use_deepspeed_file; a relative
// path is looked up beside the YAML first, then in the working directory (the only file
// system access here: whether those paths exist).
AccelerateDeepSpeed translate_accelerate_deepspeed(const nlohmann::json& doc, const std::string& source,
                                                   const std::string& base_dir);

// With deepspeed_config_file: takes the file's DeepSpeed document, read by the caller,
// into `acc.ds`, with the YAML's mixed_precision filled where the file leaves bf16/fp16
// "auto" or absent. Throws ConfigError for a contradiction (naming both files) and for a
// file that is itself an accelerate YAML.
void use_deepspeed_file(AccelerateDeepSpeed& acc, const nlohmann::json& file_doc, const std::string& yaml_source);

}  // namespace ferry::runtime
