#include "runtime/tools/plan.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "nn/gpt.h"
#include "nn/llama.h"
#include "offload/shard_store.h"
#include "runtime/zero/partition.h"

namespace ferry::runtime {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

size_t f32(int64_t n) { return static_cast<size_t>(std::max<int64_t>(n, 0)) * 4; }
// The CPU device's arena rounds every allocation to 64 bytes (nn/cpu_device.cpp).
size_t arena(size_t bytes) { return (std::max<size_t>(bytes, 1) + 63) / 64 * 64; }
int64_t round_up(int64_t n, int64_t q) { return (n + q - 1) / q * q; }

// Activations of one micro-batch (nn/gpt.cpp's and nn/llama.cpp's allocations) in the
// phases where the arena peaks: the end of forward (everything backward needs, the f64
// losses), the head's backward (+ dx, dlogits, dlnf), the blocks' backward (the head's
// tensors freed, the blocks' gradient temporaries allocated) and, with checkpointing, a
// block's forward recomputed before its gradient buffer is taken.
struct PhaseBytes {
  size_t forward = 0, head = 0, blocks = 0;
  size_t recompute = 0;
};

PhaseBytes activations(const Config& c, int64_t B) {
  const nn::GPTConfig& m = c.model;
  const int64_t T = m.block_size, N = B * T, C = m.n_embd, V = m.vocab_size, H = m.n_head;
  // Activations in the compute dtype; statistics, probabilities and losses in fp32
  // (nn::Model::stat_dtype).
  const size_t e = nn::dtype_size(c.zero.compute);
  auto act = [e](int64_t n) { return arena(static_cast<size_t>(std::max<int64_t>(n, 0)) * e); };
  const size_t NC = act(N * C), Nv = arena(f32(N)), logits = act(N * V), probs = arena(f32(N * V));
  const size_t att = act(B * H * T * T);
  size_t block_kept = 0, grad_temps = 0, head_kept = 0;
  if (c.model_arch == "llama") {
    const size_t NW = act(N * c.llama.qkv_width()), NI = act(N * c.llama.intermediate);
    const size_t N2I = act(N * 2 * c.llama.intermediate);
    // xn, atty, res2, xn2, output; qkv; gate_up, h; two RMSNorm statistics; probabilities.
    block_kept = 5 * NC + NW + N2I + NI + 2 * Nv + att;
    grad_temps = 4 * NC + NI + N2I + 2 * NW;  // dres2, dxin, dnorm, datty, dh, dgu, dqkv, dpre
    head_kept = NC + 2 * Nv + logits + probs;  // xf, rstdf, losses; logits, probs
  } else {
    const size_t N4C = act(N * 4 * C), N3C = act(N * 3 * C);
    // ln1, atty, res2, ln2, output; fch, fch_gelu; qkv; four LayerNorm statistics; probabilities.
    block_kept = 5 * NC + 2 * N4C + N3C + 4 * Nv + att;
    grad_temps = 4 * NC + 2 * N4C + N3C;       // dres2, dxin, dln, datty, dfch, dfch_gelu, dqkv
    head_kept = NC + 3 * Nv + logits + probs;  // lnf, its statistics, losses; logits, probs
  }
  const size_t io = 2 * arena(static_cast<size_t>(N) * 4);  // tokens, targets (i32)
  const size_t L = static_cast<size_t>(m.n_layer);
  const size_t losses64 = arena(static_cast<size_t>(N) * 8);
  // The head's backward adds dx, dlogits (compute dtype) and dlnf; the blocks' backward
  // has freed the final norm's output, the logits and the probabilities.
  const size_t head_grads = NC + logits + NC, head_freed = NC + logits + probs;
  PhaseBytes p;
  if (!c.activation_checkpointing) {
    const size_t kept = io + NC + L * block_kept + head_kept;
    p.forward = kept + losses64;
    p.head = kept + head_grads;
    p.blocks = kept - head_freed + NC + grad_temps;
    return p;
  }
  // Each block keeps only its output (the next block's input); one block's activations live
  // at a time, in forward and again when backward recomputes them (with its scratch and
  // recomputed output, freed right after).
  const size_t kept = io + NC + L * NC + head_kept;
  const size_t one_block = block_kept - NC;
  p.forward = std::max(io + (L + 1) * NC + one_block + NC, kept + losses64);
  p.head = kept + head_grads;
  p.blocks = kept - head_freed + NC + grad_temps + one_block;
  p.recompute = p.blocks + 2 * NC;
  return p;
}

std::vector<nn::UnitSpec> model_layout(const Config& c) {
  return c.model_arch == "llama" ? nn::Llama::layout(c.llama) : nn::GPT::layout(c.model);
}

}  // namespace

