#include "runtime/train/run_config.h"

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <unistd.h>

#include "base/version.h"

namespace ferry::runtime {

namespace fs = std::filesystem;

namespace {

nlohmann::json list(const std::vector<std::string>& v) { return nlohmann::json(v); }

std::string plural(size_t n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// Where the full lists are, for the header's lines.
std::string full_list_at(const std::string& record_path) {
  return record_path.empty() ? "--verbose lists them" : "listed in " + record_path;
}

}  // namespace

size_t count_leaves(const nlohmann::json& j) {
  if (!j.is_object()) return 1;
  size_t n = 0;
  for (const auto& [key, value] : j.items()) n += count_leaves(value);
  return n;
}

std::string run_config_path(const Config& c) {
  if (!c.checkpoint.dir.empty()) return (fs::path(c.checkpoint.dir) / "run-config.json").string();
  if (!c.log.metrics.empty()) {
    fs::path p(c.log.metrics);
    p.replace_extension(".run-config.json");
    return p.string();
  }
  return "";
}

nlohmann::json run_config_record(const Config& c, const ConfigSources& s, int64_t resumed_from) {
  nlohmann::json sources = {{"config", s.config}, {"set", list(s.overrides)}};
  if (!c.deepspeed.path.empty()) sources["deepspeed"] = c.deepspeed.path;
  if (!c.fsdp.path.empty()) sources["fsdp"] = c.fsdp.path;
  nlohmann::json r = {{"ferry", kVersion},
                      {"sources", sources},
                      {"world_size", c.world_size},
                      {"resumed_from", resumed_from},
                      {"config", c.resolved}};
  if (!c.deepspeed.path.empty()) {
    r["deepspeed"] = {{"file", c.deepspeed.path},
                      {"resolved", list(c.deepspeed.resolved)},
                      {"auto_resolved", list(c.deepspeed.autos_resolved)},
                      {"ignored", list(c.deepspeed.ignored)},
                      {"warnings", list(c.deepspeed.warnings)}};
  }
  if (!c.fsdp.path.empty()) {
    r["fsdp"] = {{"file", c.fsdp.path},
                 {"resolved", list(c.fsdp.resolved)},
                 {"ignored", list(c.fsdp.ignored)},
                 {"warnings", list(c.fsdp.warnings)}};
  }
  if (!c.trainer_keys.empty()) r["trainer_keys"] = list(c.trainer_keys);
  return r;
}

void write_run_config(const std::string& path, const nlohmann::json& record) {
  const fs::path p(path);
  const fs::path tmp = p.string() + ".tmp" + std::to_string(::getpid());
  try {
    if (p.has_parent_path()) fs::create_directories(p.parent_path());
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << record.dump(2) << "\n";
      out.close();
      if (!out) throw std::runtime_error("cannot write " + tmp.string());
    }
    fs::rename(tmp, p);
  } catch (const std::exception& e) {
    std::error_code ignore;
    fs::remove(tmp, ignore);
    throw std::runtime_error("the run's configuration could not be written to " + path + ": " + e.what());
  }
}

std::string describe_config_header(const Config& c, const ConfigSources& s, const std::string& record_path) {
  std::string from = s.config;
  if (!c.deepspeed.path.empty()) from += " + " + c.deepspeed.path;
  if (!c.fsdp.path.empty()) from += " + " + c.fsdp.path;
  if (!s.overrides.empty()) from += " + " + std::to_string(s.overrides.size()) + " --set";
  std::string out = "config: " + from + ": " + std::to_string(count_leaves(c.resolved)) + " keys resolved; " +
                    (record_path.empty() ? "--verbose prints them (no checkpoint.dir or log.metrics to write them to)"
                                         : "all of them in " + record_path + " (--verbose prints them)") +
                    "\n";
  if (!c.deepspeed.path.empty()) {
    // "key(s) ferry does not implement, ignored": the words tests and users grep for.
    out += "deepspeed config " + c.deepspeed.path + ": " +
           (c.deepspeed.resolved.empty() ? std::string()
                                         : plural(c.deepspeed.resolved.size(), "accelerate key", "accelerate keys") +
                                               " mapped onto ferry's, ") +
           plural(c.deepspeed.autos_resolved.size(), "\"auto\" value", "\"auto\" values") + " resolved; " + std::to_string(c.deepspeed.ignored.size()) +
           " key(s) ferry does not implement, ignored (none changes what is computed); " + full_list_at(record_path) + "\n";
  }
  if (!c.fsdp.path.empty()) {
    out += "fsdp config " + c.fsdp.path + ": " + plural(c.fsdp.resolved.size(), "key", "keys") + " mapped onto ferry's, " +
           std::to_string(c.fsdp.ignored.size()) + " key(s) ignored (none changes what is computed); " +
           full_list_at(record_path) + "\n";
  }
  if (!c.trainer_keys.empty()) {
    out += "Hugging Face Trainer names taken as ferry's keys:";
    for (size_t i = 0; i < c.trainer_keys.size(); ++i) out += (i == 0 ? " " : "; ") + c.trainer_keys[i];
    out += "\n";
  }
  return out;
}

std::string describe_config_full(const Config& c, const ConfigSources& s) {
  std::string from = s.config;
  if (!c.deepspeed.path.empty()) from += " + " + c.deepspeed.path;
  if (!c.fsdp.path.empty()) from += " + " + c.fsdp.path;
  if (!s.overrides.empty()) from += " + --set";
  std::string out = "resolved config (" + from + "):\n" + c.resolved.dump(2) + "\n";
  auto block = [&](const std::string& title, const std::vector<std::string>& lines) {
    if (lines.empty()) return;
    out += title + ":";
    for (const std::string& l : lines) out += "\n  " + l;
    out += "\n";
  };
  block("deepspeed config " + c.deepspeed.path + ": resolved", c.deepspeed.resolved);
  block("deepspeed config " + c.deepspeed.path + ": \"auto\" resolved", c.deepspeed.autos_resolved);
  block("deepspeed config " + c.deepspeed.path + ": ignored (ferry does not implement them; none changes what is computed)",
        c.deepspeed.ignored);
  block("fsdp config " + c.fsdp.path + ": resolved", c.fsdp.resolved);
  block("fsdp config " + c.fsdp.path + ": ignored (none changes what is computed)", c.fsdp.ignored);
  return out;
}

}  // namespace ferry::runtime
