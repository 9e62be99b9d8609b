#include "runtime/config/fsdp_config.h"

#include <algorithm>
#include <cstdint>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "base/nesting_limit.h"
#include "runtime/config/accelerate_config.h"
#include "runtime/config/config.h"
#include "runtime/config/config_json.h"

namespace ferry::runtime {

using nlohmann::json;

namespace {

using detail::lower;
using detail::refuse;
using detail::text_of;
using detail::upper;

bool as_bool(const json& v, const std::string& source, const std::string& key) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_string()) {  // accelerate writes some flags as strings ("true", "false")
    const std::string s = lower(v.get<std::string>());
    if (s == "true") return true;
    if (s == "false") return false;
  }
  refuse(source, key, "must be true or false, got " + v.dump());
}

// A name such as "FULL_SHARD", case-insensitive; null stands for "none".
std::string as_name(const json& v, const std::string& source, const std::string& key) {
  if (v.is_null()) return "NONE";
  if (!v.is_string()) refuse(source, key, "must be a string, got " + v.dump());
  return upper(v.get<std::string>());
}

struct Strategy {
  int stage;
  bool hybrid;
};

// FSDP's ShardingStrategy by name, or by accelerate's number (1 FULL_SHARD ... 5).
Strategy strategy_of(const json& v, const std::string& source, const std::string& key) {
  static const char* const kNames[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                       "_HYBRID_SHARD_ZERO2"};
  std::string name;
  if (v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= 5) {
    name = kNames[v.get<int64_t>() - 1];
  } else if (v.is_string()) {
    name = upper(v.get<std::string>());
    if (name.size() == 1 && name[0] >= '1' && name[0] <= '5') name = kNames[name[0] - '1'];
  } else {
    refuse(source, key, "must be a sharding strategy name, got " + v.dump());
  }
  if (name == "HYBRID_SHARD_ZERO2") name = "_HYBRID_SHARD_ZERO2";
  if (name == "FULL_SHARD") return {3, false};
  if (name == "SHARD_GRAD_OP") return {2, false};
  if (name == "NO_SHARD") return {0, false};
  if (name == "HYBRID_SHARD") return {3, true};
  if (name == "_HYBRID_SHARD_ZERO2") return {2, true};
  refuse(source, key,
         "unknown sharding strategy " + v.dump() +
             " (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or _HYBRID_SHARD_ZERO2)");
}

std::string precision_of(const json& v, const std::string& source, const std::string& key) {
  return mixed_precision_name(v, source, key);
}

// Keys of fsdp_config (after the optional fsdp_ prefix) that do not change what is computed,
// whatever their value: which parameters the optimizer sees by name (use_orig_params),
// broadcasting rank 0's weights (ferry's ranks start identical), wrapping granularity
// (min_num_params, auto_wrap_policy other than by block: memory and traffic, same losses),
// the caching allocator's throttle, TPU (xla*), activation offload (memory only), CUDA graphs
// (a recorded launch replays the same kernels on the same data: the same numbers, only
// launch overhead differs; ferry launches its kernels directly), pinning of offloaded
// parameters, and how state dicts are gathered at save (state_dict_config: ferry's
// checkpoints stay sharded).
const std::set<std::string>& fsdp_ignorable() {
  static const std::set<std::string> k = {
      "use_orig_params",    "sync_module_states",      "version",          "min_num_params", "limit_all_gathers",
      "xla",                "xla_fsdp_settings",       "xla_fsdp_grad_ckpt", "xla_fsdp_v2",  "activation_cpu_offload",
      "ignored_modules",    "auto_wrap_policy",        "cuda_graphs",      "cpu_offload_pin_memory",
      "state_dict_config",  "optim_state_dict_config", "sharded_state_dict_config"};
  return k;
}

int as_count(const json& v, const std::string& source, const std::string& key) {
  if (v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= (1 << 24)) return v.get<int>();
  refuse(source, key, "must be a whole number >= 1, got " + v.dump());
}

