// ferry plan: what a configuration needs per rank in every memory tier, for every ZeRO
// stage and offload choice, whether it fits, and a step-time estimate from measured rates.
//
// Memory: a dry run of the engine (plan_dry_run.cpp): the model, ShardedUnits and
// OptimizerState built as the trainer builds them, and two training steps, as rank 0 of
// `ranks`, on counting stand-ins (nn::CountingDevice for the arena and host memory,
// comm::CountingCommunicator, a counting pinned pool and nvme storage): nothing computed,
// nothing allocated, so a 70B model plans in well under a second. The figures are the
// engine's own allocations, equal to a real run's (tests/test_plan.cpp checks them to the
// byte against training runs). Rank 0's: other ranks differ by at most shard padding.
// Time: compute = model FLOPs / the FLOP rate; nvme = bytes moved / bandwidth; comm =
// whole-model collective buffers / the measured collective rate (hybrid sharding: the
// group's collectives, plus the all-reduce of this rank's gradient shard across groups); adam = parameters
// updated on the CPU / Adam's rate. Rates default to round figures of a small server
// (device.type cuda: a GPU preset, gpu_rates) and are better read from ferry bench results
// (--bench DIR). Errors: std::invalid_argument / std::runtime_error naming the file or
// key; OutOfDeviceMemory never (the counting devices have no cap; plan_all judges fit).
// The overlapped estimate is the largest of them (what "The overlapped step" aims at), the
// sequential one their sum.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "offload/tier.h"
#include "runtime/config/config.h"

namespace ferry::runtime {

struct Rates {
  double flops = 50e9;             // model FLOP/s per rank (ferry bench model: model_gflops)
  double nvme_bytes_per_s = 1e9;   // per rank (ferry bench io: ferry_bytes_per_s)
  double comm_bytes_per_s = 5e9;   // a collective's buffer bytes per second (ferry bench comm: ferry_gbps)
  double adam_params_per_s = 5e8;  // CPU Adam (ferry bench adam: params_per_s)
  std::vector<std::string> sources;  // where each rate came from
};

// Per-rank rates of one GPU model on an NVLink node: "h100" (H100 SXM), "h200" (H200
// SXM), "a100" (A100 80GB SXM); `compute` picks the dense bf16/f16 or fp32 peak. The
// FLOP rate is the datasheet's dense peak times kGpuAchievable; comm is an NCCL
// reduce-scatter/all-gather rate per rank over NVLink; nvme and adam keep `host`'s (they
// run on the host). Sources: docs/design/tools.md ("Step-time rates"). Throws std::invalid_argument
// naming the known models for another name.
constexpr double kGpuAchievable = 0.4;
Rates gpu_rates(const std::string& gpu, nn::DType compute, Rates host = {});
// The rates plan_all and format_plan use: `r` as given, except that a device.type cuda
// configuration given only the built-in CPU defaults (no sources) gets gpu_rates("h100").
Rates effective_rates(const Config& c, const Rates& r);

// Rates from ferry bench JSON results in `dir` (bench-model.json, bench-io.json,
// bench-comm.json, bench-adam.json), each file optional; throws naming a file it cannot read.
Rates rates_from_bench(const std::string& dir, Rates defaults = {});

struct MemoryPlan {
  size_t device_states = 0;       // weights, gradients, optimizer state kept in the arena
  size_t device_activations = 0;  // peak of one micro-batch's activations (forward or backward)
  size_t device_transient = 0;    // gathered units and gradient buffers in flight (stages 2-3)
  size_t device_peak = 0;         // the sum: the arena's peak in a training step
  size_t device_construction_peak = 0;  // the arena's peak while the states are built
  size_t host_states = 0;         // gradient shards, optimizer state, parameters in host memory
  size_t host_pinned = 0;         // the pinned staging pool
  size_t nvme = 0;                // nvme file bytes
  size_t nvme_params = 0;         // of which parameter shards (the rest: optimizer state)
};

struct TimePlan {
  double compute_s = 0, nvme_s = 0, comm_s = 0, adam_s = 0;
  double nvme_bytes = 0, comm_bytes = 0;
  double comm_across_bytes = 0;  // hybrid sharding: of comm_bytes, those between groups (nodes)
  double comm_node_bytes = 0;    // hpZ: of comm_bytes, the gathers served by node copies within a node group
  double overlapped_s() const;
  double sequential_s() const;
};

// One configuration at `ranks` ranks (its zero stage and offload choices as given).
MemoryPlan plan_memory(const Config& c, int ranks);
TimePlan plan_time(const Config& c, int ranks, const Rates& r);

struct PlanRow {
  int stage = 0;
  offload::Tier optimizer = offload::Tier::device, params = offload::Tier::device;
  MemoryPlan mem;
  TimePlan time;
  bool fits_device = true, fits_host = true;
};

// Every legal (stage, offload_optimizer, offload_param) choice for `base`'s model and batch.
// Device and host limits: 0 = from the configuration (device.memory) / not checked.
std::vector<PlanRow> plan_all(const Config& base, int ranks, const Rates& r, size_t device_memory, size_t host_memory);

std::string format_plan(const Config& base, int ranks, const Rates& r, const std::vector<PlanRow>& rows,
                        size_t device_memory, size_t host_memory);
nlohmann::json plan_json(const std::vector<PlanRow>& rows);

}  // namespace ferry::runtime
