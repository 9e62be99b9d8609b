#include "offload/swapper.h"

#include <stdexcept>

namespace ferry::offload {

Swapper::Swapper(PinnedPool& pool, int max_pending) : pool_(pool), max_pending_(std::max(1, max_pending)) {
  thread_ = std::thread([this] { loop(); });
}

Swapper::~Swapper() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (auto& [t, e] : entries_) pool_.release(e.buffer);  // results nobody collected
}

Swapper::Ticket Swapper::submit(Job job) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return static_cast<int>(queue_.size()) < max_pending_; });
  }
  void* buffer = pool_.acquire();  // blocks while every buffer is in flight
  std::lock_guard<std::mutex> lock(mu_);
  const Ticket t = next_++;
  entries_[t] = Entry{std::move(job), buffer, false, nullptr};
  queue_.push_back(t);
  cv_.notify_all();
  return t;
}

void* Swapper::wait(Ticket t) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = entries_.find(t);
  if (it == entries_.end()) throw std::logic_error("Swapper::wait: unknown ticket");
  cv_.wait(lock, [&] { return it->second.done; });
  Entry e = std::move(it->second);
  entries_.erase(it);
  if (e.error) {
    pool_.release(e.buffer);
    std::rethrow_exception(e.error);
  }
  return e.buffer;
}

void Swapper::cancel(Ticket t) {
  try {
    pool_.release(wait(t));
  } catch (...) {
    // a prefetch nobody needs: its error does not matter
  }
}

void Swapper::loop() {
  while (true) {
    Ticket t;
    Job job;
    void* buffer;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      t = queue_.front();
      queue_.pop_front();
      job = std::move(entries_[t].job);
      buffer = entries_[t].buffer;
    }
    cv_.notify_all();  // a submit may wait for queue room
    std::exception_ptr error;
    try {
      job(buffer);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      entries_[t].done = true;
      entries_[t].error = error;
    }
    cv_.notify_all();
  }
}

}  // namespace ferry::offload