// The fsdp_config block: `prefix` is how its keys are named in messages ("" or "fsdp_config.").
void translate_block(const json& block, const std::string& source, const std::string& prefix, FsdpImport& out,
                     std::string& precision, std::string& precision_key) {
  if (!block.is_object()) refuse(source, prefix.empty() ? "(top level)" : "fsdp_config", "must be a mapping of keys");
  // First pass: every key, by its name without the fsdp_ prefix; both spellings is an error.
  std::map<std::string, std::pair<std::string, json>> keys;  // bare name -> (key as written, value)
  for (const auto& [written, value] : block.items()) {
    std::string bare = written.starts_with("fsdp_") ? written.substr(5) : written;
    if (bare == "backward_prefetch_policy") bare = "backward_prefetch";  // accelerate's older name
    if (keys.contains(bare) && keys[bare].second != value) {
      refuse(source, prefix + written,
             "is " + value.dump() + " but '" + prefix + keys[bare].first + "' is " + keys[bare].second.dump() +
                 "; set it once");
    }
    keys[bare] = {written, value};
  }
  auto name_of = [&](const std::string& bare) { return prefix + keys.at(bare).first; };
  auto line = [&](const std::string& bare, const std::string& what) {
    out.resolved.push_back(name_of(bare) + " = " + text_of(keys.at(bare).second) + " -> " + what);
  };

  // Sharding: the strategy (FULL_SHARD by default, as in FSDP), then reshard_after_forward.
  Strategy st{3, false};
  std::string stage_from = "FSDP's default FULL_SHARD";
  if (keys.contains("sharding_strategy")) {
    st = strategy_of(keys.at("sharding_strategy").second, source, name_of("sharding_strategy"));
    stage_from = name_of("sharding_strategy");
  }
  std::string reshard_line;  // what reshard_after_forward did, for the resolved list
  if (keys.contains("reshard_after_forward")) {
    const json& v = keys.at("reshard_after_forward").second;
    const std::string key = name_of("reshard_after_forward");
    if (v.is_string() && lower(v.get<std::string>()) != "true" && lower(v.get<std::string>()) != "false") {
      // accelerate's FSDP1 spelling: a sharding strategy under this name.
      const Strategy s2 = strategy_of(v, source, key);
      if (keys.contains("sharding_strategy") && (s2.stage != st.stage || s2.hybrid != st.hybrid)) {
        refuse(source, key, "names another sharding strategy than " + name_of("sharding_strategy"));
      }
      st = s2;
      stage_from = key;
      reshard_line = "the sharding strategy (accelerate's FSDP1 spelling): zero_optimization.stage = " +
                     std::to_string(st.stage);
    } else if (as_bool(v, source, key)) {
      // FSDP2's FULL_SHARD: parameters freed after forward and gathered again in backward.
      if (st.stage != 3) {
        refuse(source, key, "true frees parameters after forward (FULL_SHARD), but " + name_of("sharding_strategy") +
                                " keeps them (stage " + std::to_string(st.stage) + "); set one of the two");
      }
      reshard_line = "zero_optimization.stage = 3 (parameters freed after forward, gathered again in backward)";
    } else if (st.stage == 3) {
      st.stage = 2;  // parameters stay gathered from forward to backward: SHARD_GRAD_OP
      stage_from = key + " = false";
      reshard_line = "zero_optimization.stage = 2 (parameters stay gathered from forward to backward, as SHARD_GRAD_OP)";
    } else {
      reshard_line = "nothing: stage " + std::to_string(st.stage) + " already keeps parameters from forward to backward";
    }
  }
  out.runtime["zero_optimization"]["stage"] = st.stage;
  out.hybrid = st.hybrid;
  out.resolved.push_back((keys.contains("sharding_strategy") ? name_of("sharding_strategy") + " = " +
                                                                    text_of(keys.at("sharding_strategy").second)
                                                              : std::string("(no sharding strategy)")) +
                         " -> zero_optimization.stage = " + std::to_string(st.stage) + " (from " + stage_from + ")" +
                         (st.hybrid ? ", zero_optimization.shard_group_size = ranks per node" : ""));
  if (!reshard_line.empty()) line("reshard_after_forward", reshard_line);

  for (const auto& [bare, entry] : keys) {
    const std::string& v_key = prefix + entry.first;
    const json& v = entry.second;
    if (bare == "sharding_strategy" || bare == "reshard_after_forward") continue;
    if (bare == "offload_params") {
      if (!as_bool(v, source, v_key)) {
        line(bare, "no offload");
        continue;
      }
      if (st.stage == 0) {
        refuse(source, v_key,
               "CPU offload with NO_SHARD: ferry offloads sharded state only (use SHARD_GRAD_OP or FULL_SHARD)");
      }
      out.runtime["zero_optimization"]["offload_optimizer"]["device"] = "cpu";
      if (st.stage == 3) {
        out.runtime["zero_optimization"]["offload_param"]["device"] = "cpu";
        line(bare, "zero_optimization.offload_optimizer.device = cpu, zero_optimization.offload_param.device = cpu");
      } else {
        line(bare, "zero_optimization.offload_optimizer.device = cpu (stage 2 keeps no parameter shards to offload)");
      }
    } else if (bare == "backward_prefetch") {
      const std::string p = as_name(v, source, v_key);
      if (p == "BACKWARD_PRE" || p == "BACKWARD_POST") {
        out.runtime["zero_optimization"]["overlap_comm"] = true;
        line(bare, "zero_optimization.overlap_comm = true (gathers schedule.prefetch_depth units ahead)");
      } else if (p == "NO_PREFETCH" || p == "NONE") {
        const json* fwd = keys.contains("forward_prefetch") ? &keys.at("forward_prefetch").second : nullptr;
        const bool forward = fwd && as_bool(*fwd, source, name_of("forward_prefetch"));
        out.runtime["zero_optimization"]["overlap_comm"] = forward;
        line(bare, std::string("zero_optimization.overlap_comm = ") + (forward ? "true (forward_prefetch)" : "false"));
      } else {
        refuse(source, v_key, "unknown prefetch policy " + v.dump() + " (BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH)");
      }
    } else if (bare == "forward_prefetch") {
      if (as_bool(v, source, v_key)) {
        out.runtime["zero_optimization"]["overlap_comm"] = true;
        line(bare, "zero_optimization.overlap_comm = true");
      } else if (!keys.contains("backward_prefetch")) {
        line(bare, "nothing (ferry's forward prefetch follows zero_optimization.overlap_comm)");
      } else {
        line(bare, "nothing (ferry prefetches forward as backward: zero_optimization.overlap_comm)");
      }
    } else if (bare == "mixed_precision" || (bare == "mixed_precision_policy" && !v.is_object())) {
      precision = precision_of(v, source, v_key);
      precision_key = v_key;
    } else if (bare == "mixed_precision_policy") {
      // FSDP2's MixedPrecisionPolicy as a mapping: the parameters' dtype is the compute
      // dtype; gradients are reduced (and outputs cast) in fp32 only.
      for (const auto& [field, d] : v.items()) {
        const std::string f_key = v_key + "." + field;
        const std::string p = d.is_string() ? lower(d.get<std::string>()) : d.dump();
        const std::string dtype = p.starts_with("torch.") ? p.substr(6) : p;
        if (field == "param_dtype") {
          precision = precision_of(json(dtype == "float32" ? "no" : dtype), source, f_key);
          precision_key = f_key;
        } else if ((field == "reduce_dtype" || field == "output_dtype") && !d.is_null() && dtype != "float32" &&
                   dtype != "fp32") {
          refuse(source, f_key, "ferry reduces gradients and returns outputs in fp32 only, got " + d.dump());
        } else if (field != "reduce_dtype" && field != "output_dtype" && field != "cast_forward_inputs" &&
                   field != "buffer_dtype") {
          refuse(source, f_key, "is not a field of FSDP's MixedPrecisionPolicy ferry knows");
        }
      }
    } else if (bare == "activation_checkpointing") {
      const bool on = as_bool(v, source, v_key);
      out.runtime["activation_checkpointing"]["enabled"] = on;
      line(bare, std::string("activation_checkpointing.enabled = ") + (on ? "true" : "false"));
    } else if (bare == "cpu_ram_efficient_loading") {
      as_bool(v, source, v_key);
      line(bare, "matches ferry: each rank streams only its shards of model.init_from");
    } else if (bare == "state_dict_type") {
      const std::string t = as_name(v, source, v_key);
      if (t == "SHARDED_STATE_DICT" || t == "LOCAL_STATE_DICT") {
        line(bare, "matches ferry: checkpoints (checkpoint.dir) hold each rank's shards");
      } else if (t == "FULL_STATE_DICT") {
        line(bare, "checkpoints stay sharded (checkpoint.dir); `ferry export` writes the full model");
      } else {
        refuse(source, v_key, "unknown state dict type " + v.dump());
      }
    } else if (bare == "transformer_layer_cls_to_wrap") {
      // A list, or accelerate's comma-separated string.
      std::vector<std::string> classes;
      if (v.is_string()) {
        std::stringstream ss(v.get<std::string>());
        for (std::string c; std::getline(ss, c, ',');) {
          c.erase(0, c.find_first_not_of(" \t"));
          c.erase(c.find_last_not_of(" \t") + 1);
          if (!c.empty()) classes.push_back(c);
        }
      } else if (v.is_array()) {
        for (const json& c : v) {
          if (!c.is_string()) refuse(source, v_key, "must list class names, got " + c.dump());
          classes.push_back(c.get<std::string>());
        }
      } else {
        refuse(source, v_key, "must be a class name or a list of them, got " + v.dump());
      }
      if (classes.empty()) refuse(source, v_key, "names no class");
      out.wrap_classes = classes;
      line(bare, "one unit per transformer block, ferry's units (checked against the model)");
    } else if (bare == "auto_wrap_policy" && as_name(v, source, v_key) == "TRANSFORMER_BASED_WRAP") {
      line(bare, "matches ferry: one unit per transformer block");
    } else if (bare == "version") {
      if (text_of(v) != "1" && text_of(v) != "2") refuse(source, v_key, "must be 1 or 2, got " + v.dump());
      out.ignored.push_back(v_key);
    } else if (fsdp_ignorable().contains(bare)) {
      out.ignored.push_back(v_key);
    } else {
      refuse(source, v_key, "is not an FSDP key ferry knows (docs/guide/deepspeed-fsdp.md, \"Coming from FSDP or accelerate\", lists them)");
    }
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open the FSDP configuration file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json scalar_of(const YAML::Node& n) {
  const std::string& s = n.Scalar();
  if (n.Tag() == "!") return s;  // quoted: a string as written
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  const std::string l = lower(s);
  if (l == "true" || l == "yes" || l == "on") return true;  // PyYAML (YAML 1.1), which accelerate writes with
  if (l == "false" || l == "no" || l == "off") return false;
  const char* begin = s.c_str();
  char* end = nullptr;
  const long long i = std::strtoll(begin, &end, 10);
  if (end == begin + s.size() && s.find_first_of("+-0123456789") == 0) return static_cast<int64_t>(i);
  const double d = std::strtod(begin, &end);
  if (end == begin + s.size() && s.find_first_of("+-.0123456789") == 0) return d;
  return s;
}

// Aliases make a YAML document's tree exponentially larger than its text ("billion
// laughs"): the conversion stops at budgets of nodes and of scalar bytes far beyond any
// real configuration (a long string repeated through aliases stays under the first).
constexpr size_t kMaxYamlNodes = 100'000;
constexpr size_t kMaxYamlBytes = size_t{1} << 20;

struct Budget {
  size_t nodes = 0, bytes = 0;
};

bool valid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07;
    else return false;
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += len;
  }
  return true;
}

