#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "benchmarks/bench_report.h"

namespace ferry::bench {

struct ModelBenchOptions {
  int threads = 0;                 // 0 = all cores
  size_t device_memory = 8ull << 30;  // cpu; cuda: 0 = what fits on the GPU now
  bool quick = false;              // fewer repetitions (smoke test)
  std::string only;                // one config by name; "" = all
  std::string device = "cpu";      // cpu | cuda
  bool bf16 = false;               // bf16 weights and activations (fp32 accumulation)
  // The whole step at these contexts instead of the named configs: the largest config's
  // shape (gpt-50m on the CPU, gpt2-124m on a GPU) with the same tokens per step (B = tokens / T).
  std::vector<int64_t> contexts;
};

// Fills `report` (the headline is the last, largest config). Returns the exit status.
int run_model_bench(const ModelBenchOptions& opt, Report& report);

}  // namespace ferry::bench
