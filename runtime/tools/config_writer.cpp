#include "runtime/tools/config_writer.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <optional>

#include "offload/tier.h"
#include "runtime/config/config.h"

namespace ferry::runtime {

using nlohmann::json;
using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

// examples/configs/tiny-model.json's shape: `--model tiny`, and the base file a DeepSpeed
// document is checked beside.
ojson tiny_model() {
  return ojson{
      {"n_layer", 4}, {"n_head", 4}, {"n_embd", 128}, {"vocab_size", 256}, {"block_size", 128}};
}

[[noreturn]] void refuse(const std::string& why) {
  throw ConfigError(why);
}

std::string absolute(const std::string& path) {
  return fs::absolute(path).lexically_normal().string();
}

// The --offload-* flags read once into tiers; what follows compares those.
struct ChosenTiers {
  offload::Tier optimizer = offload::Tier::device, params = offload::Tier::device;
};

offload::Tier tier_flag(const std::string& flag, const std::string& word) {
  const std::optional<offload::Tier> t = offload::tier_from_word(word);
  if (!t) refuse(flag + " '" + word + "': one of none, cpu, nvme");
  return *t;
}

// The checks a reader of the flags expects to be told about by flag; ferry's loader repeats
// them (and more) by key.
ChosenTiers check_choices(const ConfigChoices& c) {
  using offload::Tier;
  if (c.zero_stage < 0 || c.zero_stage > 3)
    refuse("--zero-stage " + std::to_string(c.zero_stage) +
           ": DeepSpeed's ZeRO stages are 0, 1, 2 and 3");
  const ChosenTiers tiers{tier_flag("--offload-optimizer", c.offload_optimizer),
                          tier_flag("--offload-param", c.offload_param)};
  if (tiers.params != Tier::device && c.zero_stage != 3) {
    refuse("--offload-param " + c.offload_param +
           " needs --zero-stage 3 (parameters are sharded only there), got " +
           std::to_string(c.zero_stage));
  }
  if (tiers.optimizer != Tier::device && c.zero_stage == 0) {
    refuse("--offload-optimizer " + c.offload_optimizer +
           " needs --zero-stage 1, 2 or 3 (the optimizer state is sharded from stage 1), got 0");
  }
  const bool nvme = tiers.optimizer == Tier::nvme || tiers.params == Tier::nvme;
  if (nvme && c.nvme_path.empty())
    refuse("nvme offload needs --nvme-path DIR (the folder its swap files go in)");
  if (!nvme && !c.nvme_path.empty())
    refuse("--nvme-path is used only with --offload-optimizer nvme or --offload-param nvme");
  if (c.bf16 && c.fp16) refuse("--bf16 and --fp16 both given; choose one");
  if (c.shard_group_size < 0) refuse("--shard-group-size must be >= 1");
  if (c.shard_group_size > 0 && c.zero_stage == 0)
    refuse(
        "--shard-group-size shards state within groups, but stage 0 shards nothing: use "
        "--zero-stage 1, 2 or 3");
  if (!c.scheduler.empty() && !c.warmup_steps)
    refuse("--scheduler " + c.scheduler + " needs --warmup-steps N");
  if (!c.scheduler.empty() && c.scheduler != "WarmupLR" && c.scheduler != "WarmupDecayLR" &&
      c.scheduler != "WarmupCosineLR")
    refuse("--scheduler '" + c.scheduler + "': one of WarmupLR, WarmupDecayLR, WarmupCosineLR");
  return tiers;
}

ojson offload_section(offload::Tier device, const ConfigChoices& c) {
  ojson o{{"device", offload::tier_word(device)}};
  if (device == offload::Tier::nvme) o["nvme_path"] = absolute(c.nvme_path);
  o["pin_memory"] = c.pin_memory;
  return o;
}

// The keys both kinds share, under DeepSpeed's names; `autos`: write "auto" for what no flag
// chose (a DeepSpeed file), else leave it out (a ferry file: ferry's default).
void runtime_keys(ojson& d, const ConfigChoices& c, ChosenTiers tiers, bool autos) {
  const auto put = [&](ojson& into, const char* key, const auto& value, bool given) {
    if (given)
      into[key] = value;
    else if (autos)
      into[key] = "auto";
  };
  put(d, "train_micro_batch_size_per_gpu", c.micro_batch.value_or(0), c.micro_batch.has_value());
  put(d, "gradient_accumulation_steps", c.grad_accum.value_or(0), c.grad_accum.has_value());
  if (autos) d["train_batch_size"] = "auto";
  put(d, "gradient_clipping", c.clip.value_or(0), c.clip.has_value());

  if (autos || c.lr || c.weight_decay) {
    ojson params = ojson::object();
    put(params, "lr", c.lr.value_or(0), c.lr.has_value());
    if (autos) {
      params["betas"] = "auto";
      params["eps"] = "auto";
    }
    put(params, "weight_decay", c.weight_decay.value_or(0), c.weight_decay.has_value());
    d["optimizer"] = ojson{{"type", "AdamW"}, {"params", params}};
  }
  if (c.warmup_steps) {
    const std::string type = c.scheduler.empty() ? "WarmupDecayLR" : c.scheduler;
    ojson params = ojson::object();
    if (type == "WarmupCosineLR") {
      params["warmup_min_ratio"] = 0.0;
    } else {
      params["warmup_min_lr"] = 0.0;
      put(params, "warmup_max_lr", c.lr.value_or(0), c.lr.has_value());
    }
    params["warmup_num_steps"] = *c.warmup_steps;
    params["warmup_type"] = "linear";
    if (type != "WarmupLR" && autos) params["total_num_steps"] = "auto";
    d["scheduler"] = ojson{{"type", type}, {"params", params}};
  }

  if (c.bf16 || c.fp16 || autos) {
    d["bf16"] = ojson{{"enabled", c.bf16 ? ojson(true) : c.fp16 ? ojson(false) : ojson("auto")}};
    ojson fp16{{"enabled", c.fp16 ? ojson(true) : c.bf16 ? ojson(false) : ojson("auto")}};
    if (c.fp16) {  // DeepSpeed's defaults, written out: dynamic loss scaling from 2^16
      fp16["loss_scale"] = 0;
      fp16["initial_scale_power"] = 16;
      fp16["loss_scale_window"] = 1000;
      fp16["hysteresis"] = 2;
      fp16["min_loss_scale"] = 1;
    }
    d["fp16"] = fp16;
  }

  ojson zero{{"stage", c.zero_stage}};
  if (tiers.optimizer != offload::Tier::device) zero["offload_optimizer"] = offload_section(tiers.optimizer, c);
  if (tiers.params != offload::Tier::device) zero["offload_param"] = offload_section(tiers.params, c);
  if (c.shard_group_size > 0) zero["mics_shard_size"] = c.shard_group_size;
  d["zero_optimization"] = zero;
}

// What "auto" becomes when ferry loads the file (runtime/config/deepspeed_config.h).
std::string auto_means(const std::string& key) {
  if (key == "train_batch_size") return "micro batch x accumulation x ranks";
  if (key == "scheduler.params.warmup_max_lr") return "the optimizer's lr";
  if (key == "scheduler.params.total_num_steps") return "train.steps";
  if (key == "bf16.enabled" || key == "fp16.enabled") return "the ferry file's choice, else off";
  return "the ferry file's value, else ferry's default";
}

void list_leaves(const ojson& node, const std::string& prefix, std::vector<std::string>& out) {
  for (const auto& [key, value] : node.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (value.is_object()) {
      list_leaves(value, path, out);
      continue;
    }
    std::string line = path;
    line += " = ";
    line += value.dump();
    if (value == "auto") {
      line += "  (ferry resolves: ";
      line += auto_means(path);
      line += ")";
    }
    out.push_back(std::move(line));
  }
}

// Shard groups must divide the world: check at a world of one group.
int check_world(const ConfigChoices& c) {
  return c.shard_group_size > 0 ? c.shard_group_size : 1;
}

// A folder of its own under the temp folder, removed when it goes out of scope.
class ScratchDir {
 public:
  ScratchDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("ferry-config-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string write(const std::string& name, const ojson& doc) const {
    const std::string p = (path_ / name).string();
    std::ofstream(p) << doc.dump(2) << "\n";
    return p;
  }

