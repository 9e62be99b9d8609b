// Tracer: what each activity of a rank did when, for the step breakdown and for a Chrome
// trace event file (chrome://tracing and https://ui.perfetto.dev open it).
//
// Activities are tracks: compute (the model's kernels, unit by unit), the NVMe reads and
// writes of each store, each kind of collective, CPU Adam, and the steps themselves.
// Every span recorded between begin_step() and end_step() adds its duration to that
// step's per-activity total (a span is counted in the step in which it ends); the overlap
// ratio is the sum of those totals over the step's wall time: 1 for a sequential step,
// up to the number of activities that can run at once.
// File: with open_file(), each span is written as it is recorded, one JSON object per line
// inside {"traceEvents": [ ... ]}; a run that dies keeps every line so far (the viewers
// accept the unterminated array). Timestamps are microseconds since the Tracer was built;
// pid is the rank, tid the activity; args.step is the step a span ended in, or
// args.after_step the step it followed (evaluation, checkpoints, updates still running).
// Threads: record() and span() are safe from any thread (the I/O threads, the optimizer
// thread and the training thread all record); begin_step()/end_step() from the training
// thread. Cost without a file: one clock read per span and a short locked add.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ferry {

enum class Activity : uint8_t {
  compute,
  param_read,      // parameter shards from NVMe
  param_write,     // updated parameter shards to NVMe
  optim_read,      // master, m, v tiles from NVMe
  optim_write,     // master, m, v tiles to NVMe
  all_gather,
  reduce_scatter,
  all_reduce,
  adam,            // CPU Adam (and the gradient norm's sums of squares)
  upload,          // host -> device copies of shards (a GPU's copy stream)
  download,        // device -> host copies of reduced gradient shards
  kCount
};
constexpr size_t kActivities = static_cast<size_t>(Activity::kCount);
const char* activity_name(Activity a);  // "compute", "nvme read (params)", ...
const char* activity_key(Activity a);   // "compute", "param_read", ...: metrics field names

struct StepBreakdown {
  double wall_s = 0;
  std::array<double, kActivities> busy_s{};  // seconds per activity
  std::array<uint64_t, kActivities> bytes{};  // bytes moved per activity: nvme transfers, collective buffers
  double sum() const;
  double overlap() const { return wall_s > 0 ? sum() / wall_s : 0; }
};

// The clock of a device that runs its work asynchronously (a GPU): a mark is recorded in
// its queue (a CUDA event) and has a time once the device has passed it. Implemented by
// nn's cuda device; host devices have none (their host-clock spans are device time).
class DeviceClock {
 public:
  virtual ~DeviceClock() = default;
  using Mark = std::shared_ptr<void>;
  // Seconds from mark `a` to mark `b` (negative when b came first), once the device has
  // passed both; NaN before. Thread safe.
  virtual double seconds_between(const Mark& a, const Mark& b) = 0;
  // A mark recorded now, returned once the device has passed it: an anchor for
  // Tracer::set_anchor (cheap right after a host read, when the queue is empty).
  virtual Mark passed_mark() = 0;
};

class Tracer {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Tracer(int rank);
  ~Tracer();  // closes the file's array
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // Starts writing events to `path` (truncated). Throws std::runtime_error naming it.
  void open_file(const std::string& path);
  bool writing() const { return out_.is_open(); }
  const std::string& path() const { return path_; }

  // A span [t0, t1] of `activity`; `name` labels it ("block.3", "adam block.3").
  // `bytes`: what the span moved (nvme bytes, a collective's full buffer), summed per step.
  // `queued`, when set: when the work was asked for (a prefetched read queued on the
  // swapper's thread), written as args.queued_ts so that the file shows how far ahead it
  // was issued, apart from when the disk got to it.
  void record(Activity activity, const std::string& name, Clock::time_point t0, Clock::time_point t1,
              int64_t step_arg = -1, uint64_t bytes = 0, Clock::time_point queued = {});
  // RAII: records from construction to destruction. A null tracer records nothing.
  class Span {
   public:
    Span(Tracer* t, Activity a, std::string name, uint64_t bytes = 0)
        : t_(t), a_(a), name_(std::move(name)), bytes_(bytes), t0_(Clock::now()) {}
    ~Span() {
      if (t_) t_->record(a_, name_, t0_, Clock::now(), -1, bytes_, queued_);
    }
    void set_queued(Clock::time_point queued) { queued_ = queued; }
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    Tracer* t_;
    Activity a_;
    std::string name_;
    uint64_t bytes_;
    Clock::time_point t0_;
    Clock::time_point queued_{};
  };

  // Device spans (review F6: on a GPU, host spans measure enqueue time): [m0, m1] are
  // marks in a device's queue, placed on the host timeline through the latest anchor (a
  // mark the device passed at a known host time, set_anchor: right after a host read
  // that waited for the device). Spans are resolved at end_step() once the device has
  // passed both marks; one not yet passed waits for a later end_step (it is counted in
  // the step in which it is resolved). Thread safe.
  void record_device(Activity activity, const std::string& name, DeviceClock::Mark m0, DeviceClock::Mark m1,
                     uint64_t bytes = 0);
  void set_anchor(DeviceClock* clock, DeviceClock::Mark mark, Clock::time_point host);

  void begin_step(int64_t step);  // step is 1-based
  StepBreakdown end_step();       // marks the step's end in the file, returns its totals
  void flush();

 private:
  void write_line(const std::string& line);
  double us(Clock::time_point t) const;
  void resolve_device_spans();  // under mu_: records the spans the device has passed
  void record_locked(Activity activity, const std::string& name, Clock::time_point t0, Clock::time_point t1,
                     int64_t step_arg, uint64_t bytes, Clock::time_point queued = {});

  struct DeviceSpan {
    Activity activity;
    std::string name;
    DeviceClock::Mark m0, m1;
    uint64_t bytes;
  };
  std::vector<DeviceSpan> device_spans_;
  DeviceClock* clock_ = nullptr;
  DeviceClock::Mark anchor_;
  Clock::time_point anchor_host_{};

  int rank_;
  Clock::time_point origin_;
  std::mutex mu_;
  std::ofstream out_;
  std::string path_;
  bool first_ = true;
  int64_t step_ = 0;
  bool in_step_ = false;
  Clock::time_point step_t0_{};
  std::array<double, kActivities> busy_{};
  std::array<uint64_t, kActivities> bytes_{};
};

// "trace.json" at rank 3 -> "trace.rank3.json": every rank writes its own file.
std::string trace_path_for_rank(const std::string& path, int rank);

}  // namespace ferry
