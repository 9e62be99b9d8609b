#pragma once

#include "benchmarks/bench_report.h"

namespace ferry::bench {

struct CommBenchOptions {
  bool quick = false;  // sizes up to 16 MiB, fewer repetitions (smoke test)
};

// Run under mpiexec -n N (N >= 1). Fills `report` on rank 0; returns the exit status.
int run_comm_bench(const CommBenchOptions& opt, Report& report, bool& is_root);

}  // namespace ferry::bench
