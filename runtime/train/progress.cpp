#include "runtime/train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ferry::runtime {

bool progress_bar_wanted(const std::string& mode, int fd) {
  if (mode == "bar") return true;
  if (mode == "lines") return false;
  return ::isatty(fd) == 1;
}

std::string format_duration(double seconds) {
  const auto s = static_cast<long long>(std::llround(std::max(0.0, seconds)));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  }
  return buf;
}

void Progress::step(int64_t step, double loss, double tokens_per_s, double step_seconds) {
  // The first step pays for warm-up (page faults, the order recording): it seeds the average
  // and the following steps replace it quickly.
  step_s_ = step_ == 0 ? step_seconds : 0.8 * step_s_ + 0.2 * step_seconds;
  step_ = step;
  loss_ = loss;
  tokens_per_s_ = tokens_per_s;
  if (bar_) draw();
}

double Progress::eta_seconds() const { return static_cast<double>(total_ - step_) * step_s_; }

void Progress::say(const std::string& text) {
  clear();
  out_ << text;
  if (bar_ && step_ > 0) draw();
  out_.flush();
}

void Progress::finish() {
  if (!drawn_) return;
  out_ << "\n";
  out_.flush();
  drawn_ = false;
}

void Progress::clear() {
  if (!drawn_) return;
  out_ << "\r\x1b[K";  // carriage return, erase to the end of the line
  drawn_ = false;
}

void Progress::draw() {
  constexpr int kWidth = 20;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * step_ / total_) : kWidth;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '.');
  char tail[160];
  const double kt = tokens_per_s_ / 1000.0;
  std::snprintf(tail, sizeof tail, " %lld/%lld %3d%% | loss %.4f | %.1fk tok/s | %.2f s/step | ETA %s",
                static_cast<long long>(step_), static_cast<long long>(total_),
                total_ > 0 ? static_cast<int>(100 * step_ / total_) : 100, loss_, kt, step_s_,
                format_duration(eta_seconds()).c_str());
  out_ << "\r[" << bar << "]" << tail << "\x1b[K";
  out_.flush();
  drawn_ = true;
}

}  // namespace ferry::runtime
