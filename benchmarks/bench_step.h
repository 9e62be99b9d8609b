#pragma once

#include <string>

#include "benchmarks/bench_report.h"

namespace ferry::bench {

struct StepBenchOptions {
  std::string nvme_path;  // folder for the parameter and optimizer files
  bool quick = false;     // a small model (smoke test)
  std::string trace;      // Chrome trace of the overlapped run's last step ("" = <nvme_path>/ferry-bench-step.trace.json)
  bool bf16 = false;      // bf16 compute: bf16 parameter shards on NVMe
  std::string device = "cpu";  // "cuda": the step on a GPU (ZeRO-Infinity's path), PCIe bytes reported
  // A Python with torch and deepspeed (scripts/make_peers_env.sh): DeepSpeed's ZeRO-Infinity
  // (stage 3, parameters and optimizer state on NVMe in the same folder) on the same GPT,
  // batch and threads on the CPU (benchmarks/peers/step_peer.py), alternated with ferry's
  // overlapped step round by round. "" = ferry alone. CPU device only.
  std::string peers;
};

// One training step of a GPT with parameters and optimizer state on NVMe (stage 3, one
// rank), overlapped and sequential, against each resource of the step measured alone in
// the same run: the CPU cores (the same step with every state in memory), the NVMe
// traffic the step moves (replayed through ferry's storage, reads and writes on two
// threads), and communication (none at one rank). Reports the NVMe bytes per parameter
// per step the overlapped run moved (its trace's reads and writes). With device "cuda" the
// steps run on the GPU (compute alone: every state on the GPU) and the bytes over PCIe per
// parameter, up and down, are reported beside the minimum the placement allows
// (docs/design/zero.md, "Bytes over PCIe"). Throws std::runtime_error (naming the reason)
// where the cuda device is unavailable.
int run_step_bench(const StepBenchOptions& opt, Report& report);

}  // namespace ferry::bench
