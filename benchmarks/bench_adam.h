#pragma once

#include <cstdint>

#include "benchmarks/bench_report.h"

namespace ferry::bench {

struct AdamBenchOptions {
  int threads = 0;            // the headline's thread count; 0 = all cores
  int64_t params = 100'000'000;
  bool quick = false;         // 4M params, fewer repetitions (smoke test)
};

int run_adam_bench(const AdamBenchOptions& opt, Report& report);

}  // namespace ferry::bench
