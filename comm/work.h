// Work: the handle of one collective in flight.
// Thread safety: complete()/fail() are called by the backend (any thread), wait()/test()
// by the issuing thread; all members are safe to call concurrently.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

namespace ferry::comm {

class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Work {
 public:
  explicit Work(std::string what) : what_(std::move(what)) {}
  // True once the collective has finished (successfully or not).
  bool test() const;
  // Waits at most `timeout`; returns test(). Does not throw on failure: see error().
  bool wait_for(std::chrono::duration<double> timeout) const;
  // Waits until finished; throws CommError with the backend's message if it failed.
  void wait() const;
  std::string error() const;  // "" while running or after success
  const std::string& what() const { return what_; }

  void complete();
  void fail(const std::string& message);

  // When the backend began moving data (mark_started; construction time if it never says)
  // and when it finished: the span a trace shows for this collective.
  using Clock = std::chrono::steady_clock;
  void mark_started();
  Clock::time_point started_at() const;
  Clock::time_point finished_at() const;  // meaningful once test() is true

  // A device-side completion marker the backend attaches at issue (NCCL: the event
  // recorded after this collective on its stream), so a consumer can wait for exactly this
  // collective without the host (Communicator::order_consumer). Null for host backends.
  // Set once by the issuing thread before the Work is handed out. device_start is the
  // event recorded just before the collective, so a trace can time it on the device.
  std::shared_ptr<void> device_marker, device_start;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  Clock::time_point started_ = Clock::now(), finished_{};
  std::string error_;
  std::string what_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace ferry::comm
