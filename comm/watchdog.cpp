#include "comm/watchdog.h"

#include <algorithm>
#include <cstdio>

namespace ferry::comm {

Watchdog::Watchdog(double timeout_s, Expire on_expire) : timeout_s_(timeout_s), on_expire_(std::move(on_expire)) {
  thread_ = std::thread([this] { loop(); });
}

void Watchdog::set_timeout(double timeout_s) {
  std::lock_guard<std::mutex> lock(mu_);
  timeout_s_ = timeout_s;
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t Watchdog::begin(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_++;
  pending_.emplace(id, std::make_pair(what, clock::now()));
  return id;
}

void Watchdog::end(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.erase(id);
}

void Watchdog::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    // Check often enough that the report comes within ~5% of the timeout (at most 1 s late).
    const double tick = timeout_s_ > 0 ? std::min(1.0, std::max(0.01, timeout_s_ / 20)) : 1.0;
    cv_.wait_for(lock, std::chrono::duration<double>(tick));
    if (stop_ || fired_ || pending_.empty() || timeout_s_ <= 0) continue;
    const auto& [what, since] = pending_.begin()->second;  // ids grow: the first is the oldest
    const double waited = std::chrono::duration<double>(clock::now() - since).count();
    if (waited < timeout_s_) continue;
    fired_ = true;
    char buf[96];
    std::snprintf(buf, sizeof buf, " has not completed after %.1f s (comm.timeout_s = %g)", waited, timeout_s_);
    const std::string report = what + buf;
    lock.unlock();
    on_expire_(report);
    lock.lock();
  }
}

}  // namespace ferry::comm
