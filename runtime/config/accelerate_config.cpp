#include "runtime/config/accelerate_config.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>

#include "runtime/config/config.h"
#include "runtime/config/config_json.h"
#include "runtime/config/config_schema.h"

namespace ferry::runtime {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using detail::lower;
using detail::refuse;
using detail::text_of;
using detail::upper;

// The inline keys of accelerate's deepspeed_config block that its DeepSpeedPlugin reads.
enum class Inline { file, stage, optimizer_device, param_device, optimizer_nvme, param_nvme, accumulation, clipping,
                    ignored };

const std::map<std::string, Inline>& inline_keys() {
  static const std::map<std::string, Inline> k = {
      {"deepspeed_config_file", Inline::file},
      {"zero_stage", Inline::stage},
      {"offload_optimizer_device", Inline::optimizer_device},
      {"offload_param_device", Inline::param_device},
      {"offload_optimizer_nvme_path", Inline::optimizer_nvme},
      {"offload_param_nvme_path", Inline::param_nvme},
      {"gradient_accumulation_steps", Inline::accumulation},
      {"gradient_clipping", Inline::clipping},
      // How the model is built (zero.Init: ferry's ranks always build only their shards),
      // saved (16-bit weights gathered at save: `ferry export` writes them) and launched.
      {"zero3_init_flag", Inline::ignored},
      {"zero3_save_16bit_model", Inline::ignored},
      {"deepspeed_multinode_launcher", Inline::ignored},
      {"deepspeed_hostfile", Inline::ignored},
      {"deepspeed_inclusion_filter", Inline::ignored},
      {"deepspeed_exclusion_filter", Inline::ignored},
      {"deepspeed_moe_layer_cls_names", Inline::ignored},
  };
  return k;
}

// The inline keys accelerate refuses beside deepspeed_config_file (DeepSpeedPlugin.
// _deepspeed_config_checks: "will be ignored ... specify them in the DeepSpeed config file").
bool refused_beside_file(Inline kind) {
  return kind != Inline::file && kind != Inline::ignored;
}

// A relative deepspeed_config_file: beside the YAML (ferry's rule for every path in a file),
// else where accelerate looks, the working directory.
std::string resolve_file(const std::string& value, const std::string& base_dir, const std::string& source,
                         const std::string& key, std::vector<std::string>& resolved) {
  const fs::path p(value);
  if (p.is_absolute()) return value;
  std::error_code ec;
  const fs::path beside = (fs::path(base_dir.empty() ? "." : base_dir) / p).lexically_normal();
  if (fs::exists(beside, ec)) return beside.string();
  if (fs::exists(p, ec)) {
    resolved.push_back(key + " = " + value + " -> " + p.string() + " (not beside " + source +
                       ": from the working directory, as accelerate reads it)");
    return p.string();
  }
  refuse(source, key, "names " + value + ", which is neither " + beside.string() + " (beside the YAML) nor " +
                          (fs::current_path(ec) / p).lexically_normal().string() + " (the working directory)");
}

void set_ds(json& ds, const std::string& path, json value) {
  json* node = &ds;
  size_t start = 0;
  for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', start)) {
    node = &(*node)[path.substr(start, dot - start)];
    start = dot + 1;
  }
  (*node)[path.substr(start)] = std::move(value);
}

