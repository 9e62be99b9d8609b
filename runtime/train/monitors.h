// The metrics records (metrics.h) as scalars for TensorBoard and for DeepSpeed's CSV monitor,
// where people watch runs. Rank 0 owns one; the other ranks never make one.
//
// Tags: train/loss, train/lr, train/grad_norm, train/loss_scale (fp16), eval/loss,
// perf/tokens_per_s, perf/tflops, perf/mfu (with log.peak_tflops), perf/step_time_s,
// perf/overlap, time/ACTIVITY (busy seconds), bytes/ACTIVITY (bytes moved by this rank:
// nvme reads and writes, collectives, pcie_to_device, pcie_to_host), memory/TIER (this
// rank's bytes: device_peak, host_pinned, nvme, ...). The step is the optimizer step.
//
// CSV: one file per tag in DeepSpeed's csv_monitor layout, the tag's '/' made '_'
// (train_loss.csv), a header "step,NAME" (NAME: the tag's last part) and one "step,value"
// row per record. A resumed run appends to the same files (a step logged twice: readers
// keep the last, as ferry plot does with metrics files) and, for TensorBoard, adds an event
// file to the folder that starts with a SessionLog START at the first step it writes, so
// that TensorBoard drops the points the crashed run logged after its checkpoint.
//
// Errors: a folder or file that cannot be made or written throws std::runtime_error naming
// it. Not thread safe: the training loop's thread only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/train/tensorboard.h"

namespace ferry::runtime {

class ScalarMonitors {
 public:
  ScalarMonitors() = default;  // writes nothing
  // Either folder may be empty (that monitor is off).
  ScalarMonitors(const std::string& tensorboard_dir, const std::string& csv_dir);
  bool enabled() const { return tb_ || !csv_dir_.empty(); }
  // The run continues a checkpoint: its first step is `first_step`.
  void resumed_at(int64_t first_step);
  // A step or evaluation record; written through (flushed) at once.
  void write(const nlohmann::json& record);

 private:
  void csv_row(const std::string& tag, int64_t step, double value);

  std::unique_ptr<TensorBoardWriter> tb_;
  std::string csv_dir_;
  std::map<std::string, bool> csv_seen_;  // files this run has written to
};

// The scalars of one record, in a fixed order: (tag, value).
std::vector<std::pair<std::string, double>> record_scalars(const nlohmann::json& record);

}  // namespace ferry::runtime
