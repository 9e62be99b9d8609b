// The knob table's reading of one document: every key checked against its knob (the Trainer
// names first translated), --set applied, presets and model.init_from's shape filled in,
// the cross-key rules run (config_from_json). The --deepspeed and --fsdp files are
// runtime_files.cpp's.
#include "runtime/config/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include "base/nesting_limit.h"
#include "runtime/config/config_json.h"
#include "runtime/config/config_schema.h"
#include "runtime/config/hf_config.h"
#include "runtime/config/trainer_keys.h"

namespace ferry::runtime {

using nlohmann::json;
namespace fs = std::filesystem;
using detail::fail;
using detail::get_path;
using detail::set_path;
using detail::check_value;
using detail::unknown_key_message;

namespace {

bool is_section(const std::string& path) {
  for (const Knob& k : config_knobs())
    if (k.path.starts_with(path + ".")) return true;
  return false;
}

std::string range_text(const Knob& k) {
  std::ostringstream os;
  if (k.min && k.max) {
    os << "in " << (k.min_exclusive ? "(" : "[") << *k.min << ", " << *k.max << "]";
  } else if (k.min) {
    os << (k.min_exclusive ? "> " : ">= ") << *k.min;
  } else if (k.max) {
    os << "<= " << *k.max;
  }
  return os.str();
}

void check_range(const Knob& k, double v, const std::string& source) {
  const bool low = k.min && (k.min_exclusive ? v <= *k.min : v < *k.min);
  const bool high = k.max && v > *k.max;
  if (low || high || !std::isfinite(v)) {
    std::ostringstream os;
    os << "key '" << k.path << "' must be " << range_text(k) << ", got " << v;
    fail(source, os.str());
  }
}

}  // namespace

namespace detail {

std::string unknown_key_message(const std::string& path) {
  std::string msg = "unknown key '" + path + "'";
  if (const std::string hint = trainer_key_hint(path); !hint.empty()) return msg + ": " + hint;
  const std::string near = closest_key(path);
  if (!near.empty()) msg += " (did you mean '" + near + "'?)";
  return msg;
}

// Checks one value against its knob; returns the value to store (relative paths resolved).
json check_value(const Knob& k, const json& v, const std::string& source, const std::string& base_dir) {
  auto type_error = [&]() {
    fail(source, "key '" + k.path + "' must be " + knob_type_name(k.type) + ", got " + v.dump());
  };
  if (v.is_null()) {
    if (!k.default_value.is_null()) fail(source, "key '" + k.path + "' cannot be null");
    return v;
  }
  switch (k.type) {
    case KnobType::integer:
    case KnobType::number:
      if (k.type == KnobType::integer ? !v.is_number_integer() : !v.is_number()) type_error();
      check_range(k, v.get<double>(), source);
      if (k.bind.fits && !k.bind.fits(v)) {
        fail(source, "key '" + k.path + "' is " + v.dump() + ", beyond the range of this integer setting");
      }
      return v;
    case KnobType::boolean:
      if (!v.is_boolean()) type_error();
      return v;
    case KnobType::string:
      if (!v.is_string()) type_error();
      if (!k.choices.empty() &&
          std::find(k.choices.begin(), k.choices.end(), v.get<std::string>()) == k.choices.end()) {
        std::string list;
        for (const auto& c : k.choices) list += (list.empty() ? "" : ", ") + c;
        std::string msg = "key '" + k.path + "' must be one of " + list + ", got " + v.dump();
        fail(source, msg);
      }
      return v;
    case KnobType::path: {
      // One path, or several separated by commas (striped NVMe folders); a path knob's
      // choices are keywords that stand for themselves ("auto", "bytes").
      if (!v.is_string() || v.get<std::string>().empty()) type_error();
      if (std::find(k.choices.begin(), k.choices.end(), v.get<std::string>()) != k.choices.end()) return v;
      std::string out, item;
      std::stringstream list(v.get<std::string>());
      while (std::getline(list, item, ',')) {
        if (item.empty()) fail(source, "key '" + k.path + "' has an empty path in " + v.dump());
        fs::path p(item);
        if (p.is_relative() && !base_dir.empty()) p = fs::path(base_dir) / p;
        out += (out.empty() ? "" : ",") + p.lexically_normal().string();
      }
      return out;
    }
    case KnobType::bytes: {
      const size_t bytes = parse_bytes(v, source + ": key '" + k.path + "'");
      check_range(k, static_cast<double>(bytes), source);
      return v;
    }
    case KnobType::names: {
      // Kept as one comma-joined string (how list fields are stored); a list's names may not
      // hold a comma themselves.
      std::vector<std::string> names;
      if (v.is_array()) {
        for (const json& n : v) {
          if (!n.is_string()) type_error();
          names.push_back(n.get<std::string>());
        }
      } else if (v.is_string()) {
        std::stringstream list(v.get<std::string>());
        std::string item;
        while (std::getline(list, item, ',')) names.push_back(item);
      } else {
        type_error();
      }
      std::string out;
      for (const std::string& n : names) {
        if (n.empty() || n.find(',') != std::string::npos || n.find_first_of(" \t") != std::string::npos) {
          fail(source, "key '" + k.path + "' has an empty or malformed name in " + v.dump());
        }
        out += (out.empty() ? "" : ",") + n;
      }
      if (out.empty()) fail(source, "key '" + k.path + "' lists no name");
      return out;
    }
    case KnobType::betas: {
      if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number()) type_error();
      for (const json& b : v) {
        const double x = b.get<double>();
        if (!(x >= 0.0 && x < 1.0)) fail(source, "key '" + k.path + "' must hold betas in [0, 1), got " + v.dump());
      }
      return v;
    }
  }
  return v;
}

}  // namespace detail