// The deepspeed_config block: inline keys into acc.ds, or the file's name.
void translate_block(const json& block, const std::string& source, const std::string& base_dir,
                     AccelerateDeepSpeed& acc) {
  if (block.is_null()) return;  // `deepspeed_config:` left empty: accelerate's defaults
  if (!block.is_object()) refuse(source, "deepspeed_config", "must be a mapping of keys, got " + block.dump());
  const std::string prefix = "deepspeed_config.";
  if (block.contains("deepspeed_config_file") && !block["deepspeed_config_file"].is_null()) {
    const json& f = block["deepspeed_config_file"];
    const std::string key = prefix + "deepspeed_config_file";
    if (!f.is_string() || f.get<std::string>().empty()) refuse(source, key, "must be a file name, got " + f.dump());
    for (const auto& [k, v] : block.items()) {
      const auto it = inline_keys().find(k);
      if (it != inline_keys().end() && refused_beside_file(it->second) && !v.is_null()) {
        refuse(source, prefix + k,
               "is set beside deepspeed_config_file, which accelerate refuses (\"will be ignored\"): set it in " +
                   f.get<std::string>() + " instead");
      }
    }
    acc.config_file = resolve_file(f.get<std::string>(), base_dir, source, key, acc.resolved);
    acc.config_file_key = key;
    acc.resolved.push_back(key + " = " + f.get<std::string>() + " -> the DeepSpeed keys of " + acc.config_file);
    for (const auto& [k, v] : block.items()) {
      if (k != "deepspeed_config_file" && !v.is_null()) acc.ignored.push_back(prefix + k);
    }
    return;
  }
  // DeepSpeedPlugin's document: batch sizes "auto", its defaults where a key is absent.
  json& ds = acc.ds;
  ds["train_batch_size"] = "auto";
  ds["train_micro_batch_size_per_gpu"] = "auto";
  ds["gradient_accumulation_steps"] = "auto";
  ds["gradient_clipping"] = "auto";
  ds["zero_optimization"]["stage"] = 2;
  ds["zero_optimization"]["offload_optimizer"]["device"] = "none";
  ds["zero_optimization"]["offload_param"]["device"] = "none";
  const auto map = [&](const std::string& key, const json& v, const std::string& ds_path) {
    set_ds(ds, ds_path, v);
    acc.names[ds_path] = prefix + key;
    acc.resolved.push_back(prefix + key + " = " + text_of(v) + " -> " + ds_path + " = " + text_of(v));
  };
  std::string optimizer_device = "none", param_device = "none";
  for (const char* dev : {"offload_optimizer_device", "offload_param_device"}) {
    if (const auto it = block.find(dev); it != block.end() && !it->is_null()) {
      // PyYAML reads an unquoted `none` as the string "none", `null` as null (accelerate: none).
      if (!it->is_string()) refuse(source, prefix + dev, "must be none, cpu or nvme, got " + it->dump());
      (std::string(dev) == "offload_optimizer_device" ? optimizer_device : param_device) = lower(it->get<std::string>());
    }
  }
  for (const auto& [key, v] : block.items()) {
    const auto it = inline_keys().find(key);
    if (it == inline_keys().end()) {
      for (const auto& [known, kind] : inline_keys()) {
        if (key.size() >= 6 && edit_distance(key, known) <= 2) {
          refuse(source, prefix + key, "is not a key of accelerate's deepspeed_config; did you mean '" + known + "'?");
        }
      }
      // accelerate copies unknown inline keys onto its launch arguments and never reads
      // them: DeepSpeed does not see them (stage3_max_live_parameters here changes nothing).
      acc.ignored.push_back(prefix + key + " (accelerate does not pass it to DeepSpeed)");
      continue;
    }
    if (v.is_null()) continue;  // accelerate's default
    switch (it->second) {
      case Inline::file:
        break;
      case Inline::stage:
        map(key, v, "zero_optimization.stage");
        break;
      case Inline::optimizer_device:
        map(key, json(optimizer_device), "zero_optimization.offload_optimizer.device");
        break;
      case Inline::param_device:
        map(key, json(param_device), "zero_optimization.offload_param.device");
        break;
      case Inline::optimizer_nvme:
      case Inline::param_nvme: {
        const bool optimizer = it->second == Inline::optimizer_nvme;
        if ((optimizer ? optimizer_device : param_device) != "nvme") {
          // accelerate passes nvme_path only with device nvme.
          acc.ignored.push_back(prefix + key + " (the device is not nvme)");
          break;
        }
        map(key, v, std::string("zero_optimization.") + (optimizer ? "offload_optimizer" : "offload_param") + ".nvme_path");
        break;
      }
      case Inline::accumulation:
        map(key, v, "gradient_accumulation_steps");
        break;
      case Inline::clipping:
        map(key, v, "gradient_clipping");
        break;
      case Inline::ignored:
        acc.ignored.push_back(prefix + key);
        break;
    }
  }
  if (!block.contains("zero_stage") || block["zero_stage"].is_null()) {
    acc.resolved.push_back("(no deepspeed_config.zero_stage) -> zero_optimization.stage = 2 (accelerate's default)");
  }
}

