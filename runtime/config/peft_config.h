// A PEFT LoRA adapter's adapter_config.json as ferry's lora.* settings (model.adapter_from,
// docs/guide/adapters.md), read as hf_config.h reads a model's config.json. peft_type must
// be LORA; keys that change the computation away from plain LoRA (use_dora, rank_pattern,
// alpha_pattern, layers_to_transform, a regular expression as target_modules, bias other
// than none, ...) are refused by name; bookkeeping keys (base_model_name_or_path,
// task_type, inference_mode, peft_version...) are ignored. target_modules and
// modules_to_save come back sorted (peft writes sets, in no fixed order).
// Errors: ConfigError naming the file and the key.
#pragma once

#include <string>

#include "nn/lora.h"

namespace ferry::runtime {

nn::LoraOptions read_peft_config(const std::string& dir);

}  // namespace ferry::runtime
