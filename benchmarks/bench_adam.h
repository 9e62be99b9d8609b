#pragma once

#include <cstdint>
#include <string>

#include "benchmarks/bench_report.h"

namespace ferry::bench {

struct AdamBenchOptions {
  int threads = 0;            // the headline's thread count; 0 = all cores
  int64_t params = 100'000'000;
  bool quick = false;         // 4M params, fewer repetitions (smoke test)
  // A Python with torch and deepspeed (scripts/make_peers_env.sh): DeepSpeed's CPU Adam is
  // measured at the same size and thread counts in the same run, alternating with ferry.
  // Empty: no peer columns. A peer that cannot run is an error (std::runtime_error naming
  // the Python and the cause).
  std::string peers;
};

int run_adam_bench(const AdamBenchOptions& opt, Report& report);

}  // namespace ferry::bench
