// ferry plot: loss and throughput curves of a metrics file (log.metrics, JSON lines) drawn
// by gnuplot (Debian's gnuplot-nox, installed by scripts/setup.sh) into a PNG:
//   top:    training loss per step and validation loss per evaluation, against the step;
//   bottom: tokens/s per step, and achieved TFLOP/s on the right axis where recorded.
// Errors (std::runtime_error) name the file and line: unreadable file, a line that is not
// JSON, no step records, gnuplot missing or failing.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ferry::runtime {

struct MetricsSeries {
  std::vector<double> step, loss, tokens_per_s, tflops;  // one entry per step record
  std::vector<double> eval_step, val_loss;               // one per evaluation record
};

// Reads a metrics file; later records for a step already seen (a resumed run appends
// from its checkpoint's step) replace the earlier ones.
MetricsSeries read_metrics(const std::string& path);

// The gnuplot program drawing `m` into `png` (data inline, as datablocks).
std::string gnuplot_script(const MetricsSeries& m, const std::string& png, const std::string& title);

// Runs gnuplot on the script; throws naming what failed.
void run_gnuplot(const std::string& script, const std::string& png);

}  // namespace ferry::runtime
