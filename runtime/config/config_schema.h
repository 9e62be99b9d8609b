// Every configuration knob ferry accepts, declared once: its path, type, default, range,
// description and the Config field it fills. The parser (one generic loop checks and
// stores every knob, runtime/config/config.cpp), the error messages (with "did you mean"),
// the printed resolved config, the DeepSpeed import's key list and the docs' key table all
// come from this one list. The struct initialisers of Config and sections.h equal the
// table's defaults (test_config's knob_defaults_match_structs fails if they drift).
// The table is built once, on first use (thread-safe), and never changes.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ferry::runtime {

struct Config;

// Where a knob's value lives in Config. `store` takes a value already checked against the
// knob (never null; byte counts as integers, paths resolved, several paths comma-joined)
// and converts it to the field's type; `read` gives the field back as JSON (a default-built
// Config's read equals the table's default). An empty Binding marks a knob that only the
// cross-key rules consume (runtime/config/config_rules.cpp): model.preset,
// train_batch_size.
struct Binding {
  std::function<void(Config&, const nlohmann::json&)> store;
  std::function<nlohmann::json(const Config&)> read;
  // Integer fields: whether a (checked) JSON number is within the field's type, so that an
  // unfit value is refused naming its file instead of wrapping (or, from a float, being
  // undefined behaviour) when stored. Null for other fields.
  std::function<bool(const nlohmann::json&)> fits = nullptr;
  explicit operator bool() const { return static_cast<bool>(store); }
};

enum class KnobType {
  integer,  // JSON integer
  number,   // any JSON number
  boolean,
  string,
  path,     // string; relative paths in a file are resolved against the file's folder
  bytes,    // integer byte count, or a string with a unit: "512MiB", "2GiB", "1.5GB"
  betas,    // [beta1, beta2], each in [0, 1)
  names,    // a JSON list of names, or one string of names separated by commas
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
  Binding bind;                      // the field it fills

  Knob(std::string path_, Binding bind_, KnobType type_, nlohmann::json default_, std::string description_,
       std::optional<double> min_ = {}, std::optional<double> max_ = {}, bool min_exclusive_ = false,
       std::vector<std::string> choices_ = {})
      : path(std::move(path_)), type(type_), default_value(std::move(default_)),
        description(std::move(description_)), min(min_), max(max_), min_exclusive(min_exclusive_),
        choices(std::move(choices_)), bind(std::move(bind_)) {}
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
// Levenshtein distance (insertions, deletions, substitutions), for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b);
std::string knob_type_name(KnobType t);

}  // namespace ferry::runtime
