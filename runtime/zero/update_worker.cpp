#include "runtime/zero/update_worker.h"

#include <omp.h>

namespace ferry::runtime {

UpdateWorker::UpdateWorker(int num_units, bool threaded)
    : threaded_(threaded), pending_(static_cast<size_t>(num_units), 0) {
  if (threaded_) thread_ = std::thread([this] { loop(); });
}

UpdateWorker::~UpdateWorker() {
  if (!threaded_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void UpdateWorker::submit(int unit, std::function<void()> job) {
  if (!threaded_) {
    job();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (unit >= 0) ++pending_.at(static_cast<size_t>(unit));
    ++running_;
    queue_.push_back({unit, std::move(job)});
  }
  cv_.notify_all();
}

void UpdateWorker::rethrow_locked() {
  if (error_) std::rethrow_exception(error_);
}

bool UpdateWorker::ready(int unit) {
  if (!threaded_) return true;
  std::lock_guard<std::mutex> lock(mu_);
  rethrow_locked();
  return pending_.at(static_cast<size_t>(unit)) == 0;
}

void UpdateWorker::wait(int unit) {
  if (!threaded_) return;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return error_ || pending_.at(static_cast<size_t>(unit)) == 0; });
  rethrow_locked();
}

void UpdateWorker::drain() {
  if (!threaded_) return;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return error_ || running_ == 0; });
  rethrow_locked();
}

void UpdateWorker::loop() {
  omp_set_num_threads(1);  // this thread's regions only (nthreads-var is per thread)
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = static_cast<bool>(error_);
    lock.unlock();
    std::exception_ptr failed;
    if (!skip) {
      try {
        job.fn();
      } catch (...) {
        failed = std::current_exception();
      }
    }
    lock.lock();
    if (failed && !error_) error_ = failed;
    if (job.unit >= 0) --pending_.at(static_cast<size_t>(job.unit));
    --running_;
    cv_.notify_all();
  }
}

}  // namespace ferry::runtime