namespace {

// Walks the user's document: every leaf must be a knob, every object a section.
void merge_document(json& resolved, const json& doc, const std::string& prefix,
                    const std::string& source, const std::string& base_dir) {
  for (const auto& [key, value] : doc.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (const Knob* k = find_knob(path)) {
      set_path(resolved, path, check_value(*k, value, source, base_dir));
    } else if (is_section(path)) {
      if (!value.is_object()) fail(source, "key '" + path + "' is a section and must be an object, got " + value.dump());
      merge_document(resolved, value, path, source, base_dir);
    } else {
      fail(source, unknown_key_message(path));
    }
  }
}

void apply_override(json& resolved, const std::string& arg) {
  const std::string source = "--set " + arg;
  const size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0) fail(source, "expected key.path=value");
  const std::string path = arg.substr(0, eq), text = arg.substr(eq + 1);
  const Knob* k = find_knob(path);
  if (!k) {
    if (is_section(path)) fail(source, "'" + path + "' is a section; set one of its keys");
    fail(source, unknown_key_message(path));
  }
  json value = base::parse_json<ConfigError>(text, source, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;  // bare words are strings: device.memory=2GiB
  set_path(resolved, path, check_value(*k, value, source, fs::current_path().string()));
}

void drop_nulls(json& node) {
  if (!node.is_object()) return;
  for (auto it = node.begin(); it != node.end();) {
    drop_nulls(*it);
    if (it->is_null() || (it->is_object() && it->empty())) {
      it = node.erase(it);
    } else {
      ++it;
    }
  }
}

// Replaces the leaves of `base` with those of `top`, recursing into objects.
void overlay(json& base, const json& top) {
  for (const auto& [key, value] : top.items()) {
    if (value.is_object() && base.contains(key) && base[key].is_object()) {
      overlay(base[key], value);
    } else {
      base[key] = value;
    }
  }
}

}  // namespace

namespace detail {

void set_path(json& root, const std::string& path, const json& value) {
  json* node = &root;
  size_t start = 0;
  for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', start)) {
    node = &(*node)[path.substr(start, dot - start)];
    start = dot + 1;
  }
  (*node)[path.substr(start)] = value;
}

const json* get_path(const json& root, const std::string& path) {
  const json* node = &root;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->is_object() || !node->contains(key)) return nullptr;
    node = &(*node)[key];
    if (dot == std::string::npos) return node;
    start = dot + 1;
  }
}

}  // namespace detail

std::unique_ptr<nn::Model> make_model(const Config& c, nn::Device& device) {
  std::unique_ptr<nn::Model> m = c.arch().make(c.model, c.llama, device, c.zero.compute);
  m->set_activation_checkpointing(c.activation_checkpointing);
  if (c.lora.enabled()) m->add_lora(c.arch(), c.llama, c.lora);
  return m;
}

