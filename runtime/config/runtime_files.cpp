// The --deepspeed and --fsdp files beside ferry's own (load_config, create_nvme_folders:
// runtime/config/config.h): reading them (JSON or accelerate's YAML), translating them
// (deepspeed_config.h, fsdp_config.h, accelerate_config.h), checking their values under
// their own names, and layering them under ferry's file and --set. The knob checks and the
// document walk are config.cpp's (config_from_json).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "base/nesting_limit.h"
#include "runtime/config/accelerate_config.h"
#include "runtime/config/config.h"
#include "runtime/config/config_json.h"
#include "runtime/config/config_schema.h"
#include "runtime/config/deepspeed_config.h"
#include "runtime/config/fsdp_config.h"
#include "runtime/config/trainer_keys.h"

namespace ferry::runtime {

using nlohmann::json;
namespace fs = std::filesystem;
using detail::check_value;
using detail::fail;
using detail::get_path;
using detail::set_path;
using detail::unknown_key_message;

namespace {

json read_json_file(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open the " + std::string(what) + " file");
  json doc = base::parse_json<ConfigError>(in, path, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (doc.is_discarded()) {
    // Parse again with exceptions for the position of the error.
    in.clear();
    in.seekg(0);
    try {
      doc = json::parse(in, nullptr, true, true);
    } catch (const json::exception& e) {  // parse_error, or out_of_range for a number past a double
      throw ConfigError(path + ": not valid JSON: " + e.what());
    }
  }
  return doc;
}

std::string folder_of(const std::string& path) {
  const std::string base = fs::path(path).parent_path().string();
  return base.empty() ? "." : base;
}

// A --deepspeed or --fsdp file: JSON when it looks like JSON (looks_like_json), YAML
// otherwise (accelerate's files); the JSON goes through read_json_file.
json read_runtime_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open the " + std::string(what) + " file");
  // Real configurations are a few KiB; a bound keeps a wrong file (a dataset, a device)
  // from being read into memory whole.
  constexpr std::uintmax_t kMaxBytes = std::uintmax_t{16} << 20;
  std::error_code ec;
  if (const std::uintmax_t n = fs::file_size(path, ec); !ec && n > kMaxBytes) {
    throw ConfigError(path + ": the " + std::string(what) + " file has " + std::to_string(n) +
                      " bytes, more than 16 MiB: not a configuration");
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().find_first_not_of(" \t\r\n") == std::string::npos) {
    throw ConfigError(path + ": the " + std::string(what) + " file is empty");
  }
  if (looks_like_json(text.str(), path)) return read_json_file(path, what);
  return yaml_to_json(text.str(), path);
}

// The ferry key paths --set gives (Trainer names translated as config_from_json does): a
// runtime file's value for one of them is neither checked nor merged, since --set replaces it.
std::set<std::string> overridden_keys(const std::vector<std::string>& overrides) {
  std::set<std::string> keys;
  TrainerKeys scratch;
  for (const std::string& o : overrides) {
    for (const std::string& arg : translate_trainer_override(o, scratch)) {
      if (const size_t eq = arg.find('='); eq != std::string::npos && eq > 0) keys.insert(arg.substr(0, eq));
    }
  }
  return keys;
}

// Checks each value of a runtime file's translation (ferry key paths) against its knob,
// naming the key as the file writes it (`written`), skipping the keys --set replaces; those
// are removed from `runtime` too.
void check_imported(json& runtime, const std::string& prefix, const std::map<std::string, std::string>& written,
                    const std::set<std::string>& overridden, const std::string& source, const std::string& base_dir) {
  for (auto it = runtime.begin(); it != runtime.end();) {
    const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (overridden.contains(path)) {
      it = runtime.erase(it);
      continue;
    }
    if (it->is_object() && !find_knob(path)) {
      check_imported(*it, path, written, overridden, source, base_dir);
    } else if (const Knob* k = find_knob(path)) {
      Knob named = *k;
      if (const auto w = written.find(path); w != written.end()) named.path = w->second;
      check_value(named, *it, source, base_dir);
    } else {
      fail(source, unknown_key_message(path));
    }
    ++it;
  }
}

// Copies every leaf of `from` (the DeepSpeed file's translation) into `into` (ferry's
// file); a key both files set to different values is an error naming both.
void merge_runtime(json& into, const json& from, const std::string& prefix, const std::string& ferry_path,
                   const std::string& ds_path, const std::map<std::string, std::string>& written = {}) {
  for (const auto& [key, value] : from.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (value.is_object()) {
      if (!into.contains(key) || !into[key].is_object()) into[key] = json::object();
      merge_runtime(into[key], value, path, ferry_path, ds_path, written);
    } else if (into.contains(key) && into[key] != value) {
      const auto w = written.find(path);
      const std::string named =
          w == written.end() || w->second == path ? "'" + path + "'" : "'" + w->second + "' ('" + path + "')";
      fail(ds_path, "key " + named + " is " + value.dump() + " here but " + into[key].dump() + " in " + ferry_path +
                        "; set it in one file");
    } else {
      into[key] = value;
    }
  }
}

// "auto" values the Hugging Face integration computes rather than copies.
void compute_autos(json& doc, const DeepSpeedImport& imp, const Config& first) {
  const double h = static_cast<double>(first.model.n_embd);
  for (const std::string& key : imp.autos) {
    if (get_path(doc, key)) continue;  // ferry's file sets it: that value
    if (key == "zero_optimization.reduce_bucket_size") set_path(doc, key, h * h);
    if (key == "zero_optimization.stage3_prefetch_bucket_size") set_path(doc, key, std::floor(0.9 * h * h));
    if (key == "scheduler.params.warmup_max_lr" && first.scheduler.type != "WarmupCosineLR") {
      set_path(doc, key, first.optimizer.lr);
    }
  }
}

// Where each nvme folder the run uses was set: --set, the runtime file (its key as written)
// or ferry's file.
void record_nvme_folders(Config& c, const std::string& path, const std::vector<std::string>& overrides,
                         const std::string& ds_source, const std::map<std::string, std::string>& written) {
  const std::pair<const char*, const std::vector<std::string>*> knobs[] = {
      {"zero_optimization.offload_optimizer", &c.offload.optimizer_paths},
      {"zero_optimization.offload_param", &c.offload.param_paths}};
  for (const auto& [section, folders] : knobs) {
    const std::string key = std::string(section) + ".nvme_path";
    const offload::Tier device = std::string(section) == "zero_optimization.offload_optimizer" ? c.offload.optimizer_device
                                                                                                : c.offload.param_device;
    if (device != offload::Tier::nvme) continue;
    std::string origin = path + ": key '" + key + "'";
    if (const auto w = written.find(key); w != written.end()) origin = ds_source + ": key '" + w->second + "'";
    for (const std::string& o : overrides) {
      if (o.starts_with(key + "=")) origin = "--set " + o;
    }
    for (const std::string& folder : *folders) c.nvme_folders.emplace_back(folder, origin);
  }
}

// --fsdp: the FSDP file's keys layered as DeepSpeed's are (runtime/config/fsdp_config.h).
Config load_fsdp_config(json doc, const std::string& path, const std::vector<std::string>& overrides,
                        int world_size, const std::string& fsdp_path) {
  FsdpImport imp = read_fsdp(fsdp_path);
  // Messages name the file, or the Trainer's string form as it was given.
  std::error_code ec;
  std::string source = fsdp_path;
  if (!fs::is_regular_file(fsdp_path, ec)) {
    source = "--fsdp \"";
    source += fsdp_path;
    source += '"';
  }
  const std::string group_key = "zero_optimization.shard_group_size";
  std::vector<std::string> warnings;
  if (imp.num_processes > 0 && imp.num_processes != world_size) {
    // As `accelerate launch --num_processes` overrides the file: the run's ranks decide.
    warnings.push_back(source + ": num_processes is " + std::to_string(imp.num_processes) + " but the run has " +
                       std::to_string(world_size) + " rank(s): the run's world size applies (global batch " +
                       "= micro batch x accumulation x " + std::to_string(world_size) + ")");
  }
  std::string group_line;
  const std::set<std::string> overridden = overridden_keys(overrides);
  if (imp.hybrid) {
    if (get_path(doc, group_key) || overridden.contains(group_key)) {
      group_line = "hybrid sharding: zero_optimization.shard_group_size from " + path + " or --set";
    } else if (imp.num_processes == world_size && imp.num_machines > 0 && world_size % imp.num_machines == 0) {
      const int per_node = world_size / imp.num_machines;
      set_path(imp.runtime, group_key, per_node);
      group_line = "hybrid sharding: num_processes / num_machines = " + std::to_string(per_node) + " -> " + group_key +
                   " = " + std::to_string(per_node);
    } else {
      fail(source, "HYBRID_SHARD shards within a node, and ferry cannot know the ranks per node here: set " +
                          group_key + " to them (--set " + group_key + "=R, or in " + path + ")");
    }
  }
  // The FSDP file's values checked under its own name, except those --set replaces.
  check_imported(imp.runtime, "", {}, overridden, source, folder_of(path));
  merge_runtime(doc, imp.runtime, "", path, source);
  Config c = config_from_json(doc, path, folder_of(path), overrides, world_size);
  if (!imp.wrap_classes.empty()) {
    const std::string block = fsdp_block_class(c.model_arch);
    if (std::find(imp.wrap_classes.begin(), imp.wrap_classes.end(), block) == imp.wrap_classes.end()) {
      std::string named;
      for (const std::string& k : imp.wrap_classes) {
        named += named.empty() ? "" : ", ";
        named += k;
      }
      fail(source, "key 'fsdp_transformer_layer_cls_to_wrap': " + named + " is not the block class of the model (" +
                          c.model_arch + " in " + path + ": " + block + ")");
    }
  }
  c.fsdp.path = fsdp_path;
  c.fsdp.resolved = imp.resolved;
  if (!group_line.empty()) c.fsdp.resolved.push_back(group_line);
  c.fsdp.ignored = imp.ignored;
  c.fsdp.warnings = warnings;
  record_nvme_folders(c, path, overrides, source, {});
  return c;
}

// --deepspeed (or an accelerate DEEPSPEED file given to --fsdp): `ds` is the file's parsed
// document, JSON or accelerate YAML.
Config load_deepspeed_config(json doc, const std::string& path, const std::vector<std::string>& overrides,
                             int world_size, const std::string& deepspeed_path, json ds,
                             std::vector<std::string> warnings) {
  std::string ds_source = deepspeed_path;
  // Absolute: ferry's file's folder must not be put in front of the paths resolved here
  // (a relative --deepspeed path's nvme_path landed beside ferry's file).
  std::string ds_base = fs::absolute(folder_of(deepspeed_path)).lexically_normal().string();
  AccelerateDeepSpeed acc;
  if (!accelerate_distributed_type(ds).empty()) {
    acc = translate_accelerate_deepspeed(ds, deepspeed_path, ds_base);
    if (!acc.config_file.empty()) {
      use_deepspeed_file(acc, read_runtime_file(acc.config_file, "DeepSpeed configuration"), deepspeed_path);
      ds_source = acc.config_file;
      ds_base = fs::absolute(folder_of(acc.config_file)).lexically_normal().string();
    }
    ds = std::move(acc.ds);
    if (acc.num_processes > 0 && acc.num_processes != world_size) {
      warnings.push_back(deepspeed_path + ": num_processes is " + std::to_string(acc.num_processes) +
                         " but the run has " + std::to_string(world_size) + " rank(s): the run's world size " +
                         "applies (global batch = micro batch x accumulation x " + std::to_string(world_size) + ")");
    }
  }
  DeepSpeedImport imp = translate_deepspeed(ds, ds_source, ds_base, acc.names);
  const std::set<std::string> overridden = overridden_keys(overrides);
  // The DeepSpeed file's values checked under its own name and keys, except those --set replaces.
  check_imported(imp.runtime, "", imp.written, overridden, ds_source, ds_base);
  merge_runtime(doc, imp.runtime, "", path, ds_source, imp.written);
  // DeepSpeed's default where it differs from ferry's and changes the result: no clipping.
  if (!get_path(doc, "gradient_clipping") &&
      std::find(imp.autos.begin(), imp.autos.end(), "gradient_clipping") == imp.autos.end()) {
    doc["gradient_clipping"] = 0.0;
  }
  // Cross-key errors name the DeepSpeed file for the batch keys it gave.
  std::map<std::string, std::string> origins;
  for (const char* key : {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}) {
    if (overridden.contains(key)) origins[key] = "--set";
    else if (get_path(imp.runtime, key)) origins[key] = ds_source;
  }
  compute_autos(doc, imp, config_from_json(doc, path, folder_of(path), overrides, world_size, origins));
  Config c = config_from_json(doc, path, folder_of(path), overrides, world_size, origins);
  c.deepspeed.path = deepspeed_path;
  for (const std::string& key : imp.autos) {
    const json* v = get_path(c.resolved, key);
    c.deepspeed.autos_resolved.push_back(key + " = " + (v ? v->dump() : std::string("(unset)")));
  }
  c.deepspeed.ignored = acc.ignored;
  c.deepspeed.ignored.insert(c.deepspeed.ignored.end(), imp.ignored.begin(), imp.ignored.end());
  c.deepspeed.resolved = acc.resolved;
  c.deepspeed.warnings = std::move(warnings);
  record_nvme_folders(c, path, overrides, ds_source, imp.written);
  return c;
}

}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides, int world_size,
                   const std::string& deepspeed_path, const std::string& fsdp_path) {
  if (!deepspeed_path.empty() && !fsdp_path.empty()) {
    throw ConfigError("--deepspeed " + deepspeed_path + " and --fsdp " + fsdp_path +
                      ": both set the runtime keys; give one of them");
  }
  json doc = read_json_file(path, "configuration");
  if (!fsdp_path.empty()) {
    // An accelerate file names its kind: a DeepSpeed one given to --fsdp is read as
    // --deepspeed reads it (the Trainer's string form and FSDP files go on to --fsdp).
    std::error_code ec;
    if (fs::is_regular_file(fsdp_path, ec)) {
      json fsdp_doc = read_runtime_file(fsdp_path, "FSDP configuration");
      const std::string type = accelerate_distributed_type(fsdp_doc);
      if (type == "DEEPSPEED" || (type == "(none)" && fsdp_doc.contains("deepspeed_config"))) {
        return load_deepspeed_config(std::move(doc), path, overrides, world_size, fsdp_path, std::move(fsdp_doc),
                                     {fsdp_path + ": distributed_type DEEPSPEED, read as --deepspeed reads it"});
      }
    }
    return load_fsdp_config(std::move(doc), path, overrides, world_size, fsdp_path);
  }
  if (deepspeed_path.empty()) {
    Config c = config_from_json(doc, path, folder_of(path), overrides, world_size);
    record_nvme_folders(c, path, overrides, "", {});
    return c;
  }
  json ds = read_runtime_file(deepspeed_path, "DeepSpeed configuration");
  const std::string type = accelerate_distributed_type(ds);
  if (type == "FSDP" || (type == "(none)" && ds.contains("fsdp_config") && !ds.contains("deepspeed_config"))) {
    Config c = load_fsdp_config(std::move(doc), path, overrides, world_size, deepspeed_path);
    c.fsdp.warnings.insert(c.fsdp.warnings.begin(),
                           deepspeed_path + ": distributed_type FSDP, read as --fsdp reads it");
    return c;
  }
  if (!type.empty() && type != "DEEPSPEED" && !(type == "(none)" && ds.contains("deepspeed_config"))) {
    fail(deepspeed_path, "key 'distributed_type': is " + type + ", not DEEPSPEED or FSDP: " +
                             (type == "(none)" ? "accelerate's default, NO, one process without DeepSpeed"
                                               : "plain data parallelism or another back end") +
                             "; leave --deepspeed out to train with ferry's own keys (zero_optimization.stage 0 is "
                             "data parallelism)");
  }
  return load_deepspeed_config(std::move(doc), path, overrides, world_size, deepspeed_path, std::move(ds), {});
}

void create_nvme_folders(const Config& c) {
  for (const auto& [folder, origin] : c.nvme_folders) {
    std::error_code ec;
    if (fs::is_directory(folder, ec)) continue;
    if (fs::exists(folder, ec)) throw ConfigError(origin + ": nvme_path " + folder + " exists and is not a folder");
    fs::create_directories(folder, ec);
    // Another rank of this node may have made it meanwhile: only a folder that is still
    // missing is an error.
    if (ec && !fs::is_directory(folder)) {
      throw ConfigError(origin + ": cannot create the nvme_path folder " + folder + ": " + ec.message());
    }
  }
}

}  // namespace ferry::runtime
