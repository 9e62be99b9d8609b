#include "runtime/tools/plan.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "base/nesting_limit.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "runtime/zero/partition.h"

namespace ferry::runtime {

using nlohmann::json;
namespace fs = std::filesystem;

double TimePlan::overlapped_s() const { return std::max({compute_s, nvme_s, comm_s, adam_s}); }
double TimePlan::sequential_s() const { return compute_s + nvme_s + comm_s + adam_s; }

TimePlan plan_time(const Config& c, int ranks, const Rates& r) {
  const std::vector<nn::UnitSpec> units = model_layout(c);
  // P: every parameter; T: the trained ones (all of them but with adapters, whose frozen
  // base is gathered and read but never reduced, updated or written).
  double P = 0, T = 0;
  for (const nn::UnitSpec& u : units) P += static_cast<double>(u.numel), T += static_cast<double>(u.trainable_numel);
  const int stage = c.zero.stage;
  const int group = stage > 0 && c.zero.shard_group_size > 0 ? c.zero.shard_group_size : ranks;
  const double shard = P / static_cast<double>(group), trained_shard = T / static_cast<double>(group);
  const offload::Tier opt = c.offload.optimizer_device;
  const offload::Tier par = stage == 3 ? c.offload.param_device : offload::Tier::device;
  TimePlan t;
  const double tokens = static_cast<double>(c.micro_batch * c.grad_accum * c.model.block_size);  // per rank
  const double flops = run_flops_per_token(c, units, c.model.block_size);
  t.compute_s = flops * tokens / r.flops;
  // Whole-buffer collectives of the fp32 model (4 bytes a parameter), the unit ferry bench
  // comm's rate is measured in; an all-reduce counts as two (reduce-scatter + all-gather).
  const double accum = static_cast<double>(c.grad_accum);
  if (group > 1) {
    if (stage <= 1) t.comm_bytes = (2.0 + (stage == 1 ? 1.0 : 0.0)) * 4 * T;  // gradient all-reduce; stage 1: + weights
    if (stage == 2) t.comm_bytes = (accum + 1.0) * 4 * T;                      // reduce-scatter per micro-batch; weights
    if (stage == 3) t.comm_bytes = 2.0 * accum * 4 * P + accum * 4 * T;        // gather fwd + bwd, reduce-scatter
  }
  t.comm_across_bytes = group < ranks ? 2.0 * 4 * trained_shard : 0.0;  // all-reduce of the gradient shard
  t.comm_bytes += t.comm_across_bytes;
  // hpZ: a unit's first gather of the step (forward, first micro-batch) runs over the
  // world and leaves a node copy; its other 2 x accum - 1 gathers come from the copy. The
  // bytes are the same; they stay inside the node group. (One comm rate: ferry bench comm
  // on one node measures the node's.)
  if (stage == 3 && c.zero.hpz_partition_size > 1 && group > 1) t.comm_node_bytes = (2.0 * accum - 1.0) * 4 * P;
  t.comm_s = t.comm_bytes / r.comm_bytes_per_s;
  // Parameter shards on NVMe are kept in the compute dtype under bf16 and fp16
  // (ParamShards::dtype), 2 bytes an element: a 16-bit base or a QLoRA base's blobs,
  // whose elements are bytes / 2.
  const double pbytes = nn::is_low_precision(c.zero.compute) ? 2.0 : 4.0;
  if (par == offload::Tier::nvme) t.nvme_bytes += accum * 2 * pbytes * shard + pbytes * trained_shard;  // read fwd + bwd, write once
  if (opt == offload::Tier::nvme) t.nvme_bytes += 24 * trained_shard;  // master, m, v read and written
  t.nvme_s = t.nvme_bytes / r.nvme_bytes_per_s;
  if (opt != offload::Tier::device) t.adam_s = trained_shard / r.adam_params_per_s;
  return t;
}

Rates rates_from_bench(const std::string& dir, Rates r) {
  // ferry bench writes {"headline": {"metric": "model_gflops (...)", "value": ...}, ...}.
  auto headline = [&](const std::string& file, const std::string& key) -> double {
    const fs::path p = fs::path(dir) / file;
    if (!fs::exists(p)) return 0;
    std::ifstream in(p);
    const json j = base::parse_json<std::runtime_error>(in, p.string(), false);
    if (j.is_discarded()) throw std::runtime_error(p.string() + ": not valid JSON");
    const json h = j.value("headline", json::object());
    if (!h.value("metric", std::string()).starts_with(key) || !h.contains("value") || !h["value"].is_number()) {
      throw std::runtime_error(p.string() + ": no headline '" + key + "' (not a ferry bench result file?)");
    }
    r.sources.push_back(h["metric"].get<std::string>() + " = " + h["value"].dump() + " from " + p.string());
    return h["value"].get<double>();
  };
  if (const double g = headline("bench-model.json", "model_gflops"); g > 0) r.flops = g * 1e9;
  if (const double b = headline("bench-io.json", "ferry_bytes_per_s"); b > 0) r.nvme_bytes_per_s = b;
  if (const double g = headline("bench-comm.json", "ferry_gbps"); g > 0) r.comm_bytes_per_s = g * 1e9;
  if (const double a = headline("bench-adam.json", "params_per_s"); a > 0) r.adam_params_per_s = a;
  return r;
}

Rates gpu_rates(const std::string& gpu, nn::DType compute, Rates r) {
  // Dense (no sparsity) peaks from NVIDIA's datasheets, TFLOP/s: {bf16/f16, fp32}.
  struct Preset {
    const char* name;
    const char* what;
    double low, fp32, comm;
  };
  static const Preset kPresets[] = {
      {"h100", "H100 SXM", 989e12, 67e12, 300e9},
      {"h200", "H200 SXM", 989e12, 67e12, 300e9},
      {"a100", "A100 80GB SXM", 312e12, 19.5e12, 200e9},
  };
  for (const Preset& p : kPresets) {
    if (gpu != p.name) continue;
    const bool low = nn::is_low_precision(compute);
    r.flops = (low ? p.low : p.fp32) * kGpuAchievable;
    r.comm_bytes_per_s = p.comm;
    char line[200];
    std::snprintf(line, sizeof line, "%s preset: %.0f TFLOP/s %s dense peak x %.2f achievable; NCCL %.0f GB/s per rank",
                  p.what, (low ? p.low : p.fp32) / 1e12, low ? "bf16/f16" : "fp32", kGpuAchievable, p.comm / 1e9);
    r.sources.push_back(line);
    return r;
  }
  throw std::invalid_argument("unknown GPU '" + gpu + "': known presets are h100, h200, a100");
}

Rates effective_rates(const Config& c, const Rates& r) {
  if (c.device.type != "cuda" || !r.sources.empty()) return r;
  Rates g = gpu_rates("h100", c.zero.compute, r);
  g.sources.back() += " (device.type cuda; no --bench results given)";
  return g;
}

std::vector<PlanRow> plan_all(const Config& base, int ranks, const Rates& given, size_t device_memory,
                              size_t host_memory) {
  const Rates r = effective_rates(base, given);
  std::vector<PlanRow> rows;
  for (int stage = 0; stage <= 3; ++stage) {
    using offload::Tier;
    for (const Tier opt : {Tier::device, Tier::cpu, Tier::nvme}) {
      if (stage == 0 && opt != Tier::device) continue;
      for (const Tier par : {Tier::device, Tier::cpu, Tier::nvme}) {
        if (stage < 3 && par != Tier::device) continue;
        Config c = base;
        c.zero.stage = stage;
        c.offload.optimizer_device = opt;
        c.offload.param_device = par;
        if (!nf4_refusal(c).empty()) continue;  // a placement the run would refuse (format_plan says why)
        PlanRow row{stage, opt, par, plan_memory(c, ranks), plan_time(c, ranks, r)};
        row.fits_device = std::max(row.mem.device_peak, row.mem.device_construction_peak) <= (device_memory > 0 ? device_memory : base.device.memory);
        row.fits_host = host_memory == 0 || row.mem.host_states + row.mem.host_pinned <= host_memory;
        rows.push_back(row);
      }
    }
  }
  return rows;
}

std::string format_plan(const Config& base, int ranks, const Rates& given, const std::vector<PlanRow>& rows,
                        size_t device_memory, size_t host_memory) {
  const Rates r = effective_rates(base, given);
  auto gib = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%9.3f", b / (1024.0 * 1024.0 * 1024.0));
    return std::string(buf);
  };
  double P = 0;  // values: an NF4 tensor's, not its blobs' elements
  for (const nn::UnitSpec& u : model_layout(base))
    for (const nn::TensorSpec& t : u.tensors) P += static_cast<double>(t.numel());
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "model: %s, %lld layers, %lld channels, vocab %lld, context %lld: %.0f parameters; ",
                base.model_arch.c_str(), static_cast<long long>(base.model.n_layer), static_cast<long long>(base.model.n_embd),
                static_cast<long long>(base.model.vocab_size), static_cast<long long>(base.model.block_size), P);
  os << line << ranks << " ranks, micro-batch " << base.micro_batch << " x " << base.grad_accum << " accumulation\n";
  os << "limits: device " << gib(static_cast<double>(device_memory > 0 ? device_memory : base.device.memory))
     << " GiB per rank, host " << (host_memory ? gib(static_cast<double>(host_memory)) + " GiB per rank" : std::string("not given"))
     << "\nrates: " << r.flops / 1e9 << " GFLOP/s, nvme " << r.nvme_bytes_per_s / 1e9 << " GB/s, comm "
     << r.comm_bytes_per_s / 1e9 << " GB/s, adam " << r.adam_params_per_s / 1e6 << " M params/s";
  for (const std::string& s : r.sources) os << "\n  " << s;
  if (nn::is_low_precision(base.zero.compute)) {
    os << "\n" << (base.fp16 ? "fp16" : "bf16")
       << ": activations and gathered weights in two bytes; fp32 states, plus a two-byte compute copy at stages 0-2";
  }
  if (base.zero.shard_group_size > 0) {
    const int g = base.zero.shard_group_size;
    std::snprintf(line, sizeof line,
                  "\nhybrid sharding (stages 1-3): state sharded within %d groups of %d ranks; per rank and step %.3f GiB "
                  "all-reduced across groups (its fp32 gradient shard), the gathers and reduce-scatters stay in the group",
                  ranks / g, g, 2.0 * 4 * P / g / (1024.0 * 1024.0 * 1024.0));
    os << line;
  }
  if (base.zero.hpz_partition_size > 1) {
    const double accum = static_cast<double>(base.grad_accum), gb = 4.0 * P / (1024.0 * 1024.0 * 1024.0);
    std::snprintf(line, sizeof line,
                  "\nhpZ (stage 3): node copies in groups of %d ranks serve %.0f of each step's %.0f gathers inside the "
                  "group; per rank and step %.3f GiB crosses it (the first gather and the reduce-scatters) instead of "
                  "%.3f GiB",
                  base.zero.hpz_partition_size, 2 * accum - 1, 2 * accum, (1 + accum) * gb, 3 * accum * gb);
    os << line;
  }
  os << "\n\nper rank, GiB; step time in seconds (overlapped = the longest resource, sequential = their sum)\n"
     << "stage  optimizer  params |  device peak (states + activations + in flight) |   host + pinned |      nvme | fits | step overlapped  sequential\n";
  for (const PlanRow& row : rows) {
    std::snprintf(line, sizeof line, "%5d  %-9s  %-6s | %s (%s + %s + %s) | %s + %s | %s | %-4s | %15.3f  %10.3f\n",
                  row.stage, offload::tier_word(row.optimizer), offload::tier_word(row.params), gib(static_cast<double>(row.mem.device_peak)).c_str(),
                  gib(static_cast<double>(row.mem.device_states)).c_str(),
                  gib(static_cast<double>(row.mem.device_activations)).c_str(),
                  gib(static_cast<double>(row.mem.device_transient)).c_str(),
                  gib(static_cast<double>(row.mem.host_states)).c_str(), gib(static_cast<double>(row.mem.host_pinned)).c_str(),
                  gib(static_cast<double>(row.mem.nvme)).c_str(),
                  row.fits_device && row.fits_host ? "yes" : (!row.fits_device ? "dev" : "host"),
                  row.time.overlapped_s(), row.time.sequential_s());
    os << line;
  }
  if (base.lora.nf4) {
    Config c = base;
    c.zero.stage = 3;
    c.offload.optimizer_device = c.offload.param_device = offload::Tier::device;
    if (const std::string why = nf4_refusal(c); !why.empty()) os << "not listed: " << why << "\n";
  }
  return os.str();
}

json plan_json(const std::vector<PlanRow>& rows) {
  json out = json::array();
  for (const PlanRow& r : rows) {
    out.push_back({{"stage", r.stage},
                   {"offload_optimizer", offload::tier_word(r.optimizer)},
                   {"offload_param", offload::tier_word(r.params)},
                   {"device_peak", r.mem.device_peak},
                   {"device_states", r.mem.device_states},
                   {"device_activations", r.mem.device_activations},
                   {"device_transient", r.mem.device_transient},
                   {"host_states", r.mem.host_states},
                   {"host_pinned", r.mem.host_pinned},
                   {"nvme", r.mem.nvme},
                   {"fits", r.fits_device && r.fits_host},
                   {"compute_s", r.time.compute_s},
                   {"nvme_s", r.time.nvme_s},
                   {"comm_s", r.time.comm_s},
                   {"adam_s", r.time.adam_s},
                   {"step_overlapped_s", r.time.overlapped_s()},
                   {"step_sequential_s", r.time.sequential_s()}});
  }
  return out;
}

}  // namespace ferry::runtime
