// The run's progress on rank 0's stdout: on an interactive terminal a bar redrawn in place
// after every step (steps done, loss, throughput, ETA); otherwise nothing beyond the plain
// step lines, so that logs and CI output stay one line per event.
//   [##########..........] 300/600  50% | loss 1.9231 | 15.2k tok/s | 0.13 s/step | ETA 0:39
// Lines printed through say() appear above the bar, which is redrawn under them.
// Not thread-safe: the training thread only.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace ferry::runtime {

// log.progress: "bar", "lines", or "auto" (a bar when `fd` is a terminal).
bool progress_bar_wanted(const std::string& mode, int fd);

// "1:02:03", "4:05", "0:07".
std::string format_duration(double seconds);

class Progress {
 public:
  Progress(std::ostream& out, int64_t total_steps, bool bar) : out_(out), total_(total_steps), bar_(bar) {}
  ~Progress() { finish(); }

  // After each step: updates the ETA's step time (an average that follows recent steps) and
  // redraws the bar.
  void step(int64_t step, double loss, double tokens_per_s, double step_seconds);
  // A whole line (with its '\n') above the bar.
  void say(const std::string& text);
  // Leaves the bar's last state on its own line.
  void finish();
  double eta_seconds() const;
  bool bar() const { return bar_; }

 private:
  void clear();
  void draw();

  std::ostream& out_;
  int64_t total_;
  bool bar_;
  bool drawn_ = false;
  int64_t step_ = 0;
  double loss_ = 0, tokens_per_s_ = 0, step_s_ = 0;
};

}  // namespace ferry::runtime
