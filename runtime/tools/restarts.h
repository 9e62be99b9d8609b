// ferry launch --max-restarts: runs the job (mpiexec over a hosts file) and, when it fails,
// starts it again from the latest checkpoint, as torchrun's --max-restarts does.
//
// Each attempt runs mpiexec with the ranks' output passed through; the last lines are
// kept so that the restart is logged with its cause (mpiexec's BAD TERMINATION report,
// the watchdog's, or the first error line). Before a restart every host is probed (a
// one-rank `true` through the same launcher, with a timeout): with --min-nodes M the job
// goes on over the hosts that answer when at least M do, at the smaller world size. The
// checkpoint re-shards by itself (any world size loads it); the global batch is kept by
// raising gradient accumulation when the batch divides over the new ranks, otherwise the
// change is logged. A failure that would repeat (exit status 2: bad input or config) and
// an interrupted launcher stop at once.
// Errors: std::invalid_argument naming the option or the config key (exit 2 at the CLI).
// Threads: one; it forks and waits. SIGINT/SIGTERM to the launcher reach the job (its
// process group) and end the loop.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "runtime/tools/launch.h"

namespace ferry::runtime {

struct RestartOptions {
  int max_restarts = 0;
  int min_nodes = 0;                 // 0: every host of the file
  std::string launcher_exec;         // mpiexec -launcher ssh -launcher-exec SCRIPT (e.g. a container or namespace)
  double probe_timeout_s = 20;       // per host, before a restart
  double pause_s = 2;                // between attempts
};

// The batch a restart at `world` ranks runs with: the same global batch through
// accumulation where global / (micro x world) is whole, else the old accumulation.
struct BatchPlan {
  int64_t global = 0, micro = 0, accum = 0;
  bool kept = true;
};
BatchPlan batch_for(int64_t global, int64_t micro, int64_t accum, int world);

// The line that says why an attempt ended: from the tail of its output, mpiexec's report
// of a rank that died, the watchdog's report, or the first error; else the exit status.
// `pids` is ferry train's startup line ("... | pids: r0=PID r1=PID ..."), or empty: it turns
// the pid that mpiexec names into a rank.
std::string failure_cause(const std::vector<std::string>& tail, int status, const std::string& pids = "");

// Runs o's job with restarts; returns the last attempt's exit status.
int supervise(const LaunchOptions& o, const RestartOptions& r, std::ostream& log);

}  // namespace ferry::runtime
