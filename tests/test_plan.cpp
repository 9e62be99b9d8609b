// ferry plan's memory figures against real runs: for every legal stage and offload choice,
// at 1 and 2 ranks, a few training steps' measured device-arena peak, host state bytes,
// pinned pool and nvme bytes (Trainer::memory_by_tier) against plan_memory(), which runs
// the same engine on counting devices: every figure must be equal, to the byte. And the
// step-time arithmetic on rates read from ferry-bench result files.
#define BOOST_TEST_MODULE plan
#include <boost/test/unit_test.hpp>

#include <fstream>
#include <mutex>
#include <sstream>
#include <tuple>

#include <chrono>

#include "nn/counting_device.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "runtime/tools/plan.h"
#include "runtime/train/trainer.h"
#include "test_util.h"

using namespace ferry;
using namespace ferry::runtime;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// Two shapes: the embedding is the largest unit (16 channels), or a block is (96). Small,
// so that the 88 runs stay quick under the sanitizers.
Config config_for(int stage, const std::string& opt, const std::string& par, const std::string& nvme, int world,
                  int64_t channels, bool checkpointing = false, bool llama = false, const json& extra = json::object()) {
  json d = {{"model", {{"n_layer", 3}, {"n_head", 4}, {"n_embd", channels}, {"block_size", 32}, {"vocab_size", 256}}},
            {"data", {{"path", std::string(FERRY_SOURCE_DIR) + "/tests/data/kjv-64k.txt"}}},
            {"device", {{"memory", "512MiB"}, {"threads", 1}}},
            {"train_micro_batch_size_per_gpu", 2},
            {"activation_checkpointing", {{"enabled", checkpointing}}},
            {"gradient_accumulation_steps", 2},
            {"train", {{"steps", 2}, {"eval_every", 0}, {"eval_batches", 1}, {"sample_tokens", 0}}},
            {"zero_optimization",
             {{"stage", stage},
              {"offload_optimizer", {{"device", opt}}},
              {"offload_param", {{"device", par}}}}}};
  if (llama) {
    d["model"]["arch"] = "llama";
    d["model"]["n_kv_head"] = 2;
    d["model"]["intermediate_size"] = channels * 5 / 2;
  }
  if (opt == "nvme") d["zero_optimization"]["offload_optimizer"]["nvme_path"] = nvme;
  if (par == "nvme") d["zero_optimization"]["offload_param"]["nvme_path"] = nvme;
  d.update(extra);
  return config_from_json(d, "test", "", {}, world);
}

struct Measured {
  TierMemory m;
  size_t device_peak = 0;
};

Measured measure(const Config& c, int world) {
  Measured out;
  std::mutex mu;
  test::run_ranks(world, [&](int rank, comm::Communicator& comm) {
    std::ostringstream discard;
    Trainer t(c, comm, discard);
    size_t peak = 0;
    for (int64_t s = 0; s < c.train.steps; ++s) peak = std::max(peak, t.train_step(s).device_peak_bytes);
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out.m = t.memory_by_tier();
      out.device_peak = peak;
    }
  });
  return out;
}

// Trains `c` at `world` ranks, prints planned against measured, and checks that the
// arena's peak, host, pinned and nvme bytes are what the plan says.
MemoryPlan check_against_run(const Config& c, int world, const std::string& label) {
  const MemoryPlan p = plan_memory(c, world);
  const Measured got = measure(c, world);
  const double ratio = static_cast<double>(p.device_peak) / static_cast<double>(got.device_peak);
  BOOST_TEST_MESSAGE(label << ": device peak planned " << p.device_peak << " measured " << got.device_peak << " ("
                           << ratio << "), host " << p.host_states << "/" << got.m.host_states << ", pinned "
                           << p.host_pinned << "/" << got.m.host_pinned << ", nvme " << p.nvme << "/" << got.m.nvme);
  BOOST_TEST_CONTEXT(label) {
    BOOST_TEST(p.device_peak == got.device_peak);
    BOOST_TEST(p.host_states == got.m.host_states);
    BOOST_TEST(p.host_pinned == got.m.host_pinned);
    BOOST_TEST(p.nvme == got.m.nvme);
    BOOST_TEST(p.device_states + p.device_activations + p.device_transient == p.device_peak);
  }
  return p;
}

}  // namespace

