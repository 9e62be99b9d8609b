#pragma once

#include <functional>

#include "benchmarks/bench_report.h"

namespace ferry::bench {

struct CommBenchOptions {
  bool quick = false;  // sizes up to 16 MiB, fewer repetitions (smoke test)
};

// Run under mpiexec -n N (N >= 1). Fills `report` on rank 0 and calls `report_ready` there
// while MPI is still up: MPI_Finalize can hang over UCX's TCP transport, and the
// communicator's guard then exits the process after 30 s (docs/design/comm.md), so what the
// bench prints and writes must be out before. Returns the exit status.
int run_comm_bench(const CommBenchOptions& opt, Report& report, bool& is_root,
                   const std::function<void()>& report_ready);

}  // namespace ferry::bench
