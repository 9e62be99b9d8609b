#pragma once

#include <string>

#include "benchmarks/bench_report.h"

namespace ferry::bench {

struct CkptBenchOptions {
  std::string path;    // folder on the disk to measure
  bool quick = false;  // a small model (smoke test)
};

// Checkpoint write and read GB/s of a GPT whose checkpointed state (master weights, Adam
// m and v) is over 1 GB, against fio's sequential write and read of as many bytes on the
// same folder, in the same run.
int run_ckpt_bench(const CkptBenchOptions& opt, Report& report);

}  // namespace ferry::bench