 private:
  fs::path path_;
};

WrittenConfig finish(ojson doc) {
  WrittenConfig w;
  list_leaves(doc, "", w.choices);
  w.doc = std::move(doc);
  return w;
}

}  // namespace

WrittenConfig deepspeed_config(const ConfigChoices& c) {
  const ChosenTiers tiers = check_choices(c);
  ojson d = ojson::object();
  runtime_keys(d, c, tiers, /*autos=*/true);
  // ferry's loader, as `ferry train --config BASE --deepspeed FILE` would run it.
  const ScratchDir dir;
  const ojson base{
      {"model", tiny_model()}, {"data", {{"path", "corpus.txt"}}}, {"device", {{"type", "cpu"}}}};
  const std::string base_path = dir.write("base.json", base);
  const std::string ds_path = dir.write("ds_config.json", d);
  try {
    load_config(base_path, {}, check_world(c), ds_path);
  } catch (const ConfigError& e) {
    refuse(std::string("ferry's loader refuses the DeepSpeed file: ") + e.what());
  }
  return finish(std::move(d));
}

WrittenConfig ferry_config(const ConfigChoices& c) {
  const ChosenTiers tiers = check_choices(c);
  if (c.data.empty()) refuse("--data PATH is required (the training corpus)");
  if (!c.init_from.empty() && !c.model.empty())
    refuse(
        "--model and --init-from both given; --init-from takes the model's shape from its "
        "config.json");
  if (c.device != "cpu" && c.device != "cuda") refuse("--device '" + c.device + "': cpu or cuda");
  ojson d = ojson::object();
  ojson model = ojson::object();
  if (!c.init_from.empty()) {
    model["init_from"] = absolute(c.init_from);
  } else if (c.model.empty() || c.model == "tiny") {
    model = tiny_model();
  } else {
    model["preset"] = c.model;
  }
  if (c.block_size > 0) model["block_size"] = c.block_size;
  d["model"] = model;
  ojson data{{"path", absolute(c.data)}};
  if (!c.data_format.empty()) data["format"] = c.data_format;
  d["data"] = data;
  ojson device{{"type", c.device}};
  if (!c.device_memory.empty()) device["memory"] = c.device_memory;
  d["device"] = device;
  if (c.steps > 0) d["train"] = ojson{{"steps", c.steps}};
  runtime_keys(d, c, tiers, /*autos=*/false);
  try {
    config_from_json(json::parse(d.dump()), "the ferry configuration", fs::current_path().string(),
                     {}, check_world(c));
  } catch (const ConfigError& e) {
    refuse(std::string("ferry's loader refuses the configuration: ") + e.what());
  }
  return finish(std::move(d));
}

}  // namespace ferry::runtime
