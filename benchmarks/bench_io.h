#pragma once

#include <cstdint>
#include <string>

#include "benchmarks/bench_report.h"

namespace ferry::bench {

struct IoBenchOptions {
  std::string path;   // folder on the disk to measure
  bool quick = false; // 64 MiB file, fewer cases, one repetition (smoke test)
  std::string peers;  // a Python with torch and deepspeed: DeepSpeed's aio in the same run ("": none)
};

int run_io_bench(const IoBenchOptions& opt, Report& report);

// fio's bandwidth in bytes/s for one sequential pass over `file` (io_uring, O_DIRECT,
// fsync at the end). Throws when fio is missing or prints no JSON.
double fio_bandwidth(const std::string& file, bool write, size_t bs, int qd, uint64_t size);

}  // namespace ferry::bench
