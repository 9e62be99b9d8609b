// Swapper: moves data into pinned buffers ahead of use, on its own I/O thread.
//
// submit(job) takes a buffer from the pinned pool and queues job(buffer) (typically a
// Storage read); wait(ticket) returns the filled buffer once the job has run, rethrowing
// its error. The caller gives the buffer back with release(). Jobs run one at a time, in
// submission order; the pool's size bounds the buffers in flight (submit blocks when every
// buffer is taken), and max_pending bounds the queued jobs.
// Threads: submit/wait/release/cancel from one owner thread; jobs run on the swapper's thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "offload/pinned_pool.h"

namespace ferry::offload {

class Swapper {
 public:
  using Job = std::function<void(void* buffer)>;
  using Ticket = uint64_t;

  Swapper(PinnedPool& pool, int max_pending);
  ~Swapper();  // finishes queued jobs, then stops
  Swapper(const Swapper&) = delete;
  Swapper& operator=(const Swapper&) = delete;

  Ticket submit(Job job);
  void* wait(Ticket t);  // the buffer, after its job ran; throws the job's exception
  void release(void* buffer) { pool_.release(buffer); }
  // Waits for the job and returns its buffer to the pool, ignoring any error: for
  // prefetches that turn out not to be needed.
  void cancel(Ticket t);

 private:
  struct Entry {
    Job job;
    void* buffer = nullptr;
    bool done = false;
    std::exception_ptr error;
  };
  void loop();

  PinnedPool& pool_;
  int max_pending_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<Ticket, Entry> entries_;
  std::deque<Ticket> queue_;
  Ticket next_ = 1;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ferry::offload