// parallelism_config (accelerate >= 1.10): sizes of tensor and context parallelism above 1
// split layers or sequences over ranks, which ferry does not do.
void check_parallelism(const json& v, const std::string& source, std::vector<std::string>& ignored) {
  if (v.is_null()) return;
  if (!v.is_object()) refuse(source, "parallelism_config", "must be a mapping of keys, got " + v.dump());
  for (const auto& [k, size] : v.items()) {
    const std::string key = "parallelism_config." + k;
    const bool splits = k.ends_with("tp_size") || k.ends_with("cp_size") || k.ends_with("sp_size");
    if (splits && !size.is_null()) {
      if (!size.is_number_integer()) refuse(source, key, "must be a whole number, got " + size.dump());
      if (size.get<int64_t>() > 1) {
        refuse(source, key, "tensor or context parallelism over " + size.dump() +
                                " ranks is not implemented by ferry (its ranks would train as data parallelism, "
                                "changing the global batch); ZeRO-3 shards the model instead");
      }
    }
    ignored.push_back(key);
  }
}

}  // namespace

bool looks_like_json(const std::string& text, const std::string& path) {
  if (fs::path(path).extension() == ".json") return true;
  size_t i = text.starts_with("\xEF\xBB\xBF") ? 3 : 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      ++i;
    } else if (text.compare(i, 2, "//") == 0) {
      i = text.find('\n', i);
    } else if (text.compare(i, 2, "/*") == 0) {
      const size_t end = text.find("*/", i + 2);
      i = end == std::string::npos ? std::string::npos : end + 2;
    } else {
      return c == '{' || c == '[';
    }
  }
  return false;
}

std::string accelerate_distributed_type(const json& doc) {
  if (!doc.is_object()) return "";
  if (const auto it = doc.find("distributed_type"); it != doc.end()) {
    return it->is_string() ? upper(it->get<std::string>()) : it->dump();
  }
  for (const char* k : {"compute_environment", "deepspeed_config", "fsdp_config"}) {
    if (doc.contains(k)) return "(none)";
  }
  return "";
}

bool accelerate_ignorable_key(const std::string& key) {
  static const std::set<std::string> k = {
      "compute_environment", "debug",           "downcast_bf16",      "enable_cpu_affinity", "machine_rank",
      "main_process_ip",     "main_process_port", "main_training_function", "rdzv_backend",  "same_network",
      "tpu_env",             "tpu_use_cluster", "tpu_use_sudo",       "use_cpu",             "gpu_ids",
      "tpu_name",            "tpu_zone",        "commands",           "command_file",        "dynamo_config",
      "dynamo_backend",      "megatron_lm_config", "ipex_config",     "mpirun_config",       "num_machines",
      "fp8_config"};
  return k.contains(key);
}

std::string mixed_precision_name(const json& v, const std::string& source, const std::string& key) {
  if (v.is_boolean() && !v.get<bool>()) return "no";  // PyYAML reads an unquoted `no` as false
  if (v.is_null()) return "no";
  if (!v.is_string()) refuse(source, key, "must be no, fp16 or bf16, got " + v.dump());
  const std::string s = lower(v.get<std::string>());
  if (s == "bf16" || s == "bfloat16") return "bf16";
  if (s == "fp16" || s == "float16" || s == "half") return "fp16";
  if (s == "no" || s == "fp32" || s == "float32" || s == "none") return "no";
  if (s == "fp8") refuse(source, key, "fp8 training is not implemented by ferry (bf16 or fp16 are)");
  refuse(source, key, "unknown mixed precision " + v.dump() + " (no, fp16 or bf16)");
}

