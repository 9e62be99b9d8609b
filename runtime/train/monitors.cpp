#include "runtime/train/monitors.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace ferry::runtime {

namespace fs = std::filesystem;

namespace {

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::vector<std::pair<std::string, double>> record_scalars(const nlohmann::json& r) {
  std::vector<std::pair<std::string, double>> out;
  const auto plain = [&](const char* key, const char* tag) {
    if (r.contains(key) && r[key].is_number()) out.emplace_back(tag, r[key].get<double>());
  };
  const auto group = [&](const char* key, const std::string& prefix) {
    if (!r.contains(key) || !r[key].is_object()) return;
    for (const auto& [name, v] : r[key].items())
      if (v.is_number()) out.emplace_back(prefix + name, v.get<double>());
  };
  plain("loss", "train/loss");
  plain("lr", "train/lr");
  plain("grad_norm", "train/grad_norm");
  plain("loss_scale", "train/loss_scale");
  plain("val_loss", "eval/loss");
  plain("tokens_per_s", "perf/tokens_per_s");
  plain("tflops", "perf/tflops");
  plain("mfu", "perf/mfu");
  plain("step_time_s", "perf/step_time_s");
  plain("overlap", "perf/overlap");
  group("time_s", "time/");
  group("bytes", "bytes/");
  group("pcie_bytes", "bytes/pcie_");
  group("memory", "memory/");
  return out;
}

ScalarMonitors::ScalarMonitors(const std::string& tensorboard_dir, const std::string& csv_dir) : csv_dir_(csv_dir) {
  if (!tensorboard_dir.empty()) tb_ = std::make_unique<TensorBoardWriter>(tensorboard_dir, "");
  if (!csv_dir_.empty()) {
    std::error_code ec;
    fs::create_directories(csv_dir_, ec);
    if (ec) throw std::runtime_error("log.csv: cannot create the folder '" + csv_dir_ + "': " + ec.message());
  }
}

void ScalarMonitors::resumed_at(int64_t first_step) {
  if (tb_) tb_->session_start(first_step, wall_now());
}

void ScalarMonitors::write(const nlohmann::json& record) {
  if (!enabled() || !record.contains("step")) return;
  const int64_t step = record["step"].get<int64_t>();
  const double now = wall_now();
  for (const auto& [tag, value] : record_scalars(record)) {
    if (tb_) tb_->add_scalar(tag, step, value, now);
    if (!csv_dir_.empty()) csv_row(tag, step, value);
  }
  if (tb_) tb_->flush();
}

void ScalarMonitors::csv_row(const std::string& tag, int64_t step, double value) {
  std::string name = tag;
  for (char& c : name)
    if (c == '/' || c == ' ') c = '_';
  const fs::path file = fs::path(csv_dir_) / (name + ".csv");
  bool& seen = csv_seen_[name];
  // A header where the file starts: not again when a resumed run appends.
  std::error_code ec;
  const bool fresh = !seen && (!fs::exists(file, ec) || fs::file_size(file, ec) == 0);
  std::ofstream out(file, std::ios::app);
  if (fresh) out << "step," << tag.substr(tag.rfind('/') + 1) << "\n";
  char v[32];
  std::snprintf(v, sizeof v, "%.9g", value);
  out << step << ',' << v << "\n";
  out.flush();
  if (!out) throw std::runtime_error("log.csv: cannot write '" + file.string() + "'");
  seen = true;
}

}  // namespace ferry::runtime