double TimePlan::overlapped_s() const { return std::max({compute_s, nvme_s, comm_s, adam_s}); }
double TimePlan::sequential_s() const { return compute_s + nvme_s + comm_s + adam_s; }

MemoryPlan plan_memory(const Config& c, int ranks) {
  const std::vector<nn::UnitSpec> units = model_layout(c);
  const int stage = c.zero.stage;
  const std::string& opt = c.offload.optimizer_device;
  const std::string& par = stage == 3 ? c.offload.param_device : std::string("none");
  MemoryPlan m;
  int64_t largest_padded = 0, largest_shard = 0, cached = 0;
  size_t weights = 0, grads_full = 0, grads_shard = 0, optimizer = 0;
  const bool alias = opt == "none" && par == "none";
  const int per_unit = (alias ? 2 : 3) * (opt == "nvme" ? 2 : 1);
  for (const nn::UnitSpec& u : units) {
    const Partition p = partition(u.numel, ranks, 0);
    largest_padded = std::max(largest_padded, p.padded);
    largest_shard = std::max(largest_shard, p.shard);
    if (stage < 3) {
      weights += arena(f32(p.padded));
      if (nn::is_low_precision(c.zero.compute)) weights += arena(static_cast<size_t>(p.padded) * 2);  // compute copy
    } else if (par == "nvme" && cached + p.shard <= c.offload.max_in_cpu) {
      cached += p.shard;
      m.host_states += f32(p.shard);
    } else if (par == "nvme") {
      m.nvme += f32(p.shard);
      m.nvme_params += f32(p.shard);
    } else if (par == "cpu") {
      m.host_states += f32(p.shard);
    } else {
      weights += arena(f32(p.shard));
    }
    if (stage < 2) grads_full += arena(f32(p.padded));
    if (stage >= 1) grads_shard += opt == "none" ? arena(f32(p.shard)) : f32(p.shard);
    const int64_t owned = stage == 0 ? p.padded : p.shard;
    optimizer += (opt == "none" ? arena(f32(owned)) : f32(owned)) * static_cast<size_t>(per_unit);
  }
  m.device_states = weights + grads_full + (opt == "none" ? grads_shard + optimizer : 0);
  if (opt == "cpu") m.host_states += grads_shard + optimizer;
  if (opt == "nvme") m.host_states += grads_shard, m.nvme += optimizer;
  if (opt == "nvme" || par == "nvme") {
    const int64_t elems = std::min<int64_t>(c.offload.param_buffer_size, round_up(largest_shard, offload::kNvmeQuantum));
    const size_t buffer = static_cast<size_t>(round_up(std::max<int64_t>(elems, offload::kNvmeQuantum) * 4, 4096));
    const int count = (opt == "nvme" ? c.offload.optimizer_buffers : 0) + (par == "nvme" ? c.offload.param_buffers + 1 : 0);
    m.host_pinned = buffer * static_cast<size_t>(count);
  }
  // Units in flight on the device in each phase. Stage 3 gathers a unit, and the next
  // ones in the recorded order ahead of use, into full buffers, unless one rank's shard
  // already is the unit (in the arena, or in host memory the CPU device computes from; nvme
  // shards are read into the arena). GPT-2's head uses the embedding and the final unit
  // together; Llama's only the final one. Stages 2-3 take a full gradient buffer per unit in backward, released when
  // its reduction completes: with several ranks the previous unit's is still in flight
  // (alone, the reduction is a copy done at once).
  // Gathered weights are in the compute dtype, gradient buffers fp32.
  const size_t e = nn::dtype_size(c.zero.compute);
  auto padded = [&](size_t u, size_t esize) { return arena(static_cast<size_t>(partition(units[u].numel, ranks, 0).padded) * esize); };
  const size_t E = padded(0, 4), F = padded(units.size() - 1, 4), Bk = units.size() > 2 ? padded(1, 4) : 0;
  // bf16/f16: a unit fetched ahead also holds, until its use, the fp32 shard read from nvme
  // into the arena and (several ranks) the two-byte cast of this rank's shard.
  auto ahead_of = [&](size_t u) {
    if (e == 4) return padded(u, 4);
    const auto shard = static_cast<size_t>(partition(units[u].numel, ranks, 0).shard);
    return padded(u, e) + (par == "nvme" ? arena(shard * 4) : 0) + (ranks > 1 ? arena(shard * e) : 0);
  };
  const size_t Ew = padded(0, e), Fw = padded(units.size() - 1, e), Bkw = units.size() > 2 ? padded(1, e) : 0;
  const size_t Ea = ahead_of(0), Bka = units.size() > 2 ? ahead_of(1) : 0;
  size_t ahead = stage == 3 && c.zero.overlap_comm ? static_cast<size_t>(std::max(1, c.schedule.prefetch_depth - 1)) : 0;
  // nvme shards larger than one staging buffer are read on demand, in pieces, never ahead.
  if (par == "nvme" && largest_shard > c.offload.param_buffer_size) ahead = 0;
  // bf16/f16 stage 3 always gathers into a new (two-byte) buffer.
  const bool copies = stage == 3 && (ranks > 1 || par == "nvme" || nn::is_low_precision(c.zero.compute));
  const bool grads = stage >= 2;
  const PhaseBytes acts = activations(c, c.micro_batch);
  const size_t head = c.model_arch == "llama" ? F : F + E;  // GPT-2's head is tied to the embedding
  const size_t head_w = c.model_arch == "llama" ? Fw : Fw + Ew;
  const size_t fwd_units = copies ? head_w + ahead * Bka : 0;
  const size_t head_units = (copies ? head_w + ahead * Bka : 0) + (grads ? head : 0);
  const size_t previous = ranks > 1 ? std::max(Bk, head) : 0;
  const size_t block_units = (copies ? Bkw + ahead * std::max(Bka, Ea) : 0) + (grads ? Bk + previous : 0);
  const size_t recompute_units = (copies ? Bkw + ahead * std::max(Bka, Ea) : 0) + (grads ? previous : 0);
  const size_t peak = std::max({acts.forward + fwd_units, acts.head + head_units, acts.blocks + block_units,
                                acts.recompute + recompute_units});
  m.device_activations = std::max({acts.forward, acts.head, acts.blocks, acts.recompute});
  m.device_transient = peak - m.device_activations;
  m.device_peak = m.device_states + peak;
  return m;
}

