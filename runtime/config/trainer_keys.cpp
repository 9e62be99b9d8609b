#include "runtime/config/trainer_keys.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "base/nesting_limit.h"
#include "runtime/config/config_json.h"
#include "runtime/config/config_schema.h"

namespace ferry::runtime {

using nlohmann::json;
using detail::fail;
using detail::get_path;
using detail::set_path;

namespace {

// How a Trainer value becomes ferry's.
enum class Conv {
  same,        // the value as it is (its knob checks it afterwards)
  resume,      // true -> "auto", false/null -> "none", a path as it is
  bool_only,   // bf16/fp16: the Trainer's boolean (an object is ferry's own section)
  positive,    // max_steps, save_steps: the Trainer's -1 / ratio forms are refused
  adamw_name,  // optim: the Trainer's AdamW variants are ferry's AdamW
};

struct Alias {
  std::vector<std::string> to;  // ferry key paths it sets (seed sets two)
  Conv conv = Conv::same;
};

const std::map<std::string, Alias>& aliases() {
  static const std::map<std::string, Alias> m = {
      {"learning_rate", {{"optimizer.params.lr"}}},
      {"weight_decay", {{"optimizer.params.weight_decay"}}},
      {"adam_epsilon", {{"optimizer.params.eps"}}},
      {"max_grad_norm", {{"gradient_clipping"}}},
      {"per_device_train_batch_size", {{"train_micro_batch_size_per_gpu"}}},
      {"micro_batch_size", {{"train_micro_batch_size_per_gpu"}}},  // Axolotl
      {"max_steps", {{"train.steps"}, Conv::positive}},
      {"gradient_checkpointing", {{"activation_checkpointing.enabled"}}},
      {"save_steps", {{"checkpoint.every_steps"}, Conv::positive}},
      {"save_total_limit", {{"checkpoint.keep_last"}}},
      {"logging_steps", {{"log.every"}, Conv::positive}},
      {"eval_steps", {{"train.eval_every"}, Conv::positive}},
      {"resume_from_checkpoint", {{"checkpoint.resume"}, Conv::resume}},
      {"seed", {{"model.seed", "data.seed"}}},
      {"data_seed", {{"data.seed"}}},
      {"val_set_size", {{"data.val_fraction"}}},  // Axolotl: the held-out fraction
      {"bf16", {{"bf16.enabled"}, Conv::bool_only}},
      {"fp16", {{"fp16.enabled"}, Conv::bool_only}},
      {"optim", {{"optimizer.type"}, Conv::adamw_name}},
      // Axolotl's adapter keys (PEFT's under other names)
      {"lora_r", {{"lora.r"}}},
      {"lora_alpha", {{"lora.lora_alpha"}}},
      {"lora_dropout", {{"lora.lora_dropout"}}},
      {"lora_target_modules", {{"lora.target_modules"}}},
      {"lora_modules_to_save", {{"lora.modules_to_save"}}},
      {"peft_use_rslora", {{"lora.use_rslora"}}},
      {"lora_model_dir", {{"model.adapter_from"}}},
  };
  return m;
}

bool schedule_word(const std::string& key) {
  return key == "lr_scheduler_type" || key == "warmup_ratio" || key == "warmup_steps";
}

// The Trainer's value in ferry's terms; `where` names it in messages.
json convert(const std::string& key, const json& v, Conv conv, const std::string& where) {
  switch (conv) {
    case Conv::same:
      return v;
    case Conv::resume:
      if (v.is_boolean()) return v.get<bool>() ? "auto" : "none";
      if (v.is_null()) return "none";
      if (v.is_string()) return v;
      fail(where, "key '" + key + "' must be a checkpoint folder, true (the latest) or false, got " + v.dump());
    case Conv::bool_only:
      return v;  // translate_one only calls it for booleans
    case Conv::positive:
      if (v.is_number_integer() && v.get<int64_t>() >= 0) return v;
      if (key == "max_steps") {
        fail(where, "key 'max_steps' is " + v.dump() +
                        ": ferry counts optimizer steps; set a whole number of steps (train.steps), e.g. epochs x "
                        "training records / train_batch_size (the run's header prints the records)");
      }
      fail(where, "key '" + key + "' must be a whole number of steps, got " + v.dump() +
                      (v.is_number_float() ? " (the Trainer's fraction-of-training form is not taken)" : ""));
    case Conv::adamw_name: {
      static const std::vector<std::string> ok = {"adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw",
                                                  "adamw_apex_fused", "adamw_torch_xla", "adamw_torch_npu_fused"};
      if (v.is_string() && std::find(ok.begin(), ok.end(), v.get<std::string>()) != ok.end()) return "AdamW";
      fail(where, "key 'optim' is " + v.dump() +
                      ": ferry's optimizer is AdamW in fp32 (adamw_torch, adamw_torch_fused, adamw_hf); 8-bit, "
                      "paged, Adafactor, SGD and other optimizers change the result and are not implemented");
    }
  }
  return v;
}

// Sets `path` in `out` unless the document already holds another value there.
void put(json& out, const std::string& path, const json& value, const std::string& key, const std::string& source) {
  if (const json* mine = get_path(out, path); mine && !mine->is_null()) {
    if (*mine != value) {
      fail(source, "key '" + key + "' is " + value.dump() + " but '" + path + "' is " + mine->dump() +
                       "; they are the same setting, set it once");
    }
    return;
  }
  set_path(out, path, value);
}

// Moves one Trainer key into `out`; false when `key` is not one.
bool translate_one(const std::string& key, const json& value, json& out, const std::string& source,
                   TrainerKeys& keys) {
  // Axolotl writes `adapter: null`, `lora_r: null`... in full fine-tunes' files: absent.
  if (value.is_null() && (key == "adapter" || key == "lora_target_linear" || key.starts_with("lora_") ||
                          key == "peft_use_rslora" || key.starts_with("load_in_") || key.starts_with("bnb_4bit_"))) {
    return true;
  }
  if (key == "adapter") {  // Axolotl: which adapter; its rank comes with lora_r
    if (value == "lora") {
      keys.adapter_source = source;
      keys.applied.push_back("adapter = \"lora\" (the rank is lora_r -> lora.r)");
      return true;
    }
    if (value == "qlora") {  // LoRA on a base stored in NF4 (Axolotl sets load_in_4bit beside it)
      keys.adapter_source = source;
      put(out, "lora.base_dtype", "nf4", key, source);
      keys.applied.push_back("adapter = \"qlora\" -> lora.base_dtype = \"nf4\" (the rank is lora_r -> lora.r)");
      return true;
    }
    fail(source, "key 'adapter' is " + value.dump() + "; ferry trains LoRA adapters (adapter: lora)");
  }
  // transformers' BitsAndBytesConfig as Axolotl spells it: 4-bit NF4 is lora.base_dtype nf4.
  if (key == "load_in_4bit" || key == "load_in_8bit") {
    if (!value.is_boolean()) fail(source, "key '" + key + "' must be true or false, got " + value.dump());
    if (!value.get<bool>()) return true;
    if (key == "load_in_8bit") {
      fail(source, "key 'load_in_8bit' is true: ferry quantizes a frozen base to 4-bit NF4 only (load_in_4bit, "
                   "lora.base_dtype \"nf4\"), not to bitsandbytes' 8-bit LLM.int8()");
    }
    put(out, "lora.base_dtype", "nf4", key, source);
    keys.applied.push_back("load_in_4bit = true -> lora.base_dtype = \"nf4\"");
    return true;
  }
  if (key == "bnb_4bit_quant_type") {
    if (value != "nf4") {
      fail(source, "key 'bnb_4bit_quant_type' is " + value.dump() + ": ferry's 4-bit base is NF4 only (\"nf4\")");
    }
    return true;
  }
  if (key == "bnb_4bit_quant_storage") {  // how bitsandbytes packs the nibbles: bytes only
    if (value != "uint8") {
      fail(source, "key 'bnb_4bit_quant_storage' is " + value.dump() + ": ferry stores NF4 nibbles in bytes (\"uint8\")");
    }
    return true;
  }
  if (key == "bnb_4bit_compute_dtype") {  // the dtype the GEMMs run in: ferry's bf16 or fp16 key
    if (value != "bfloat16" && value != "float16" && value != "bf16" && value != "fp16") {
      fail(source, "key 'bnb_4bit_compute_dtype' is " + value.dump() + ": QLoRA computes in bfloat16 or float16 here, "
                   "chosen by bf16 / fp16 (the key itself sets nothing)");
    }
    keys.applied.push_back("bnb_4bit_compute_dtype = " + value.dump() + " (ferry computes in the bf16 / fp16 key's dtype)");
    return true;
  }
  if (key == "bnb_4bit_use_double_quant") {
    if (!value.is_boolean()) fail(source, "key 'bnb_4bit_use_double_quant' must be true or false, got " + value.dump());
    put(out, "lora.double_quant", value, key, source);
    keys.applied.push_back("bnb_4bit_use_double_quant = " + value.dump() + " -> lora.double_quant");
    return true;
  }
  if (key == "lora_target_linear") {  // Axolotl: every linear layer
    if (!value.is_boolean()) fail(source, "key 'lora_target_linear' must be true or false, got " + value.dump());
    if (value.get<bool>()) {
      put(out, "lora.target_modules", "all-linear", key, source);
      keys.applied.push_back("lora_target_linear = true -> lora.target_modules = \"all-linear\"");
    }
    return true;
  }
  if (schedule_word(key)) {
    (key == "lr_scheduler_type" ? keys.lr_scheduler_type : key == "warmup_ratio" ? keys.warmup_ratio
                                                                                 : keys.warmup_steps) = value;
    keys.schedule_source = source;
    return true;
  }
  if (key == "adam_beta1" || key == "adam_beta2") {
    if (!value.is_number()) fail(source, "key '" + key + "' must be a number, got " + value.dump());
    json betas = json::array({0.9, 0.999});
    if (const json* b = get_path(out, "optimizer.params.betas"); b && b->is_array() && b->size() == 2) betas = *b;
    betas[key == "adam_beta1" ? 0 : 1] = value;
    set_path(out, "optimizer.params.betas", betas);
    keys.applied.push_back(key + " = " + value.dump() + " -> optimizer.params.betas[" +
                           (key == "adam_beta1" ? "0" : "1") + "]");
    return true;
  }
  const auto it = aliases().find(key);
  if (it == aliases().end()) return false;
  const Alias& a = it->second;
  const json v = convert(key, value, a.conv, source);
  std::string to;
  for (const std::string& path : a.to) {
    put(out, path, v, key, source);
    to += (to.empty() ? "" : ", ") + path;
  }
  keys.applied.push_back(key + " = " + value.dump() + " -> " + to + (v != value ? " = " + v.dump() : ""));
  return true;
}

// A top-level key this file translates (bf16/fp16 only as the Trainer's booleans: an
// object is ferry's own section).
bool is_trainer_key(const std::string& key, const json& value) {
  if (schedule_word(key) || key == "adam_beta1" || key == "adam_beta2") return true;
  if (key == "adapter") return value.is_string() || value.is_null();  // an object: the adapter.* hint
  if (key == "lora_target_linear") return true;
  if (key == "load_in_4bit" || key == "load_in_8bit" || key == "bnb_4bit_quant_type" || key == "bnb_4bit_use_double_quant" ||
      key == "bnb_4bit_quant_storage" || key == "bnb_4bit_compute_dtype") {
    return true;
  }
  const auto it = aliases().find(key);
  return it != aliases().end() && (it->second.conv != Conv::bool_only || value.is_boolean());
}

json lr_of(const json& user) {
  const json* lr = get_path(user, "optimizer.params.lr");
  return lr && lr->is_number() ? *lr : find_knob("optimizer.params.lr")->default_value;
}

int64_t total_steps(const json& user) {
  for (const char* k : {"scheduler.params.total_num_steps", "train.steps"}) {
    if (const json* v = get_path(user, k); v && v->is_number_integer()) return v->get<int64_t>();
  }
  return find_knob("train.steps")->default_value.get<int64_t>();
}

}  // namespace

json translate_trainer_keys(const json& doc, const std::string& source, TrainerKeys& keys) {
  if (!doc.is_object()) return doc;
  json out = json::object();
  // ferry's own keys first, so that a Trainer name setting one of them again is compared.
  for (const auto& [key, value] : doc.items())
    if (!is_trainer_key(key, value)) out[key] = value;
  for (const auto& [key, value] : doc.items())
    if (is_trainer_key(key, value)) translate_one(key, value, out, source, keys);
  return out;
}

std::vector<std::string> translate_trainer_override(const std::string& arg, TrainerKeys& keys) {
  const size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0) return {arg};
  const std::string key = arg.substr(0, eq), text = arg.substr(eq + 1);
  json value = base::parse_json<ConfigError>(text, "--set " + arg, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;  // bare words are strings, as for any --set
  if (!is_trainer_key(key, value)) return {arg};
  json out = json::object();
  translate_one(key, value, out, "--set " + arg, keys);
  // The ferry keys it wrote, as --set arguments (seed writes two; a schedule word none).
  std::vector<std::string> args;
  const std::function<void(const json&, const std::string&)> walk = [&](const json& n, const std::string& p) {
    for (const auto& [k, v] : n.items()) {
      const std::string path = p.empty() ? k : p + "." + k;
      if (v.is_object()) {
        walk(v, path);
      } else {
        args.push_back(path + "=" + v.dump());
      }
    }
  };
  walk(out, "");
  return args;
}

void apply_trainer_schedule(json& user, TrainerKeys& keys) {
  if (keys.lr_scheduler_type.is_null() && keys.warmup_ratio.is_null() && keys.warmup_steps.is_null()) return;
  const std::string& source = keys.schedule_source;
  std::string type = "linear";  // the Trainer's default
  if (!keys.lr_scheduler_type.is_null()) {
    if (!keys.lr_scheduler_type.is_string()) {
      fail(source, "key 'lr_scheduler_type' must be a string, got " + keys.lr_scheduler_type.dump());
    }
    type = keys.lr_scheduler_type.get<std::string>();
  }
  // Warmup: warmup_steps wins over warmup_ratio where it is above 0, as in the Trainer; a
  // warmup_steps below 1 is transformers 5's ratio spelling.
  int64_t warmup = 0;
  std::string warmup_from;
  const int64_t total = total_steps(user);
  auto from_ratio = [&](const json& r, const std::string& key) {
    if (!r.is_number() || r.get<double>() < 0 || r.get<double>() > 1) {
      fail(source, "key '" + key + "' must be a fraction of the steps in [0, 1], got " + r.dump());
    }
    warmup = static_cast<int64_t>(std::ceil(r.get<double>() * static_cast<double>(total)));
    warmup_from = key + " " + r.dump() + " x " + std::to_string(total) + " steps";
  };
  if (!keys.warmup_ratio.is_null()) from_ratio(keys.warmup_ratio, "warmup_ratio");
  if (!keys.warmup_steps.is_null()) {
    const json& w = keys.warmup_steps;
    if (w.is_number_float() && w.get<double>() > 0 && w.get<double>() < 1) {
      from_ratio(w, "warmup_steps");
    } else if (w.is_number_integer() && w.get<int64_t>() >= 0) {
      if (w.get<int64_t>() > 0 || keys.warmup_ratio.is_null()) {
        warmup = w.get<int64_t>();
        warmup_from = "warmup_steps";
      }
    } else {
      fail(source, "key 'warmup_steps' must be a whole number of steps (or a ratio below 1), got " + w.dump());
    }
  }
  if (const json* t = get_path(user, "scheduler.type"); t && !t->is_null()) {
    fail(source, "the Trainer's schedule keys (lr_scheduler_type, warmup_ratio, warmup_steps) and scheduler.type " +
                     t->dump() + " both set the schedule; keep one");
  }
  if (const json* p = get_path(user, "scheduler.params"); p && p->is_object() && !p->empty()) {
    fail(source, "the Trainer's schedule keys (lr_scheduler_type, warmup_ratio, warmup_steps) and scheduler.params "
                 "both set the schedule; keep one");
  }
  const json lr = lr_of(user);
  json params = json::object();
  std::string ds_type;
  if (type == "constant") {
    if (warmup > 0) fail(source, "lr_scheduler_type constant has no warmup (" + warmup_from + "); use constant_with_warmup");
    keys.applied.push_back("lr_scheduler_type = \"constant\" -> no scheduler (constant optimizer.params.lr)");
    return;
  }
  if (type == "linear") {
    ds_type = "WarmupDecayLR";
    params = {{"warmup_min_lr", 0.0}, {"warmup_max_lr", lr}, {"total_num_steps", total}};
  } else if (type == "constant_with_warmup") {
    ds_type = "WarmupLR";
    params = {{"warmup_min_lr", 0.0}, {"warmup_max_lr", lr}};
  } else if (type == "cosine") {
    ds_type = "WarmupCosineLR";
    params = {{"warmup_min_ratio", 0.0}, {"cos_min_ratio", 0.0}, {"total_num_steps", total}};
  } else {
    fail(source, "key 'lr_scheduler_type' is \"" + type +
                     "\": ferry runs linear, cosine, constant and constant_with_warmup (as DeepSpeed's WarmupDecayLR, "
                     "WarmupCosineLR and WarmupLR); set scheduler.type for DeepSpeed's own schedules");
  }
  params["warmup_num_steps"] = warmup;
  params["warmup_type"] = "linear";
  set_path(user, "scheduler.type", ds_type);
  set_path(user, "scheduler.params", params);
  keys.applied.push_back("lr_scheduler_type = \"" + type + "\"" +
                         (warmup_from.empty() ? "" : ", warmup " + std::to_string(warmup) + " steps (" + warmup_from + ")") +
                         " -> scheduler.type = " + ds_type + " " + params.dump());
}

std::string trainer_key_hint(const std::string& key) {
  static const std::map<std::string, std::string> hints = {
      {"num_train_epochs",
       "ferry counts optimizer steps: set train.steps (epochs x training records / train_batch_size; the run's "
       "header prints the records)"},
      {"output_dir", "ferry writes checkpoints to checkpoint.dir and metrics to log.metrics; set those"},
      {"max_seq_length", "the sequence length is model.block_size (records longer are cut: data.truncate)"},
      {"max_length", "the sequence length is model.block_size (records longer are cut: data.truncate)"},
      {"model_max_length", "the sequence length is model.block_size (records longer are cut: data.truncate)"},
      {"sequence_len", "the sequence length is model.block_size (records longer are cut: data.truncate)"},
      {"eval_strategy", "ferry evaluates every train.eval_every steps (0: never)"},
      {"evaluation_strategy", "ferry evaluates every train.eval_every steps (0: never)"},
      {"save_strategy", "ferry saves every checkpoint.every_steps steps into checkpoint.dir"},
      {"logging_strategy", "ferry logs every log.every steps"},
      {"per_device_eval_batch_size", "validation batches have train_micro_batch_size_per_gpu sequences"},
      {"report_to", "ferry writes log.metrics (JSONL), log.tensorboard and log.csv; set the ones you want"},
      {"deepspeed", "give a DeepSpeed file on the command line: ferry train --config FILE --deepspeed DS.json"},
      {"fsdp", "give FSDP settings on the command line: ferry train --config FILE --fsdp FSDP"},
      {"fsdp_config", "give FSDP settings on the command line: ferry train --config FILE --fsdp FSDP"},
      {"lr_scheduler_kwargs", "ferry's schedule keys are scheduler.type and scheduler.params"},
      {"model_name_or_path", "a Hugging Face model folder is model.init_from"},
      {"base_model", "a Hugging Face model folder is model.init_from"},
      {"dataset_text_field", "JSONL records are read by their keys: text, prompt/completion or messages (data.format jsonl)"},
      {"eval_dataset", "a separate validation file is data.val_path"},
      {"test_datasets", "a separate validation file is data.val_path"},
      {"gradient_checkpointing_kwargs", "activation checkpointing is activation_checkpointing.enabled"},
  };
  if (key.starts_with("peft.") || key.starts_with("adapter.") || key == "peft" || key == "peft_config" ||
      key == "lora_config" || key.starts_with("lora_config.")) {
    return "LoRA settings are the lora section, with PEFT's names: lora.r, lora.lora_alpha, lora.target_modules, "
           "lora.modules_to_save, lora.use_rslora (docs/guide/adapters.md); a PEFT folder is model.adapter_from";
  }
  const auto it = hints.find(key);
  return it == hints.end() ? "" : it->second;
}

}  // namespace ferry::runtime
