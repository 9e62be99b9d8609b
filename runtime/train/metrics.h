// JSON-lines metrics: one object per line, flushed as written so that a crashed run keeps
// every line up to the crash. Field names are stable; later releases only add fields.
//   step:       {"step", "loss", "lr", "grad_norm", "tokens_per_s", "tflops", "mfu" (with log.peak_tflops),
//                "device_peak_bytes", "step_time_s", "time_s": {activity: busy seconds} (base/trace.h's
//                keys), "bytes": {activity: bytes moved by this rank}, "memory": {"device_cap",
//                "device_peak", "device_in_use", "host_pinned", "host_states", "nvme"} (this rank's
//                bytes per tier), "overlap"}
//                Work is counted in the step in which it ends: with clipping, step N's updates
//                (and their nvme traffic) run into step N+1's forward and count where each ends.
//   evaluation: {"step", "val_loss"}
#pragma once

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace ferry::runtime {

class MetricsWriter {
 public:
  MetricsWriter() = default;  // writes nothing
  // Truncates `path`, or appends to it (a resumed run continues its file: readers such as
  // ferry plot keep the last record of a step seen twice); throws std::runtime_error
  // naming it when it cannot be opened.
  explicit MetricsWriter(const std::string& path, bool append = false);
  void write(const nlohmann::json& record);
  bool enabled() const { return out_.is_open(); }

 private:
  std::ofstream out_;
  std::string path_;
};

}  // namespace ferry::runtime
