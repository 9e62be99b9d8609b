#include "runtime/config/peft_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/nesting_limit.h"
#include "runtime/config/config.h"

namespace ferry::runtime {

namespace fs = std::filesystem;
using nlohmann::json;

nn::LoraOptions read_peft_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "adapter_config.json").string();
  std::ifstream in(path);
  if (!in) {
    throw ConfigError(dir + ": no adapter_config.json (a PEFT adapter folder holds adapter_config.json and "
                            "adapter_model.safetensors)");
  }
  const json c = base::parse_json<ConfigError>(in, path, /*allow_exceptions=*/false);
  if (c.is_discarded() || !c.is_object()) throw ConfigError(path + ": not a JSON object");
  auto refuse = [&](const std::string& key, const std::string& why) {
    throw ConfigError(path + ": key '" + key + "' is " + (c.contains(key) ? c.at(key).dump() : std::string("absent")) +
                      ": " + why);
  };
  if (!c.contains("peft_type") || c.at("peft_type") != "LORA") {
    throw ConfigError(path + ": peft_type is " + (c.contains("peft_type") ? c.at("peft_type").dump() : "absent") +
                      "; ferry trains LORA adapters only");
  }
  // Keys that change the computation, at values other than plain LoRA's.
  auto set = [&](const char* key) {
    if (!c.contains(key)) return false;
    const json& v = c.at(key);
    return !(v.is_null() || v == false || (v.is_object() && v.empty()) || (v.is_array() && v.empty()));
  };
  for (const char* key : {"use_dora", "rank_pattern", "alpha_pattern", "layers_to_transform", "exclude_modules",
                          "trainable_token_indices", "target_parameters", "use_qalora", "use_bdlora", "lora_bias",
                          "layer_replication", "megatron_config", "alora_invocation_tokens", "eva_config",
                          "corda_config", "arrow_config", "kasa_config", "monteclora_config", "lora_ga_config",
                          "velora_config"}) {
    if (set(key)) refuse(key, "a LoRA variant ferry does not compute (plain LoRA only)");
  }
  // How A and B start matters only before training; these also change the base (PiSSA,
  // OLoRA, CorDA rewrite W when peft loads them), expect a quantized one (LoftQ), or
  // freeze B (MiCA): plain LoRA's are true, false, gaussian, orthogonal and eva.
  if (c.contains("init_lora_weights")) {
    const json& v = c.at("init_lora_weights");
    const bool plain = v.is_boolean() || v == "gaussian" || v == "orthogonal" || v == "eva";
    if (!plain) refuse("init_lora_weights", "an initialisation that changes the base or the training (ferry adds scale B A to W as it is)");
  }
  nn::LoraOptions o;
  o.strict_names = false;  // peft ignores names that match nothing as long as one target matches
  if (!c.contains("r") || !c.at("r").is_number_integer() || c.at("r").get<int64_t>() < 1 || c.at("r").get<int64_t>() > 4096) {
    throw ConfigError(path + ": key 'r' must be an integer in [1, 4096], got " + (c.contains("r") ? c.at("r").dump() : "nothing"));
  }
  o.r = c.at("r").get<int64_t>();
  if (c.contains("lora_alpha")) {
    if (!c.at("lora_alpha").is_number() || !(c.at("lora_alpha").get<double>() > 0)) refuse("lora_alpha", "must be a positive number");
    o.alpha = c.at("lora_alpha").get<double>();
  }
  if (c.contains("use_rslora")) {
    if (!c.at("use_rslora").is_boolean()) refuse("use_rslora", "must be true or false");
    o.rslora = c.at("use_rslora").get<bool>();
  }
  if (c.contains("lora_dropout") && !c.at("lora_dropout").is_null()) {
    if (!c.at("lora_dropout").is_number()) refuse("lora_dropout", "must be a number");
    o.dropout = c.at("lora_dropout").get<double>();
    if (!(o.dropout >= 0 && o.dropout <= 0.95)) refuse("lora_dropout", "must be in [0, 0.95] (lora.lora_dropout's range)");
  }
  if (c.contains("bias") && c.at("bias") != "none") refuse("bias", "ferry trains no bias beside adapters (bias: none)");
  auto names = [&](const char* key, std::vector<std::string>* out) {
    if (!c.contains(key) || c.at(key).is_null()) return;
    const json& v = c.at(key);
    if (v.is_string()) {
      if (v.get<std::string>() != "all-linear") {
        refuse(key, "a string other than all-linear is a regular expression over module names, which ferry does not "
                    "match; list the module names");
      }
      out->push_back("all-linear");
      return;
    }
    if (!v.is_array()) refuse(key, "must be a list of module names");
    for (const json& n : v) {
      if (!n.is_string() || n.get<std::string>().empty()) refuse(key, "must be a list of module names");
      out->push_back(n.get<std::string>());
    }
    std::sort(out->begin(), out->end());  // peft writes a set, in no fixed order
  };
  names("target_modules", &o.target_modules);  // absent or null: the family's default, as peft
  names("modules_to_save", &o.modules_to_save);
  return o;
}

}  // namespace ferry::runtime
