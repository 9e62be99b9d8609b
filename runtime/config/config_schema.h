// Every configuration knob ferry accepts, declared once: its path, type, default, range
// and description. The parser, the error messages (with "did you mean"), the printed
// resolved config and the docs' key table all come from this one list.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ferry::runtime {

enum class KnobType {
  integer,  // JSON integer
  number,   // any JSON number
  boolean,
  string,
  path,     // string; relative paths in a file are resolved against the file's folder
  bytes,    // integer byte count, or a string with a unit: "512MiB", "2GiB", "1.5GB"
  betas,    // [beta1, beta2], each in [0, 1)
};

struct Knob {
  std::string path;             // "model.n_layer"
  KnobType type;
  nlohmann::json default_value;  // null: optional, absent unless given
  std::string description;
  std::optional<double> min;     // inclusive lower bound
  std::optional<double> max;     // inclusive upper bound
  bool min_exclusive = false;    // (min, ...] instead of [min, ...]
  std::vector<std::string> choices;  // allowed strings, when not empty

  Knob(std::string path_, KnobType type_, nlohmann::json default_, std::string description_,
       std::optional<double> min_ = {}, std::optional<double> max_ = {}, bool min_exclusive_ = false,
       std::vector<std::string> choices_ = {})
      : path(std::move(path_)), type(type_), default_value(std::move(default_)),
        description(std::move(description_)), min(min_), max(max_), min_exclusive(min_exclusive_),
        choices(std::move(choices_)) {}
};

const std::vector<Knob>& config_knobs();

// Environment variables ferry reads (not configuration keys: they concern the process, not
// the run), listed by --help-config beside the keys.
struct EnvKnob {
  std::string name, default_value, description;
};
const std::vector<EnvKnob>& environment_knobs();
const Knob* find_knob(const std::string& path);
// The closest known key or section to `path`, or "" when nothing is close.
std::string closest_key(const std::string& path);
std::string knob_type_name(KnobType t);

}  // namespace ferry::runtime