BOOST_AUTO_TEST_CASE(memory_matches_real_runs) {
  test::TempDir dir("plan_nvme");
  for (int world : {1, 2}) {
   for (int64_t channels : {16, 96}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (const char* opt : {"none", "cpu", "nvme"}) {
        if (stage == 0 && std::string(opt) != "none") continue;
        for (const char* par : {"none", "cpu", "nvme"}) {
          if (stage < 3 && std::string(par) != "none") continue;
          const Config c = config_for(stage, opt, par, dir.path.string(), world, channels);
          check_against_run(c, world,
                            "channels " + std::to_string(channels) + " world " + std::to_string(world) + " stage " +
                                std::to_string(stage) + " optimizer " + opt + " params " + par);
        }
      }
    }
   }
  }
}

// Activation checkpointing changes the arena's activations; the plan follows.
BOOST_AUTO_TEST_CASE(memory_with_activation_checkpointing) {
  test::TempDir dir("plan_ckpt");
  for (int world : {1, 2}) {
    for (int64_t channels : {16, 96}) {
      for (const auto& [stage, opt, par] : std::vector<std::tuple<int, const char*, const char*>>{
               {0, "none", "none"}, {2, "cpu", "none"}, {3, "nvme", "nvme"}}) {
        const Config c = config_for(stage, opt, par, dir.path.string(), world, channels, true);
        const Config plain = config_for(stage, opt, par, dir.path.string(), world, channels, false);
        const MemoryPlan p = check_against_run(c, world,
                                               "checkpointing, channels " + std::to_string(channels) + " world " +
                                                   std::to_string(world) + " stage " + std::to_string(stage));
        BOOST_TEST(p.device_activations < plan_memory(plain, world).device_activations);
      }
    }
  }
}

// Llama-style models (grouped-query attention, SwiGLU, untied head), with and without
// activation checkpointing.
BOOST_AUTO_TEST_CASE(memory_llama) {
  test::TempDir dir("plan_llama");
  for (int world : {1, 2}) {
    for (bool ckpt : {false, true}) {
      for (const auto& [stage, opt, par] : std::vector<std::tuple<int, const char*, const char*>>{
               {0, "none", "none"}, {2, "cpu", "none"}, {3, "nvme", "nvme"}}) {
        const Config c = config_for(stage, opt, par, dir.path.string(), world, 64, ckpt, true);
        check_against_run(c, world,
                          "llama, checkpointing " + std::to_string(ckpt) + ", world " + std::to_string(world) +
                              " stage " + std::to_string(stage));
      }
    }
  }
}

// bf16: two-byte activations and gathered weights, fp32 statistics, gradients and states,
// the stages 0-2 compute copy, and what a prefetched unit holds until use (the nvme read's
// fp32 shard, the cast shard).
BOOST_AUTO_TEST_CASE(memory_bf16) {
  test::TempDir dir("plan_bf16");
  for (int world : {1, 2}) {
    for (const auto& [arch, ckpt] : std::vector<std::pair<const char*, bool>>{{"llama", false}, {"llama", true}, {"gpt2", false}}) {
      for (const auto& [stage, opt, par] : std::vector<std::tuple<int, const char*, const char*>>{
               {0, "none", "none"}, {2, "cpu", "none"}, {3, "none", "none"}, {3, "nvme", "nvme"}}) {
        const bool llama = std::string(arch) == "llama";
        Config c = config_for(stage, opt, par, dir.path.string(), world, llama ? 64 : 96, ckpt, llama);
        c.zero.compute = nn::DType::bf16;
        check_against_run(c, world,
                          std::string("bf16 ") + arch + (ckpt ? " checkpointing" : "") + ", world " +
                              std::to_string(world) + " stage " + std::to_string(stage) + " optimizer " + opt +
                              " params " + par);
      }
    }
  }
}

