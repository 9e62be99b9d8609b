#include "comm/work.h"

namespace ferry::comm {

bool Work::test() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

bool Work::wait_for(std::chrono::duration<double> timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return done_; });
}

void Work::wait() const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (!error_.empty()) throw CommError(what_ + ": " + error_);
}

std::string Work::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void Work::complete() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    finished_ = Clock::now();
  }
  cv_.notify_all();
}

void Work::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = message.empty() ? "failed" : message;
    done_ = true;
    finished_ = Clock::now();
  }
  cv_.notify_all();
}

void Work::mark_started() {
  std::lock_guard<std::mutex> lock(mu_);
  started_ = Clock::now();
}

Work::Clock::time_point Work::started_at() const {
  std::lock_guard<std::mutex> lock(mu_);
  return started_;
}

Work::Clock::time_point Work::finished_at() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

}  // namespace ferry::comm
