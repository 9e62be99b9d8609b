// CpuSet: a set of logical CPU ids (what Linux calls CPUs: cores, or hyperthreads where
// they are on), the cores a thread may run on, and pinning a thread to a set.
//
// The launcher binds a rank with the process's affinity mask (mpiexec -bind-to, srun
// --cpu-bind, taskset); allowed_cpus() reads it back. Threads a thread creates inherit its
// mask, so pinning a thread before its first OpenMP parallel region pins the team libgomp
// then creates for it (the team is that thread's own pool, created on first use).
//
// Text form: Linux's cpulist ("0-3,8,10-11"), as /proc/self/status and taskset -c write it.
// Threads: a CpuSet is a plain value (copy freely; const use from any thread).
// allowed_cpus() and pin_this_thread() act on the calling thread only.
// Errors: parse() throws std::invalid_argument naming the text; allowed_cpus() and
// pin_this_thread() throw std::system_error with the call's errno (pinning to a set with no
// CPU the process may use is EINVAL).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ferry {

class CpuSet {
 public:
  CpuSet() = default;                       // empty: "no set given"
  explicit CpuSet(std::vector<int> cpus);   // any order, duplicates dropped; ids >= 0
  static CpuSet parse(std::string_view cpulist);

  const std::vector<int>& cpus() const { return cpus_; }  // ascending
  int size() const { return static_cast<int>(cpus_.size()); }
  bool empty() const { return cpus_.empty(); }
  bool contains(int cpu) const;
  std::string to_string() const;  // cpulist, "" when empty

  // The i-th of n contiguous slices (in ascending id order) of near-equal size, the
  // first size() % n slices one larger; 0 <= i < n. Never empty when size() >= n.
  CpuSet slice(int i, int n) const;
  CpuSet without_last(int k) const;  // all but the k highest ids (empty when k >= size())

  friend bool operator==(const CpuSet&, const CpuSet&) = default;

 private:
  std::vector<int> cpus_;
};

// The calling thread's affinity mask (sched_getaffinity). On the main thread before
// anything pinned it, that is the set the launcher gave the process.
CpuSet allowed_cpus();

// Restricts the calling thread to `set` (sched_setaffinity on its own thread id). Threads
// it creates afterwards inherit the set; threads already running are unaffected.
void pin_this_thread(const CpuSet& set);

}  // namespace ferry
