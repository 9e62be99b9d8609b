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
  // The whole step at these contexts instead of the named configs: the config `only` names,
  // else the largest config's shape (gpt-50m on the CPU, gpt2-124m on a GPU), with the same
  // tokens per step (B = tokens / T).
  std::vector<int64_t> contexts;
  // A Python with torch (scripts/make_peers_env.sh): PyTorch eager on the same GPT shapes,
  // tokens and threads (benchmarks/peers/model_peer.py), alternated with ferry repetition
  // by repetition: forward+backward, and a whole training step (clipping and AdamW: ferry's
  // Trainer against torch.optim.AdamW). "" = ferry alone.
  std::string peers;
  // > 1: also a whole training step at this many ranks (`ferry train` under mpiexec, ZeRO-3,
  // `threads` each, all cores split among them by default), against FSDP2 over gloo at as
  // many processes when `peers` is given. Ranks share the machine: one rank per core at most is the fair case.
  int ranks = 1;
  // cuda: which attention kernels the device runs (auto | simt | tensor_cores | mma,
  // nn/attention_kernel.h), so a run can set the tensor cores against the SIMT kernels.
  std::string attention_kernel = "auto";
  // cuda: also the roofline ledger's prediction of each configuration on an H100 and an
  // H200 (benchmarks/bench_predict.h), beside the measurement; where no GPU is present,
  // the prediction alone.
  bool predict = false;
};

// Fills `report` (the headline is the last, largest config). Returns the exit status.
// Throws std::runtime_error naming the peer when it fails or its model's parameter count
// differs from ferry's (the two would not be the same model), std::invalid_argument for
// `peers` or `ranks` > 1 with the cuda device or bf16 (those comparisons are fp32 on the CPU).
int run_model_bench(const ModelBenchOptions& opt, Report& report);

}  // namespace ferry::bench