std::vector<nn::UnitSpec> model_layout(const Config& c) {
  std::vector<nn::UnitSpec> units = c.arch().layout(c.model, c.llama);
  nn::apply_lora(units, c.arch(), c.llama, c.lora);  // what make_model builds, for the plan
  return units;
}

double run_flops_per_token(const Config& c, const std::vector<nn::UnitSpec>& units, int64_t T) {
  double flops = c.arch().flops_per_token(c.model, c.llama, T);
  const bool tied = c.arch().always_tied || c.llama.tie_embeddings;
  for (const nn::UnitSpec& u : units) {
    for (const nn::TensorSpec& t : u.tensors) {
      if (t.shape.size() != 2) continue;
      const bool embedding = &u == &units.front();  // token (and GPT-2's position) table: a lookup
      const bool head = embedding && tied && &t == &u.tensors.front();
      const double n = static_cast<double>(t.numel());
      if (nn::is_lora_tensor(t.name)) {
        flops += 6.0 * n;  // forward, and both gradients
      } else if (!t.trainable && (!embedding || head)) {
        flops -= 2.0 * n;  // no weight gradient
      }
    }
  }
  return flops;
}

size_t parse_bytes(const json& value, const std::string& what) {
  if (value.is_number_integer()) {
    if (value.get<int64_t>() < 0) throw ConfigError(what + " must not be negative, got " + value.dump());
    return value.get<size_t>();
  }
  if (!value.is_string()) {
    throw ConfigError(what + " must be a byte count (integer, or a string such as \"512MiB\"), got " + value.dump());
  }
  const std::string s = value.get<std::string>();
  size_t used = 0;
  double number = 0;
  try {
    number = std::stod(s, &used);
  } catch (const std::exception&) {
    throw ConfigError(what + ": cannot read a byte count from \"" + s + "\"");
  }
  std::string unit = s.substr(used);
  unit.erase(0, unit.find_first_not_of(' '));
  static const std::vector<std::pair<std::string, double>> units = {
      {"", 1},       {"B", 1},          {"KB", 1e3},         {"MB", 1e6},         {"GB", 1e9},
      {"TB", 1e12},  {"KiB", 1024.0},   {"MiB", 1048576.0},  {"GiB", 1073741824.0},
      {"TiB", 1099511627776.0}};
  for (const auto& [name, mult] : units) {
    if (unit == name) {
      if (!(number >= 0) || !std::isfinite(number)) throw ConfigError(what + ": \"" + s + "\" is not a size");
      return static_cast<size_t>(std::llround(number * mult));
    }
  }
  throw ConfigError(what + ": unknown unit \"" + unit + "\" in \"" + s + "\" (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
}

// model.init_from: the folder's config.json gives the shape, as a preset would; a key the
// user also set must agree with it. block_size, a training choice, defaults to the model's
// context up to 2048.
static void apply_hf_model(json& resolved, const json& user, const std::string& dir, const std::string& source) {
  if (const json* p = get_path(user, "model.preset"); p && !p->is_null()) {
    fail(source, "model.preset and model.init_from both set the model's shape; keep one");
  }
  const HfModelConfig hf = read_hf_model_config(dir);
  const std::string hf_path = dir + "/config.json";
  std::vector<std::pair<std::string, json>> leaves;
  for (const auto& [key, value] : hf.keys.items()) {
    if (value.is_object()) {
      for (const auto& [sub, v] : value.items()) leaves.emplace_back(key + "." + sub, v);
    } else {
      leaves.emplace_back(key, value);
    }
  }
  for (const auto& [key, value] : leaves) {
    const json* mine = get_path(user, "model." + key);
    if (mine && !mine->is_null() && *mine != value) {
      fail(source, "model." + key + " is " + mine->dump() + " here but " + value.dump() + " in " + hf_path +
                       " (model.init_from); remove the key or make the two agree");
    }
    // The knob's type and range, as for a value of ferry's own file (a vocab_size of 2^40
    // reached the model's layout unchecked).
    const Knob* k = find_knob("model." + key);
    set_path(resolved, "model." + key, k ? check_value(*k, value, hf_path, "") : value);
  }
  const json* block = get_path(user, "model.block_size");
  const int64_t block_size = block && block->is_number_integer() ? block->get<int64_t>() : std::min<int64_t>(hf.max_positions, 2048);
  set_path(resolved, "model.block_size", block_size);
  if (hf.sliding_window > 0 && block_size > hf.sliding_window) {
    fail(source, hf_path + " has sliding_window " + std::to_string(hf.sliding_window) + ", below model.block_size " +
                     std::to_string(block_size) + ": sliding-window attention would be in use, which ferry does not " +
                     "compute; set model.block_size <= " + std::to_string(hf.sliding_window));
  }
}

Config config_from_json(const json& doc, const std::string& source, const std::string& base_dir,
                        const std::vector<std::string>& overrides, int world_size,
                        const std::map<std::string, std::string>& origins) {
  if (!doc.is_object()) fail(source, "the configuration must be a JSON object");
  // Defaults, then a preset's shape, then what the file and --set give (checked first).
  // Hugging Face Trainer names move to ferry's keys first (runtime/config/trainer_keys.h).
  TrainerKeys trainer;
  json user = json::object();
  merge_document(user, translate_trainer_keys(doc, source, trainer), "", source, base_dir);
  for (const std::string& o : overrides)
    for (const std::string& arg : translate_trainer_override(o, trainer)) apply_override(user, arg);
  apply_trainer_schedule(user, trainer);
  if (!trainer.adapter_source.empty() && !get_path(user, "lora.r") && !get_path(user, "model.adapter_from")) {
    throw ConfigError(trainer.adapter_source + ": key 'adapter' is \"lora\" but no rank is given: set lora_r (lora.r), "
                      "or leave adapter out to train every weight");
  }
  json resolved = json::object();
  for (const Knob& k : config_knobs()) set_path(resolved, k.path, k.default_value);
  if (const json* preset = get_path(user, "model.preset"); preset && preset->is_string()) {
    const json shape = detail::model_preset(preset->get<std::string>());
    for (const auto& [key, value] : shape.items()) set_path(resolved, "model." + key, value);
  }
  overlay(resolved, user);
  if (const json* from = get_path(user, "model.init_from"); from && from->is_string() && !from->get<std::string>().empty()) {
    apply_hf_model(resolved, user, from->get<std::string>(), source);
  }

  // Every knob's value (the default, the preset's or the user's) into its field; the
  // rules then check the keys against each other and derive what several keys decide.
  Config c;
  c.world_size = world_size;
  c.trainer_keys = trainer.applied;
  for (const Knob& k : config_knobs()) {
    const json& v = *get_path(resolved, k.path);
    if (!k.bind || v.is_null()) continue;  // null: absent, the field's initialiser stands for it
    const json value = k.type == KnobType::bytes ? json(parse_bytes(v, source + ": key '" + k.path + "'")) : v;
    try {
      k.bind.store(c, value);
    } catch (const ConfigError& e) {
      fail(source, "key '" + k.path + "': " + e.what());
    }
  }
  detail::apply_rules(resolved, user, c, source, origins);
  drop_nulls(resolved);
  c.resolved = resolved;
  return c;
}

std::string describe_knobs() {
  std::ostringstream os;
  os << "| key | type | default | description |\n|---|---|---|---|\n";
  for (const Knob& k : config_knobs()) {
    std::string type = knob_type_name(k.type);
    if (!k.choices.empty() && k.type == KnobType::path) {
      // Keywords that stand for themselves, else any path: "auto, bytes or a path".
      type.clear();
      for (size_t i = 0; i < k.choices.size(); ++i) type += (i == 0 ? "" : ", ") + k.choices[i];
      type += " or a path";
    } else if (!k.choices.empty()) {
      type = "one of";
      for (const auto& c : k.choices) type += " " + c;
    }
    const std::string range = range_text(k);
    if (!range.empty()) type += ", " + range;
    os << "| `" << k.path << "` | " << type << " | ";
    if (k.default_value.is_null()) {
      os << "-";
    } else {
      os << '`' << k.default_value.dump() << '`';
    }
    os << " | " << k.description << " |\n";
  }
  os << "\n| environment variable | default | description |\n|---|---|---|\n";
  for (const EnvKnob& e : environment_knobs()) {
    os << "| `" << e.name << "` | " << (e.default_value == "-" ? "-" : "`" + e.default_value + "`") << " | "
       << e.description << " |\n";
  }
  return os.str();
}

}  // namespace ferry::runtime
