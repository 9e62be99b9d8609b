// UpdateWorker: runs the optimizer's per-unit work (gradient norms, CPU Adam, writing the
// new state back) on a thread of its own, so that it overlaps the model's compute, and
// tells the training thread when a unit's new weights may be read.
//
// Jobs run one at a time in submission order. Each job names the unit whose weights it
// changes (or -1); ready(u) is true when no such job for u is queued or running, and
// wait(u) blocks until then: the next forward waits only for the unit it is about to use,
// never for unrelated updates. With `threaded` false every job runs inside submit(), which
// gives the plain sequential order with the same code.
// Errors: the first exception a job throws is kept; later jobs are skipped, and wait(),
// ready() and drain() rethrow it on the training thread (the run then stops, and the
// optimizer's two-slot NVMe state keeps the last committed step intact).
// Threads: submit/ready/wait/drain from one owner thread. The worker's own OpenMP parallel
// regions (Adam, sums of squares) use one thread: they run beside the compute team, and a
// second full team on the same cores measured millisecond stalls of both (spinning OpenMP
// threads outnumbering the cores). Both ops give the same bits at any thread count.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ferry::runtime {

class UpdateWorker {
 public:
  UpdateWorker(int num_units, bool threaded);
  ~UpdateWorker();  // finishes queued jobs (errors dropped), then stops
  UpdateWorker(const UpdateWorker&) = delete;
  UpdateWorker& operator=(const UpdateWorker&) = delete;

  void submit(int unit, std::function<void()> job);
  bool ready(int unit);
  void wait(int unit);
  void drain();  // every job done; rethrows the first error
  bool threaded() const { return threaded_; }

 private:
  struct Job {
    int unit;
    std::function<void()> fn;
  };
  void loop();
  void rethrow_locked();

  bool threaded_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<int> pending_;  // per unit: jobs queued or running
  int running_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace ferry::runtime
