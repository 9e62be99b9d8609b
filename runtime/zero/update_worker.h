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
// Threads: submit/ready/wait/drain from one owner thread. The worker thread first pins
// itself to Options::cpus (when given), then sets its OpenMP team size to Options::threads:
// every parallel region its jobs open (Adam's tiles, sums of squares) runs on that many
// threads, on those cores (libgomp creates the worker's team from the worker, so the team
// inherits the pinning). Both ops give the same bits at any thread count. With `threaded`
// false, jobs run in submit() on the caller's thread with the caller's team and affinity;
// `threads` and `cpus` are then unused. A pin the kernel refuses is logged once as a warning
// and the worker runs unpinned. How the trainer chooses: update_worker_options() below and
// docs/design/zero.md "Cores: compute, I/O and Adam".
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "base/cpu_set.h"

namespace ferry::runtime {

class UpdateWorker {
 public:
  struct Options {
    bool threaded = false;  // jobs on a thread of their own; false: inside submit()
    int threads = 1;        // OpenMP team size of the worker thread's regions, >= 1
    CpuSet cpus;            // the worker thread (and its team) pinned here; empty: inherited
  };

  UpdateWorker(int num_units, Options options);
  ~UpdateWorker();  // finishes queued jobs (errors dropped), then stops
  UpdateWorker(const UpdateWorker&) = delete;
  UpdateWorker& operator=(const UpdateWorker&) = delete;

  void submit(int unit, std::function<void()> job);
  bool ready(int unit);
  void wait(int unit);
  void drain();  // every job done; rethrows the first error
  bool threaded() const { return options_.threaded; }
  const Options& options() const { return options_; }

 private:
  struct Job {
    int unit;
    std::function<void()> fn;
  };
  void loop();
  void rethrow_locked();

  Options options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<int> pending_;  // per unit: jobs queued or running
  int running_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

// The trainer's choice (docs/design/zero.md "Cores: compute, I/O and Adam"), from the knob
// schedule.adam_threads (0 = auto), whether a GPU computes, the cores the launcher gave
// this process (`allowed`), the node's online CPUs and this rank's place on the node:
// - the rank's cores: `allowed`, or where it holds more than a fair share of the node
//   (online_cpus / local_size: the launcher did not bind the ranks) its local_rank-th
//   contiguous slice of local_size;
// - cpu device: the compute team owns the cores; Adam runs one thread (adam_threads when
//   set), unpinned (it shares the cores with the compute team as before);
// - a GPU: the host compute team is idle, so Adam gets the rank's cores but one (kept for
//   the training thread's kernel launches, the swapper and the MPI progress thread;
//   io_uring needs no core), one thread per core, pinned to those cores; a rank with one
//   core gets it. adam_threads, when set, fixes the team size on the same cores.
UpdateWorker::Options plan_update_worker(bool threaded, bool gpu, int adam_threads, const CpuSet& allowed,
                                         int online_cpus, int local_rank, int local_size);

// plan_update_worker with this process's affinity (allowed_cpus()) and online CPU count.
UpdateWorker::Options update_worker_options(bool threaded, bool gpu, int adam_threads, int local_rank,
                                            int local_size);

}  // namespace ferry::runtime
