// Internal to runtime/config: dotted-path access to the configuration's JSON documents and
// the error every check throws. Pure functions; no state.
#pragma once

#include <map>
#include <cctype>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/config/config.h"
#include "runtime/config/config_schema.h"

namespace ferry::runtime::detail {

// Throws ConfigError "SOURCE: MSG" (SOURCE: the file, or "--set a.b=v").
[[noreturn]] inline void fail(const std::string& source, const std::string& msg) {
  throw ConfigError(source + ": " + msg);
}

// Throws ConfigError "SOURCE: key 'KEY': WHY" (the key as the user's file writes it).
[[noreturn]] inline void refuse(const std::string& source, const std::string& key, const std::string& why) {
  throw ConfigError(source + ": key '" + key + "': " + why);
}
// ASCII case folding of names (strategy names, precision words, accelerate's types).
inline std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}
inline std::string upper(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}
// A value as a message quotes it: a string's text, anything else its JSON.
inline std::string text_of(const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// Sets root["a"]["b"] for "a.b", creating the objects on the way.
void set_path(nlohmann::json& root, const std::string& path, const nlohmann::json& value);
// root["a"]["b"] for "a.b", or nullptr where a part is missing.
const nlohmann::json* get_path(const nlohmann::json& root, const std::string& path);

// "unknown key 'p'", with what to set instead (a Trainer name) or the closest known key.
std::string unknown_key_message(const std::string& path);
// Checks one value against its knob (type, range, choices) naming `source` and k.path;
// returns the value to store (relative paths resolved against base_dir).
nlohmann::json check_value(const Knob& k, const nlohmann::json& v, const std::string& source,
                           const std::string& base_dir);

// Published shapes for model.preset, as model-section keys.
nlohmann::json model_preset(const std::string& name);

// The cross-key rules, after every knob is stored in `c`: consistency checks (throw
// ConfigError naming `source` and the keys), values derived from several keys (compute
// dtype, Llama's shape, DeepSpeed's batch arithmetic and scheduler defaults) and the
// matching edits of `resolved`. `user` holds only what the file and --set gave; `origins`
// names the file of a key that did not come from `source` (a --deepspeed file's batch keys).
void apply_rules(nlohmann::json& resolved, const nlohmann::json& user, Config& c,
                 const std::string& source, const std::map<std::string, std::string>& origins = {});

}  // namespace ferry::runtime::detail