// A scalar or key's text, counted against the budget; JSON strings must be UTF-8 (a
// message that quotes one could not be written otherwise).
const std::string& checked_text(const YAML::Node& n, const std::string& source, Budget& budget) {
  const std::string& s = n.Scalar();
  if (!valid_utf8(s)) {
    throw ConfigError(source + ": line " + std::to_string(n.Mark().line + 1) + ", column " +
                      std::to_string(n.Mark().column + 1) + ": not UTF-8 text");
  }
  budget.bytes += s.size();
  if (budget.bytes > kMaxYamlBytes) {
    throw ConfigError(source + ": YAML expands to more than " + std::to_string(kMaxYamlBytes >> 20) +
                      " MiB of text (aliases repeating aliases?); not a configuration");
  }
  return s;
}

json node_to_json(const YAML::Node& n, const std::string& source, int depth, Budget& budget) {
  if (depth > 64) throw ConfigError(source + ": YAML nested too deep");
  if (++budget.nodes > kMaxYamlNodes) {
    throw ConfigError(source + ": YAML expands to more than " + std::to_string(kMaxYamlNodes) +
                      " nodes (aliases repeating aliases?); not a configuration");
  }
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      checked_text(n, source, budget);
      return scalar_of(n);
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const YAML::Node& e : n) a.push_back(node_to_json(e, source, depth + 1, budget));
      return a;
    }
    case YAML::NodeType::Map: {
      json o = json::object();
      for (const auto& kv : n) {
        if (!kv.first.IsScalar()) throw ConfigError(source + ": YAML keys must be plain names");
        o[checked_text(kv.first, source, budget)] = node_to_json(kv.second, source, depth + 1, budget);
      }
      return o;
    }
  }
  return nullptr;
}

}  // namespace