TimePlan plan_time(const Config& c, int ranks, const Rates& r) {
  const std::vector<nn::UnitSpec> units = model_layout(c);
  double P = 0;
  for (const nn::UnitSpec& u : units) P += static_cast<double>(u.numel);
  const double shard = P / static_cast<double>(ranks);
  const int stage = c.zero.stage;
  const std::string& opt = c.offload.optimizer_device;
  const std::string par = stage == 3 ? c.offload.param_device : "none";
  TimePlan t;
  const double tokens = static_cast<double>(c.micro_batch * c.grad_accum * c.model.block_size);  // per rank
  const double flops = c.model_arch == "llama" ? nn::Llama::flops_per_token(c.llama, c.model.block_size)
                                              : nn::GPT::flops_per_token(c.model, c.model.block_size);
  t.compute_s = flops * tokens / r.flops;
  // Whole-buffer collectives of the fp32 model (4P bytes each), the unit ferry-bench comm's
  // rate is measured in; an all-reduce counts as two (reduce-scatter + all-gather).
  const double accum = static_cast<double>(c.grad_accum);
  const double buffers = ranks == 1 ? 0.0
                         : stage <= 1 ? 2.0 + (stage == 1 ? 1.0 : 0.0)  // gradient all-reduce; stage 1: + weights
                         : stage == 2 ? accum + 1.0                     // reduce-scatter per micro-batch; weights
                                      : 3.0 * accum;                    // gather fwd + bwd, reduce-scatter
  t.comm_bytes = buffers * 4 * P;
  t.comm_s = t.comm_bytes / r.comm_bytes_per_s;
  if (par == "nvme") t.nvme_bytes += accum * 2 * 4 * shard + 4 * shard;  // read fwd + bwd, write once
  if (opt == "nvme") t.nvme_bytes += 24 * shard;                        // master, m, v read and written
  t.nvme_s = t.nvme_bytes / r.nvme_bytes_per_s;
  if (opt != "none") t.adam_s = shard / r.adam_params_per_s;
  return t;
}