AccelerateDeepSpeed translate_accelerate_deepspeed(const json& doc, const std::string& source,
                                                   const std::string& base_dir) {
  AccelerateDeepSpeed acc;
  for (const auto& [key, v] : doc.items()) {
    if (key == "distributed_type") continue;  // the caller chose this reader by it
    if (key == "deepspeed_config") {
      translate_block(v, source, base_dir, acc);
    } else if (key == "mixed_precision") {
      acc.mixed_precision = mixed_precision_name(v, source, key);
    } else if (key == "num_processes") {
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 24)) {
        refuse(source, key, "must be a whole number >= 1, got " + v.dump());
      }
      acc.num_processes = v.get<int>();
    } else if (key == "parallelism_config") {
      check_parallelism(v, source, acc.ignored);
    } else if (key == "fsdp_config") {
      // accelerate reads it only with distributed_type FSDP.
      if (!v.is_null() && !(v.is_object() && v.empty())) acc.ignored.push_back(key + " (distributed_type is DEEPSPEED)");
    } else if (accelerate_ignorable_key(key)) {
      acc.ignored.push_back(key);
    } else {
      refuse(source, key, "is not an accelerate key ferry knows (accelerate refuses unknown keys too)");
    }
  }
  if (acc.config_file.empty() && acc.ds.empty()) translate_block(json::object(), source, base_dir, acc);
  if (acc.config_file.empty() && !acc.mixed_precision.empty()) {
    // No file: the plugin's document has no fp16/bf16 sections; set_mixed_precision adds them.
    acc.ds["bf16"]["enabled"] = acc.mixed_precision == "bf16";
    acc.ds["fp16"]["enabled"] = acc.mixed_precision == "fp16";
    acc.names["bf16.enabled"] = acc.names["fp16.enabled"] = "mixed_precision";
    acc.resolved.push_back("mixed_precision = " + acc.mixed_precision + " -> bf16.enabled = " +
                           (acc.mixed_precision == "bf16" ? "true" : "false") + ", fp16.enabled = " +
                           (acc.mixed_precision == "fp16" ? "true" : "false"));
  }
  return acc;
}

void use_deepspeed_file(AccelerateDeepSpeed& acc, const json& file_doc, const std::string& yaml_source) {
  if (!accelerate_distributed_type(file_doc).empty()) {
    refuse(yaml_source, acc.config_file_key,
           "names " + acc.config_file + ", an accelerate file; it must name a DeepSpeed JSON configuration");
  }
  acc.ds = file_doc;
  if (acc.mixed_precision.empty() || !acc.ds.is_object()) return;  // translate_deepspeed says what is wrong
  // accelerate's set_mixed_precision: the other precision enabled in the file is an error;
  // "auto" or absent takes mixed_precision's choice; an explicit value stays.
  const std::string& p = acc.mixed_precision;
  std::vector<std::string> filled;
  for (const char* dtype : {"fp16", "bf16"}) {
    json& section = acc.ds[dtype];
    if (section.is_null()) section = json::object();
    if (!section.is_object()) continue;  // translate_deepspeed refuses it
    const bool want = p == dtype;
    const auto en = section.find("enabled");
    if (en == section.end() || en->is_null() || *en == "auto") {
      section["enabled"] = want;
      filled.push_back(std::string(dtype) + ".enabled = " + (want ? "true" : "false"));
    } else if (p != "no" && !want && en->is_boolean() && en->get<bool>()) {
      refuse(yaml_source, "mixed_precision",
             "is " + p + " but " + acc.config_file + " enables " + dtype + " (" + dtype +
                 ".enabled: true); accelerate refuses this too: make the two agree");
    }
  }
  if (!filled.empty()) {
    std::string line = "mixed_precision = " + p + " ->";
    for (size_t i = 0; i < filled.size(); ++i) line += (i ? ", " : " ") + filled[i];
    acc.resolved.push_back(line + " (where " + acc.config_file + " leaves it \"auto\" or absent)");
  }
}

}  // namespace ferry::runtime
