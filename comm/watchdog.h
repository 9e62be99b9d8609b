// Watchdog: turns a collective that does not finish in time into a report.
//
// Backends call begin() when a collective is issued and end() when it completes. A
// background thread checks the oldest unfinished one; when it is older than the timeout,
// on_expire runs once, on the watchdog's thread, with a message naming the operation and
// how long it has waited. The MPI backend's on_expire prints it and calls MPI_Abort.
// Thread safety: begin/end may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace ferry::comm {

class Watchdog {
 public:
  using Expire = std::function<void(const std::string& report)>;
  // timeout_s <= 0 disables the checks (until set_timeout gives a positive one).
  Watchdog(double timeout_s, Expire on_expire);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  uint64_t begin(const std::string& what);
  void end(uint64_t id);
  void set_timeout(double timeout_s);

 private:
  using clock = std::chrono::steady_clock;
  void loop();

  double timeout_s_;
  Expire on_expire_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::pair<std::string, clock::time_point>> pending_;
  uint64_t next_ = 1;
  bool stop_ = false, fired_ = false;
  std::thread thread_;
};

}  // namespace ferry::comm