Rates rates_from_bench(const std::string& dir, Rates r) {
  // ferry-bench writes {"headline": {"metric": "model_gflops (...)", "value": ...}, ...}.
  auto headline = [&](const std::string& file, const std::string& key) -> double {
    const fs::path p = fs::path(dir) / file;
    if (!fs::exists(p)) return 0;
    std::ifstream in(p);
    const json j = json::parse(in, nullptr, false);
    if (j.is_discarded()) throw std::runtime_error(p.string() + ": not valid JSON");
    const json h = j.value("headline", json::object());
    if (!h.value("metric", std::string()).starts_with(key) || !h.contains("value") || !h["value"].is_number()) {
      throw std::runtime_error(p.string() + ": no headline '" + key + "' (not a ferry-bench result file?)");
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

std::vector<PlanRow> plan_all(const Config& base, int ranks, const Rates& r, size_t device_memory, size_t host_memory) {
  std::vector<PlanRow> rows;
  for (int stage = 0; stage <= 3; ++stage) {
    for (const char* opt : {"none", "cpu", "nvme"}) {
      if (stage == 0 && std::string(opt) != "none") continue;
      for (const char* par : {"none", "cpu", "nvme"}) {
        if (stage < 3 && std::string(par) != "none") continue;
        Config c = base;
        c.zero.stage = stage;
        c.offload.optimizer_device = opt;
        c.offload.param_device = par;
        PlanRow row{stage, opt, par, plan_memory(c, ranks), plan_time(c, ranks, r)};
        row.fits_device = row.mem.device_peak <= (device_memory > 0 ? device_memory : base.device.memory);
        row.fits_host = host_memory == 0 || row.mem.host_states + row.mem.host_pinned <= host_memory;
        rows.push_back(row);
      }
    }
  }
  return rows;
}

std::string format_plan(const Config& base, int ranks, const Rates& r, const std::vector<PlanRow>& rows,
                        size_t device_memory, size_t host_memory) {
  auto gib = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%9.3f", b / (1024.0 * 1024.0 * 1024.0));
    return std::string(buf);
  };
  double P = 0;
  for (const nn::UnitSpec& u : model_layout(base)) P += static_cast<double>(u.numel);
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
  os << "\n\nper rank, GiB; step time in seconds (overlapped = the longest resource, sequential = their sum)\n"
     << "stage  optimizer  params |  device peak (states + activations + in flight) |   host + pinned |      nvme | fits | step overlapped  sequential\n";
  for (const PlanRow& row : rows) {
    std::snprintf(line, sizeof line, "%5d  %-9s  %-6s | %s (%s + %s + %s) | %s + %s | %s | %-4s | %15.3f  %10.3f\n",
                  row.stage, row.optimizer.c_str(), row.params.c_str(), gib(static_cast<double>(row.mem.device_peak)).c_str(),
                  gib(static_cast<double>(row.mem.device_states)).c_str(),
                  gib(static_cast<double>(row.mem.device_activations)).c_str(),
                  gib(static_cast<double>(row.mem.device_transient)).c_str(),
                  gib(static_cast<double>(row.mem.host_states)).c_str(), gib(static_cast<double>(row.mem.host_pinned)).c_str(),
                  gib(static_cast<double>(row.mem.nvme)).c_str(),
                  row.fits_device && row.fits_host ? "yes" : (!row.fits_device ? "dev" : "host"),
                  row.time.overlapped_s(), row.time.sequential_s());
    os << line;
  }
  return os.str();
}

json plan_json(const std::vector<PlanRow>& rows) {
  json out = json::array();
  for (const PlanRow& r : rows) {
    out.push_back({{"stage", r.stage},
                   {"offload_optimizer", r.optimizer},
                   {"offload_param", r.params},
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
