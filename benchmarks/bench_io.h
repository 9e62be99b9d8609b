#pragma once

#include <string>

#include "benchmarks/bench_report.h"

namespace ferry::bench {

struct IoBenchOptions {
  std::string path;   // folder on the disk to measure
  bool quick = false; // 64 MiB file, fewer cases (smoke test)
};

int run_io_bench(const IoBenchOptions& opt, Report& report);

}  // namespace ferry::bench
