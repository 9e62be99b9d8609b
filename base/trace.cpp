#include "base/trace.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace ferry {

namespace {

constexpr std::array<const char*, kActivities> kNames = {
    "compute", "nvme read (params)", "nvme write (params)", "nvme read (optimizer)", "nvme write (optimizer)",
    "all_gather", "reduce_scatter", "all_reduce", "cpu adam", "host to device", "device to host"};
constexpr std::array<const char*, kActivities> kKeys = {
    "compute", "param_read", "param_write", "optim_read", "optim_write",
    "all_gather", "reduce_scatter", "all_reduce", "adam", "upload", "download"};
constexpr int kStepTid = 0;  // the step track; activity a is tid a + 1

}  // namespace

const char* activity_name(Activity a) { return kNames.at(static_cast<size_t>(a)); }
const char* activity_key(Activity a) { return kKeys.at(static_cast<size_t>(a)); }

double StepBreakdown::sum() const {
  double s = 0;
  for (double b : busy_s) s += b;
  return s;
}

Tracer::Tracer(int rank) : rank_(rank), origin_(Clock::now()) {}

Tracer::~Tracer() {
  if (!out_.is_open()) return;
  out_ << "\n]}\n";
}

std::string trace_path_for_rank(const std::string& path, int rank) {
  const std::string tag = ".rank" + std::to_string(rank);
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path + tag + ".json";
  return path.substr(0, dot) + tag + path.substr(dot);
}

void Tracer::open_file(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  out_.open(path, std::ios::trunc);
  if (!out_) throw std::runtime_error("log.trace: cannot create " + path);
  path_ = path;
  out_ << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  first_ = true;
  auto meta = [&](int tid, const char* what, const std::string& name) {
    nlohmann::json m = {{"ph", "M"}, {"pid", rank_}, {"tid", tid}, {"name", what}, {"args", {{"name", name}}}};
    write_line(m.dump());
  };
  meta(kStepTid, "process_name", "rank " + std::to_string(rank_));
  meta(kStepTid, "thread_name", "step");
  for (size_t a = 0; a < kActivities; ++a) {
    meta(static_cast<int>(a) + 1, "thread_name", kNames[a]);
    nlohmann::json order = {{"ph", "M"}, {"pid", rank_}, {"tid", static_cast<int>(a) + 1},
                            {"name", "thread_sort_index"}, {"args", {{"sort_index", static_cast<int>(a) + 1}}}};
    write_line(order.dump());
  }
}

double Tracer::us(Clock::time_point t) const { return std::chrono::duration<double, std::micro>(t - origin_).count(); }

void Tracer::write_line(const std::string& line) {
  out_ << (first_ ? "" : ",\n") << line;
  first_ = false;
}

void Tracer::record(Activity activity, const std::string& name, Clock::time_point t0, Clock::time_point t1,
                    int64_t step_arg, uint64_t bytes, Clock::time_point queued) {
  std::lock_guard<std::mutex> lock(mu_);
  record_locked(activity, name, t0, t1, step_arg, bytes, queued);
}

void Tracer::record_device(Activity activity, const std::string& name, DeviceClock::Mark m0, DeviceClock::Mark m1,
                           uint64_t bytes) {
  if (!m0 || !m1) return;
  std::lock_guard<std::mutex> lock(mu_);
  device_spans_.push_back({activity, name, std::move(m0), std::move(m1), bytes});
}

void Tracer::set_anchor(DeviceClock* clock, DeviceClock::Mark mark, Clock::time_point host) {
  std::lock_guard<std::mutex> lock(mu_);
  clock_ = clock;
  anchor_ = std::move(mark);
  anchor_host_ = host;
}

void Tracer::resolve_device_spans() {
  if (!clock_ || !anchor_) return;
  std::vector<DeviceSpan> waiting;
  for (DeviceSpan& d : device_spans_) {
    const double a = clock_->seconds_between(anchor_, d.m0), b = clock_->seconds_between(anchor_, d.m1);
    if (std::isnan(a) || std::isnan(b)) {
      waiting.push_back(std::move(d));
      continue;
    }
    const auto at = [&](double s) {
      return anchor_host_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
    };
    record_locked(d.activity, d.name, at(a), at(b), -1, d.bytes);
  }
  device_spans_.swap(waiting);
}

void Tracer::record_locked(Activity activity, const std::string& name, Clock::time_point t0, Clock::time_point t1,
                           int64_t step_arg, uint64_t bytes, Clock::time_point queued) {
  if (t1 < t0) t1 = t0;
  const auto a = static_cast<size_t>(activity);
  busy_[a] += std::chrono::duration<double>(t1 - t0).count();
  bytes_[a] += bytes;
  if (!out_.is_open()) return;
  nlohmann::json e = {{"ph", "X"},       {"pid", rank_},   {"tid", static_cast<int>(a) + 1},
                      {"name", name},    {"cat", kKeys[a]}, {"ts", us(t0)},
                      {"dur", us(t1) - us(t0)}};
  if (step_arg >= 0 || in_step_) {
    e["args"] = {{"step", step_arg >= 0 ? step_arg : step_}};
  } else {
    e["args"] = {{"after_step", step_}};
  }
  if (queued != Clock::time_point{}) e["args"]["queued_ts"] = us(queued);
  write_line(e.dump());
}

void Tracer::begin_step(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  step_ = step;
  in_step_ = true;
  step_t0_ = Clock::now();
  busy_.fill(0);
  bytes_.fill(0);
  if (!out_.is_open()) return;
  nlohmann::json e = {{"ph", "i"}, {"s", "p"}, {"pid", rank_}, {"tid", kStepTid}, {"name", "step " + std::to_string(step) + " begins"},
                      {"ts", us(step_t0_)}};
  write_line(e.dump());
}

StepBreakdown Tracer::end_step() {
  const Clock::time_point t1 = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  resolve_device_spans();
  in_step_ = false;
  StepBreakdown b;
  b.wall_s = std::chrono::duration<double>(t1 - step_t0_).count();
  b.busy_s = busy_;
  b.bytes = bytes_;
  if (out_.is_open()) {
    nlohmann::json e = {{"ph", "X"}, {"pid", rank_}, {"tid", kStepTid}, {"name", "step " + std::to_string(step_)},
                        {"cat", "step"}, {"ts", us(step_t0_)}, {"dur", us(t1) - us(step_t0_)}};
    nlohmann::json args = {{"step", step_}, {"overlap", b.overlap()}};
    for (size_t a = 0; a < kActivities; ++a) args[std::string(kKeys[a]) + "_s"] = b.busy_s[a];
    e["args"] = args;
    write_line(e.dump());
    out_.flush();
  }
  return b;
}

void Tracer::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  if (out_.is_open()) out_.flush();
}

}  // namespace ferry