json yaml_to_json(const std::string& text, const std::string& source) {
  try {
    Budget budget;
    base::refuse_deep_yaml<ConfigError>(text, source);  // yaml-cpp recurses per level
    return node_to_json(YAML::Load(text), source, 0, budget);
  } catch (const YAML::Exception& e) {
    throw ConfigError(source + ": not valid YAML: line " + std::to_string(e.mark.line + 1) + ", column " +
                      std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
}

std::string fsdp_block_class(const std::string& model_arch) {
  const nn::Arch* a = nn::find_arch(model_arch);
  return a ? std::string(a->fsdp_block_class) : model_arch;
}

bool is_fsdp_trainer_string(const std::string& arg) {
  static const std::set<std::string> kWords = {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard",
                                               "hybrid_shard_zero2", "offload", "auto_wrap"};
  std::istringstream in(arg);
  int n = 0;
  for (std::string w; in >> w; ++n) {
    if (!kWords.contains(w)) return false;
  }
  return n > 0;
}

FsdpImport translate_fsdp(const json& doc, const std::string& source) {
  if (!doc.is_object()) throw ConfigError(source + ": must be a JSON object or YAML mapping of FSDP keys");
  FsdpImport out;
  std::string precision, precision_key;
  const bool accelerate = doc.contains("fsdp_config") || doc.contains("distributed_type") ||
                          doc.contains("compute_environment");
  if (!accelerate) {
    translate_block(doc, source, "", out, precision, precision_key);
  } else {
    if (!doc.contains("fsdp_config")) refuse(source, "fsdp_config", "is missing: an accelerate file for FSDP has one");
    translate_block(doc.at("fsdp_config"), source, "fsdp_config.", out, precision, precision_key);
    for (const auto& [key, v] : doc.items()) {
      if (key == "fsdp_config") continue;
      if (key == "distributed_type") {
        if (as_name(v, source, key) != "FSDP") {
          refuse(source, key, "is " + v.dump() + ", not FSDP (--fsdp reads FSDP files; DeepSpeed's go to --deepspeed)");
        }
      } else if (key == "mixed_precision") {
        const std::string p = precision_of(v, source, key);
        if (!precision_key.empty() && p != precision) {
          refuse(source, key, "is " + p + " but " + precision_key + " is " + precision + "; set it once");
        }
        precision = p;
        precision_key = key;
      } else if (key == "num_processes") {
        out.num_processes = as_count(v, source, key);
      } else if (key == "num_machines") {
        out.num_machines = as_count(v, source, key);
        out.ignored.push_back(key);
      } else if (key == "deepspeed_config") {
        out.ignored.push_back(key + " (distributed_type is FSDP)");
      } else if (accelerate_ignorable_key(key)) {
        out.ignored.push_back(key);
      } else {
        refuse(source, key, "is not an accelerate key ferry knows (docs/guide/deepspeed-fsdp.md, \"Coming from FSDP or accelerate\")");
      }
    }
  }
  if (!precision_key.empty()) {
    out.runtime["bf16"]["enabled"] = precision == "bf16";
    out.runtime["fp16"]["enabled"] = precision == "fp16";
    out.resolved.push_back(precision_key + " = " + precision + " -> bf16.enabled = " +
                           (precision == "bf16" ? "true" : "false") + ", fp16.enabled = " +
                           (precision == "fp16" ? "true" : "false"));
  }
  return out;
}

FsdpImport read_fsdp(const std::string& arg) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(arg, ec) && is_fsdp_trainer_string(arg)) {
    // The Trainer's --fsdp words, as the equivalent fsdp_config.
    json doc = json::object();
    std::istringstream in(arg);
    for (std::string w; in >> w;) {
      if (w == "offload") {
        doc["offload_params"] = true;
      } else if (w == "auto_wrap") {
        doc["auto_wrap_policy"] = "TRANSFORMER_BASED_WRAP";
      } else {
        const std::string s = w == "hybrid_shard_zero2" ? "_HYBRID_SHARD_ZERO2" : upper(w);
        if (doc.contains("sharding_strategy") && doc["sharding_strategy"] != s) {
          throw ConfigError("--fsdp \"" + arg + "\": names two sharding strategies");
        }
        doc["sharding_strategy"] = s;
      }
    }
    return translate_fsdp(doc, "--fsdp \"" + arg + "\"");
  }
  const std::string text = read_text(arg);
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) throw ConfigError(arg + ": the FSDP configuration file is empty");
  json doc;
  if (looks_like_json(text, arg)) {
    try {
      doc = base::parse_json<ConfigError>(text, arg, /*allow_exceptions=*/true, /*ignore_comments=*/true);
    } catch (const json::exception& e) {
      throw ConfigError(arg + ": not valid JSON: " + e.what());
    }
  } else {
    doc = yaml_to_json(text, arg);
  }
  try {
    return translate_fsdp(doc, arg);
  } catch (const json::exception& e) {
    // A second guard: every value is type-checked before use, so this is a bug, but the
    // user still gets the file's name and exit 2 rather than an abort.
    throw ConfigError(arg + ": cannot read the FSDP configuration: " + e.what());
  }
}

}  // namespace ferry::runtime
