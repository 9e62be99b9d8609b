// ferry plan --config FILE --ranks N [--deepspeed DS.json | --fsdp FSDP] [--set key=value ...]
//            [--device-memory X] [--host-memory Y] [--nvme-bandwidth BYTES_PER_S] [--bench DIR] [--gpu h100|h200|a100] [--json FILE]
// Bytes per rank in every tier for every stage and offload choice, whether they fit, and a
// step-time estimate (runtime/tools/plan.h); --bench reads `ferry bench`'s JSON results.
// Exit status: 0 printed; 1 an input (bench results, the JSON output) was refused;
// 2 the command line or the configuration is wrong.
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "examples/commands.h"
#include "nn/device.h"
#include "runtime/config/config.h"
#include "runtime/tools/plan.h"

namespace ferry::cli {

namespace {

struct PlanArgs {
  RunOptions run;
  std::string device_memory, host_memory, nvme_bandwidth, bench, json_out, gpu;
};

int plan(const PlanArgs& a) {
  using namespace ferry::runtime;
  if (a.run.config.empty()) throw UsageError("--config FILE is required");
  size_t device_memory = 0, host_memory = 0;
  double nvme_bw = 0;
  try {
    if (!a.device_memory.empty()) device_memory = parse_bytes(a.device_memory, "--device-memory");
    if (!a.host_memory.empty()) host_memory = parse_bytes(a.host_memory, "--host-memory");
    if (!a.nvme_bandwidth.empty()) nvme_bw = static_cast<double>(parse_bytes(a.nvme_bandwidth, "--nvme-bandwidth"));
  } catch (const ConfigError& e) {
    throw UsageError(e.what());
  }
  {
    const Config base = load_config(a.run.config, a.run.sets, a.run.ranks, a.run.deepspeed, a.run.fsdp);
    const int ranks = a.run.ranks;
    Rates rates = a.bench.empty() ? Rates{} : rates_from_bench(a.bench);
    // --gpu names the GPU the run will have: its compute and NCCL rates replace whatever
    // --bench measured for those (a bench folder is usually from the planning machine).
    if (!a.gpu.empty()) rates = gpu_rates(a.gpu, base.zero.compute, rates);
    if (nvme_bw > 0) {
      rates.nvme_bytes_per_s = nvme_bw;
      rates.sources.push_back("nvme bandwidth from --nvme-bandwidth");
    }
    const std::vector<PlanRow> rows = plan_all(base, ranks, rates, device_memory, host_memory);
    std::cout << format_plan(base, ranks, rates, rows, device_memory, host_memory);
    const MemoryPlan chosen = plan_memory(base, ranks);
    std::cout << "\nthis configuration (stage " << base.zero.stage << ", optimizer " << offload::tier_word(base.offload.optimizer_device)
              << ", params " << offload::tier_word(base.zero.stage == 3 ? base.offload.param_device : offload::Tier::device)
              << "): device peak " << nn::format_bytes(chosen.device_peak) << ", host "
              << nn::format_bytes(chosen.host_states + chosen.host_pinned) << ", nvme " << nn::format_bytes(chosen.nvme)
              << " per rank\n";
    if (!a.json_out.empty()) std::ofstream(a.json_out) << plan_json(rows).dump(1) << "\n";
  }
  return 0;
}

}  // namespace

Run plan_command(CLI::App& cmd) {
  auto a = std::make_shared<PlanArgs>();
  cmd.description(
      "bytes per rank in every memory tier for every ZeRO stage and offload choice, and a step-time estimate");
  add_run_options(cmd, a->run, /*with_ranks=*/true);
  cmd.add_option("--device-memory", a->device_memory, "device memory per rank to fit in (e.g. 80GiB)");
  cmd.add_option("--host-memory", a->host_memory, "host memory per rank to fit in (e.g. 24GiB)");
  cmd.add_option("--nvme-bandwidth", a->nvme_bandwidth, "NVMe bytes per second per rank (e.g. 3GB)");
  cmd.add_option("--bench", a->bench, "a folder of `ferry bench` JSON results to take the rates from");
  cmd.add_option("--json", a->json_out, "also write the table as JSON to this file");
  cmd.add_option("--gpu", a->gpu,
                 "the GPU model the run will have, for the step time: its compute and NCCL rates "
                 "(device.type cuda without --gpu or --bench: h100)")
      ->check(CLI::IsMember({"h100", "h200", "a100"}));
  return [a] { return plan(*a); };
}

}  // namespace ferry::cli
