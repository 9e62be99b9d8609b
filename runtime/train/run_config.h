// The run's configuration in full, kept out of the terminal: ferry train prints a few header
// lines (where the configuration came from, how many keys, where the full list is) and
// writes the whole resolved configuration, with the DeepSpeed / FSDP import lists, to the
// run folder; --verbose prints it as well.
//
// The run folder: checkpoint.dir (the run's output folder, as the Hugging Face Trainer's
// output_dir), else the folder of log.metrics; a run with neither has no folder and the
// header says that --verbose prints the list. Written by rank 0 only, once the run's
// starting point is settled (a resume checkpoint loaded: a refused one leaves the folder
// as it was).
// Not thread-safe; pure functions of their arguments except write_run_config.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/config/config.h"

namespace ferry::runtime {

// What the command line named: the configuration file and the --set / --resume overrides in
// order (the DeepSpeed and FSDP files are in Config::deepspeed.path / fsdp.path).
struct ConfigSources {
  std::string config;
  std::vector<std::string> overrides;
};

// checkpoint.dir/run-config.json; else beside log.metrics, named after it
// (runs/a/metrics.jsonl -> runs/a/metrics.run-config.json, so that runs sharing a folder keep
// their own); "" when the run has neither.
std::string run_config_path(const Config& c);

// The file's content: {"ferry", "sources", "world_size", "resumed_from", "config" (every
// effective value: Config::resolved), and where given "deepspeed" {"file", "resolved" (an
// accelerate YAML's keys), "auto_resolved", "ignored", "warnings"}, "fsdp" {"file",
// "resolved", "ignored", "warnings"}, "trainer_keys"}.
nlohmann::json run_config_record(const Config& c, const ConfigSources& s, int64_t resumed_from);

// Writes `record` to `path` (its folder created; a temporary file renamed over it, so a
// reader never sees half a file). Throws std::runtime_error naming the path.
void write_run_config(const std::string& path, const nlohmann::json& record);

// The header's lines about the configuration (each ends with '\n'): the files it came from
// with the number of resolved keys and where the full list is (`record_path`, or --verbose
// when ""), one line per --deepspeed / --fsdp file with its counts, one for Hugging Face
// Trainer names taken as ferry's keys.
std::string describe_config_header(const Config& c, const ConfigSources& s, const std::string& record_path);

// The full listing --verbose prints: the resolved configuration as indented JSON, then the
// DeepSpeed "auto" resolutions and ignored keys, the FSDP resolutions and ignored keys.
std::string describe_config_full(const Config& c, const ConfigSources& s);

// Leaves (values that are not objects) in a JSON document: the "keys" the header counts.
size_t count_leaves(const nlohmann::json& j);

}  // namespace ferry::runtime
