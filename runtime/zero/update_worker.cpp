#include "runtime/zero/update_worker.h"

#include <omp.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>

#include "base/log.h"

namespace ferry::runtime {

UpdateWorker::UpdateWorker(int num_units, Options options)
    : options_(std::move(options)), pending_(static_cast<size_t>(num_units), 0) {
  if (options_.threads < 1) throw std::invalid_argument("UpdateWorker: threads must be >= 1");
  if (!options_.threaded) return;
  log::info(log::Subsys::optim, "update thread: " + std::to_string(options_.threads) + " OpenMP thread(s), " +
                                     (options_.cpus.empty() ? "unpinned" : "cpus " + options_.cpus.to_string()));
  thread_ = std::thread([this] { loop(); });
}

UpdateWorker::~UpdateWorker() {
  if (!options_.threaded) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void UpdateWorker::submit(int unit, std::function<void()> job) {
  if (!options_.threaded) {
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
  if (!options_.threaded) return true;
  std::lock_guard<std::mutex> lock(mu_);
  rethrow_locked();
  return pending_.at(static_cast<size_t>(unit)) == 0;
}

void UpdateWorker::wait(int unit) {
  if (!options_.threaded) return;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return error_ || pending_.at(static_cast<size_t>(unit)) == 0; });
  rethrow_locked();
}

void UpdateWorker::drain() {
  if (!options_.threaded) return;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return error_ || running_ == 0; });
  rethrow_locked();
}

void UpdateWorker::loop() {
  // Before the first parallel region: libgomp creates this thread's team from it, and the
  // new threads inherit its mask.
  if (!options_.cpus.empty()) {
    try {
      pin_this_thread(options_.cpus);
    } catch (const std::system_error& e) {
      log::warn(log::Subsys::optim, std::string("update thread left unpinned: ") + e.what());
    }
  }
  omp_set_num_threads(options_.threads);  // this thread's regions only (nthreads-var is per thread)
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

UpdateWorker::Options plan_update_worker(bool threaded, bool gpu, int adam_threads, const CpuSet& allowed,
                                         int online_cpus, int local_rank, int local_size) {
  UpdateWorker::Options o;
  o.threaded = threaded;
  if (!gpu) {
    // Beside the compute team on the same cores: one thread (docs/design/zero.md, "Cores").
    o.threads = adam_threads > 0 ? adam_threads : 1;
    return o;
  }
  CpuSet rank = allowed;
  const int share = std::max(1, online_cpus / std::max(1, local_size));
  if (local_size > 1 && allowed.size() > share && allowed.size() >= local_size) {
    rank = allowed.slice(local_rank, local_size);  // unbound ranks: split the set between them
  }
  o.cpus = rank.size() > 1 ? rank.without_last(1) : rank;
  o.threads = adam_threads > 0 ? adam_threads : std::max(1, o.cpus.size());
  return o;
}

UpdateWorker::Options update_worker_options(bool threaded, bool gpu, int adam_threads, int local_rank,
                                            int local_size) {
  CpuSet allowed;
  try {
    allowed = allowed_cpus();
  } catch (const std::system_error& e) {
    log::warn(log::Subsys::optim, std::string("cannot read this process's cores: ") + e.what());
  }
  const int online = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return plan_update_worker(threaded, gpu, adam_threads, allowed, online, local_rank, local_size);
}

}  // namespace ferry::runtime