// LoRA (docs/guide/adapters.md): the frozen base's shards, the adapters' gradients and
// states, dropout's masked inputs; fp32 and bf16, Llama (packed q/k/v pieces) and GPT-2.
BOOST_AUTO_TEST_CASE(memory_lora) {
  test::TempDir dir("plan_lora");
  for (int world : {1, 2}) {
    for (const auto& [arch, bf16] : std::vector<std::pair<const char*, bool>>{{"llama", false}, {"llama", true}, {"gpt2", false}}) {
      for (const auto& [stage, opt, par] : std::vector<std::tuple<int, const char*, const char*>>{
               {0, "none", "none"}, {2, "cpu", "none"}, {3, "none", "none"}, {3, "cpu", "none"}, {3, "nvme", "nvme"}}) {
        const bool llama = std::string(arch) == "llama";
        const json lora = {{"lora", {{"r", 4}, {"target_modules", "all-linear"}, {"lora_dropout", 0.1}}}};
        Config c = config_for(stage, opt, par, dir.path.string(), world, llama ? 64 : 96, false, llama, lora);
        if (bf16) c.zero.compute = nn::DType::bf16;
        const MemoryPlan p = check_against_run(c, world,
                                               std::string("lora ") + arch + (bf16 ? " bf16" : "") + ", world " +
                                                   std::to_string(world) + " stage " + std::to_string(stage) +
                                                   " optimizer " + opt + " params " + par);
        // The adapters' states are a small part of the full fine-tune's.
        Config full = config_for(stage, opt, par, dir.path.string(), world, llama ? 64 : 96, false, llama);
        if (bf16) full.zero.compute = nn::DType::bf16;
        BOOST_TEST(p.device_states + p.host_states + p.nvme < plan_memory(full, world).device_states +
                                                                   plan_memory(full, world).host_states +
                                                                   plan_memory(full, world).nvme);
      }
    }
  }
}

// QLoRA: the dry run's memory equals real runs' with the base in NF4 (its blobs in the
// frozen span, gathered and offloaded as bytes), and the frozen base's stored bytes are about
// a quarter of bf16's where the matrices are large enough for the per-piece tables
// (1 KiB of 8-bit code per Hugging Face module) not to count.
BOOST_AUTO_TEST_CASE(memory_qlora) {
  test::TempDir dir("plan_qlora");
  for (int world : {1, 2}) {
    for (const auto& [stage, opt, par] : std::vector<std::tuple<int, const char*, const char*>>{
             {0, "none", "none"}, {2, "cpu", "none"}, {3, "cpu", "none"}, {3, "cpu", "cpu"}, {3, "nvme", "nvme"}}) {
      const json qlora = {{"lora", {{"r", 4}, {"target_modules", "all-linear"}, {"base_dtype", "nf4"}}},
                          {"bf16", {{"enabled", true}}}};
      const Config c = config_for(stage, opt, par, dir.path.string(), world, 64, false, true, qlora);
      BOOST_TEST(c.lora.nf4);
      check_against_run(c, world, "qlora world " + std::to_string(world) + " stage " + std::to_string(stage) +
                                      " optimizer " + opt + " params " + par);
    }
  }
  // Llama 3 8B's shape, stage 3 with the parameters in host memory: NF4 against bf16.
  auto host_weights = [&](const char* base_dtype) {
    json d = {{"model", {{"preset", "llama-8b"}, {"block_size", 1024}}},
              {"data", {{"path", std::string(FERRY_SOURCE_DIR) + "/tests/data/kjv-64k.txt"}}},
              {"bf16", {{"enabled", true}}},
              {"lora", {{"r", 16}, {"target_modules", "all-linear"}, {"base_dtype", base_dtype}}},
              {"train_micro_batch_size_per_gpu", 1},
              {"zero_optimization",
               {{"stage", 3}, {"offload_optimizer", {{"device", "cpu"}}}, {"offload_param", {{"device", "cpu"}}}}}};
    return plan_memory(config_from_json(d, "test", "", {}, 1), 1).host_states;
  };
  const double nf4 = static_cast<double>(host_weights("nf4")), bf16 = static_cast<double>(host_weights("compute"));
  BOOST_TEST_MESSAGE("Llama 3 8B LoRA r16, stage 3, states in host memory: nf4 " << nf4 << " bytes, bf16 " << bf16);
  BOOST_TEST(nf4 < 0.4 * bf16);
}

// Step-time arithmetic on rates read from ferry-bench result files.
BOOST_AUTO_TEST_CASE(time_from_bench_rates) {
  test::TempDir dir("plan_bench");
  auto bench = [&](const char* file, const char* metric, double value) {
    std::ofstream(dir.path / file) << json{{"bench", "x"}, {"headline", {{"metric", metric}, {"value", value}}}}.dump();
  };
  bench("bench-model.json", "model_gflops (gpt-50m)", 100.0);
  bench("bench-io.json", "ferry_bytes_per_s (mean over cases)", 2e9);
  bench("bench-comm.json", "ferry_gbps (all cases)", 4.0);
  bench("bench-adam.json", "params_per_s (2 threads)", 1e9);
  const Rates r = rates_from_bench(dir.path.string());
  BOOST_TEST(r.flops == 100e9);
  BOOST_TEST(r.nvme_bytes_per_s == 2e9);
  BOOST_TEST(r.comm_bytes_per_s == 4e9);
  BOOST_TEST(r.adam_params_per_s == 1e9);
  BOOST_TEST(r.sources.size() == 4u);

  Config c = config_for(3, "nvme", "nvme", "/tmp", 2, 64);
  double P = 0;
  for (const nn::UnitSpec& u : nn::GPT::layout(c.model)) P += static_cast<double>(u.numel);
  const TimePlan t = plan_time(c, 2, r);
  const double tokens = 2.0 * 2 * 32;  // micro-batch x accumulation x context, per rank
  BOOST_TEST(t.compute_s == nn::GPT::flops_per_token(c.model, 32) * tokens / 100e9, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(t.comm_bytes == 3 * 2 * 4 * P);                 // gather fwd + bwd, reduce-scatter; 2 micro-batches
  BOOST_TEST(t.comm_s == t.comm_bytes / 4e9, boost::test_tools::tolerance(1e-12));
  const double shard = P / 2;
  BOOST_TEST(t.nvme_bytes == (2 * 2 * 4 * shard + 4 * shard) + 24 * shard, boost::test_tools::tolerance(1e-12));
  // Under bf16 the parameter shards on NVMe are 2 bytes an element (the optimizer's stay fp32).
  Config half = c;
  half.zero.compute = nn::DType::bf16;
  BOOST_TEST(plan_time(half, 2, r).nvme_bytes == (2 * 2 * 2 * shard + 2 * shard) + 24 * shard, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(t.adam_s == shard / 1e9, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(t.overlapped_s() == std::max({t.compute_s, t.comm_s, t.nvme_s, t.adam_s}));
  BOOST_TEST(t.sequential_s() == t.compute_s + t.comm_s + t.nvme_s + t.adam_s, boost::test_tools::tolerance(1e-12));

  // Every legal choice listed once; fits judged against the limits given.
  const std::vector<PlanRow> rows = plan_all(c, 2, r, 1, 0);
  BOOST_TEST(rows.size() == 16u);  // stage 0: 1; stages 1-2: 3 each; stage 3: 9
  for (const PlanRow& row : rows) BOOST_TEST(!row.fits_device);  // a 1-byte device fits nothing

  bench("bench-io.json", "something_else", 1.0);
  try {
    rates_from_bench(dir.path.string());
    BOOST_FAIL("a file without the expected headline was accepted");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(std::string(e.what()).find("bench-io.json: no headline 'ferry_bytes_per_s'") != std::string::npos, e.what());
  }
}

// A 70B Llama at 8 ranks: the dry run allocates nothing real and computes nothing, so it
// takes seconds and little memory whatever the model's size.
BOOST_AUTO_TEST_CASE(plan_of_a_70b_model_is_cheap) {
  json d = {{"model",
             {{"arch", "llama"}, {"n_layer", 80}, {"n_head", 64}, {"n_kv_head", 8}, {"n_embd", 8192},
              {"intermediate_size", 28672}, {"block_size", 4096}, {"vocab_size", 128256}}},
            {"data", {{"path", std::string(FERRY_SOURCE_DIR) + "/tests/data/kjv-64k.txt"}}},
            {"device", {{"memory", "80GiB"}}},
            {"train_micro_batch_size_per_gpu", 1},
            {"zero_optimization", {{"stage", 3}, {"offload_optimizer", {{"device", "cpu"}}}}}};
  const Config c = config_from_json(d, "test", "", {}, 8);
  const size_t rss0 = peak_resident_bytes();
  const auto t0 = std::chrono::steady_clock::now();
  const MemoryPlan p = plan_memory(c, 8);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE("70b: " << seconds << " s, resident +" << (peak_resident_bytes() - rss0) << " bytes, device peak "
                             << p.device_peak << ", host " << p.host_states);
  BOOST_TEST(seconds < 30.0);
  BOOST_TEST(peak_resident_bytes() - rss0 < (size_t{1} << 30));
  double P = 0;
  for (const nn::UnitSpec& u : nn::Llama::layout(c.llama)) P += static_cast<double>(u.numel);
  // Host: the fp32 gradient shard, master, m and v of 1/8 of the parameters (padding aside).
  BOOST_TEST(static_cast<double>(p.host_states) >= 16 * P / 8);
  BOOST_TEST(static_cast<double>(p.host_states) <= 16 * P / 8 * 1.001);
  BOOST_TEST(static_cast<double>(p.device_states) >= 4 * P / 8);  // the fp32 weight shards
  BOOST_TEST(p.device_peak > p.device_states + p.device_activations);
}

// The counting device checks shapes and accounts bytes as the CPU device does.
BOOST_AUTO_TEST_CASE(counting_device_counts_and_checks) {
  nn::CountingDevice dev("test", 2000, true);
  {
    const nn::Tensor a = nn::Tensor::empty(dev, nn::DType::f32, {10, 10});
    const nn::Tensor b = nn::Tensor::empty(dev, nn::DType::f32, {10, 20});
    BOOST_TEST(dev.memory().in_use == 1200u);  // the bytes asked for, unrounded
    BOOST_CHECK_THROW(nn::Tensor::empty(dev, nn::DType::f32, {250}), nn::OutOfDeviceMemory);
    BOOST_CHECK_THROW(dev.gemm(a, a, false, b, false, 1, 0), std::invalid_argument);  // [10,10] != [10,20]
    dev.gemm(b, a, false, b, false, 1, 0);
  }
  BOOST_TEST(dev.memory().in_use == 0u);
  BOOST_TEST(dev.memory().peak == 1200u);
  BOOST_TEST(dev.allocations() == 2u);
}

// device.type cuda: GPU presets instead of the CPU defaults, unless ferry-bench results are given.
BOOST_AUTO_TEST_CASE(gpu_rates_for_cuda) {
  Config c = config_for(3, "none", "none", "/tmp", 8, 64);
  BOOST_TEST(effective_rates(c, Rates{}).flops == Rates{}.flops);  // device.type cpu
  c.device.type = "cuda";
  const Rates r = effective_rates(c, Rates{});
  BOOST_TEST(r.flops == 67e12 * kGpuAchievable);  // H100 SXM fp32
  BOOST_TEST(r.comm_bytes_per_s == 300e9);
  BOOST_TEST(r.sources.size() == 1u);
  BOOST_TEST(gpu_rates("a100", nn::DType::bf16).flops == 312e12 * kGpuAchievable);
  Rates bench;
  bench.sources.push_back("measured");
  BOOST_TEST(effective_rates(c, bench).flops == bench.flops);
  try {
    gpu_rates("v100", nn::DType::f32);
    BOOST_FAIL("an unknown GPU was accepted");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()).find("unknown GPU 'v100'") != std::string::npos, e.what());
  }
}

// Hybrid sharding: per rank, groups of G at any world size hold what a plain world of G
// holds; the time plan adds the gradient shard's all-reduce across groups.
BOOST_AUTO_TEST_CASE(hybrid_sharding_plans_the_group) {
  test::TempDir dir("plan_hybrid");
  for (int stage = 1; stage <= 3; ++stage) {
    Config hybrid = config_for(stage, "cpu", "none", dir.path.string(), 8, 96);
    hybrid.zero.shard_group_size = 2;
    const Config plain = config_for(stage, "cpu", "none", dir.path.string(), 2, 96);
    const MemoryPlan h = plan_memory(hybrid, 8), p = plan_memory(plain, 2);
    BOOST_TEST(h.device_peak == p.device_peak);
    BOOST_TEST(h.host_states == p.host_states);
    BOOST_TEST(h.host_pinned == p.host_pinned);
    const TimePlan th = plan_time(hybrid, 8, Rates{}), tp = plan_time(plain, 2, Rates{});
    double P = 0;
    for (const nn::UnitSpec& u : model_layout(plain)) P += static_cast<double>(u.numel);
    BOOST_TEST(th.comm_across_bytes == 2.0 * 4 * P / 2);
    BOOST_TEST(th.comm_bytes == tp.comm_bytes + th.comm_across_bytes);
    BOOST_TEST(tp.comm_across_bytes == 0.0);
  }
  // hpZ: the node copies (fp32 here, 1/H of each unit padded to 16 x H) are device state.
  Config hpz = config_for(3, "none", "none", dir.path.string(), 4, 96);
  hpz.zero.hpz_partition_size = 2;
  const Config no_hpz = config_for(3, "none", "none", dir.path.string(), 4, 96);
  size_t copies = 0;
  for (const nn::UnitSpec& u : model_layout(no_hpz)) copies += static_cast<size_t>(partition(u.numel, 2, 0).shard) * 4;
  BOOST_TEST(plan_memory(hpz, 4).device_states == plan_memory(no_hpz, 4).device_states + copies);
  // Its bytes: the same collectives' total; of a step's 2 x accum gathers all but the first
  // stay in the node group.
  double P = 0;
  for (const nn::UnitSpec& u : model_layout(no_hpz)) P += static_cast<double>(u.numel);
  const TimePlan th = plan_time(hpz, 4, Rates{}), tn = plan_time(no_hpz, 4, Rates{});
  const double accum = static_cast<double>(hpz.grad_accum);
  BOOST_TEST(th.comm_bytes == tn.comm_bytes);
  BOOST_TEST(th.comm_node_bytes == (2 * accum - 1) * 4 * P);
  BOOST_TEST(tn.comm_node_bytes == 0.0);
  const std::string text = format_plan(hpz, 4, Rates{}, plan_all(hpz, 4, Rates{}, 0, 0), 0, 0);
  BOOST_TEST(text.find("hpZ (stage 3): node copies in groups of 2 ranks") != std::string::npos, text);
}
