// Training on the cuda device (device.type cuda) against the CPU trainer, and NCCL moving
// device buffers.
// - StagedUnits (testing/, the device-comparison harness) is checked here on any machine:
//   a model computing on a second CPU device through it must produce exactly the losses
//   and gradients it produces on the first.
// - With a GPU, or on the CPU emulation of CUDA and NCCL (skipped otherwise, with the
//   reason): the first fp32 steps agree with states on the GPU (NCCL, AdamW on the device)
//   and offloaded (ZeRO-Infinity's path: shards up, NCCL on the GPU, gradient shards down,
//   CPU Adam) at every stage, and at 4 ranks under hybrid sharding and hpZ; the bytes over
//   PCIe meet the formula's minimum; copies and collectives run beside the kernels; spans
//   are timed on the device; NCCL collectives move device and host buffers exactly. On a GPU only: 200 bf16 steps follow the CPU
//   trainer within the tolerance test_mixed_precision states for bf16 against fp32.
#define BOOST_TEST_MODULE cuda_training
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <unistd.h>

#include "comm/nccl_communicator.h"
#include "cuda_precondition.h"
#include "nn/cpu_device.h"
#include "nn/cuda_device.h"
#include "nn/gpt.h"
#include "nn/rng.h"
#include "runtime/train/trainer.h"
#include "staged_comparison.h"
#include "test_util.h"

#ifdef FERRY_CUDA_EMULATION
#include <cuda_runtime.h>  // the emulation's (testing/cuda_shim): its record of the order kept
#endif

using namespace ferry;
using nlohmann::json;
using nn::DType;
using nn::Tensor;

namespace {

std::vector<float> host_values(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  t.device().copy_to_host(v.data(), t);
  return v;
}

// test_cuda_training_emulated runs these GPU tests on the CPU emulation of CUDA and NCCL
// (tests/CMakeLists.txt): kernels on fibers are slow, so it runs fewer steps and leaves the
// 200-step drift test to a real GPU.
#ifdef FERRY_CUDA_EMULATION
constexpr int64_t kShortSteps = 2;
constexpr bool kEmulated = true;
constexpr int64_t kMicroBatch = 2;  // fibers per kernel scale with the rows: half the CI time
#else
constexpr int64_t kShortSteps = 10;
constexpr bool kEmulated = false;
constexpr int64_t kMicroBatch = 4;
#endif

json doc(int64_t steps) {
  return {
      {"model", {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"block_size", 32}}},
      {"data", {{"path", std::string(FERRY_SOURCE_DIR) + "/examples/data/kjv.txt"}}},
      {"device", {{"memory", "256MiB"}, {"threads", 1}}},
      {"train_micro_batch_size_per_gpu", kMicroBatch},
      {"optimizer", {{"params", {{"lr", 0.003}, {"weight_decay", 0.1}}}}},
      {"train", {{"steps", steps}, {"eval_every", 0}, {"eval_batches", 2}, {"sample_tokens", 0}}}};
}

struct Run {
  std::vector<double> losses;
  double val = 0;
  std::string log;
};

// One MPI world for the whole process (MPI starts once): a singleton of size 1. The
// trainer needs it on a GPU without offload, where NCCL starts over MPI.
comm::MpiCommunicator& mpi_world() {
  static std::unique_ptr<comm::MpiCommunicator> world = comm::MpiCommunicator::world(120);
  return *world;
}

Run train(const json& d, const std::vector<std::string>& sets) {
  Run r;
  std::ostringstream log;
  runtime::Trainer t(runtime::config_from_json(d, "cuda", "", sets, mpi_world().size()), mpi_world(), log);
  const runtime::TrainReport rep = t.run();
  for (const auto& s : rep.steps) r.losses.push_back(s.loss);
  r.val = rep.val_losses.back().second;
  r.log = log.str();
  return r;
}


struct RealGpu {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result r(!kEmulated);
    if (kEmulated)
      r.message() << "200 steps are too slow for the CPU emulation; this runs on a GPU";
    return r;
  }
};

double window_mean(const Run& r, size_t begin, size_t n) {
  double s = 0;
  for (size_t i = begin; i < begin + n; ++i) s += r.losses[i] / static_cast<double>(n);
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(staged_units_compute_exactly_as_resident_ones) {
  nn::CpuDevice compute_dev(size_t{256} << 20, 1);
  // Three micro-batches: gradients accumulate across them.
  const test::StagedComparison r = test::compare_staged(compute_dev, 3, 3, 16, 7, 3);
  for (size_t micro = 0; micro < r.direct_losses.size(); ++micro) {
    BOOST_TEST(r.direct_losses[micro] == r.staged_losses[micro]);
  }
  for (size_t u = 0; u < r.direct_grads.size(); ++u) {
    BOOST_TEST(r.direct_grads[u] == r.staged_grads[u], boost::test_tools::per_element());
  }
  // Every staged copy was handed back: nothing of the units is left on the compute device.
  BOOST_TEST(r.compute_in_use_after == 0u);
}

BOOST_AUTO_TEST_CASE(cuda_trainer_follows_the_cpu_trainer_for_200_steps_in_bf16,
                     *boost::unit_test::precondition(test::CudaPresent{}) *
                         boost::unit_test::precondition(RealGpu{})) {
  const Run cpu = train(doc(200), {"bf16.enabled=true"});
  const Run gpu = train(doc(200), {"bf16.enabled=true", "device.type=cuda"});
  BOOST_TEST(gpu.log.find("device: cuda:") != std::string::npos);
  // Two bf16 trajectories round differently and, after some tens of steps, drift apart
  // chaotically: on the H100 and H200 the 20-step windows agreed to 3e-4 over steps 1-40
  // and then differed by up to 0.043 (row kernels), 0.086 (flash) and 0.112 (mma
  // attention, fused head, GEMM epilogues) with the same validation loss at step 200 (2.739
  // and 2.741 against the CPU's 2.699; docs/design/gpu-questions.md, Q2). So the kernels'
  // error is held where the trajectories have not diverged yet, the first 40 steps, and
  // the end by the validation loss; the middle windows are printed, not held.
  double worst = 0, early = 0;
  for (size_t w = 0; w < 200; w += 20) {
    const double gap = std::abs(window_mean(gpu, w, 20) - window_mean(cpu, w, 20));
    BOOST_TEST_MESSAGE("steps " << w + 1 << "-" << w + 20 << ": cpu " << window_mean(cpu, w, 20)
                                << ", cuda " << window_mean(gpu, w, 20) << ", gap " << gap);
    worst = std::max(worst, gap);
    if (w < 40) early = std::max(early, gap);
  }
  BOOST_TEST_MESSAGE("worst window gap " << worst << " (steps 1-40: " << early << "); validation cpu " << cpu.val
                                         << ", cuda " << gpu.val);
  BOOST_TEST(early < 0.01);
  BOOST_TEST(std::abs(gpu.val - cpu.val) < 0.05);
  BOOST_TEST(window_mean(gpu, 180, 20) < gpu.losses[0] - 2.0);
}

// fp32, 10 steps (2 in the emulation). The GPU path at every stage x every optimizer placement (none, cpu, nvme; stage 3 with
// its parameters offloaded beside it), each against the CPU trainer; and bf16 with states
// on the GPU and with stage 3 offloaded, within 1e-2. One rank runs the states-on-GPU rows
// and the two ZeRO-Infinity rows; 2 and 4 ranks run all of them (tests/CMakeLists.txt).
std::string nvme_dir() {
  static const std::string dir = [] {
    const auto d = std::filesystem::temp_directory_path() / ("ferry-cuda-nvme-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d.string();
  }();
  return dir;
}

std::vector<std::vector<std::string>> gpu_variants(bool all) {
  std::vector<std::vector<std::string>> v;
  for (int stage = 0; stage <= 3; ++stage) {
    for (const std::string tier : {"none", "cpu", "nvme"}) {
      const bool infinity = stage == 3 && tier != "none";
      if (stage == 0 && tier != "none") continue;  // the optimizer is offloaded from stage 1
      if (!all && tier != "none" && !infinity) continue;
      std::vector<std::string> sets = {"device.type=cuda", "zero_optimization.stage=" + std::to_string(stage)};
      if (tier != "none") {
        sets.push_back("zero_optimization.offload_optimizer.device=" + tier);
        sets.push_back("zero_optimization.offload_optimizer.nvme_path=" + nvme_dir());
      }
      if (infinity) {
        sets.push_back("zero_optimization.offload_param.device=" + tier);
        sets.push_back("zero_optimization.offload_param.nvme_path=" + nvme_dir());
        sets.push_back("zero_optimization.offload_param.buffer_size=65536");
      }
      v.push_back(sets);
    }
  }
  return v;
}

// Hybrid sharding and hpZ at 4 ranks (groups of 2): the replicas' all-reduce runs over NCCL
// where the reduced shards stay on the device and over MPI where they went down to host
// memory; hpZ's node copies are gathered over a node NCCL communicator of their own.
std::vector<std::vector<std::string>> layout_variants() {
  const std::vector<std::string> s3 = {"device.type=cuda", "zero_optimization.stage=3"};
  const std::vector<std::string> offloaded = {"zero_optimization.offload_optimizer.device=cpu",
                                              "zero_optimization.offload_param.device=cpu",
                                              "zero_optimization.offload_param.buffer_size=65536"};
  std::vector<std::vector<std::string>> v;
  for (const std::string layout : {"zero_optimization.shard_group_size=2", "zero_optimization.zero_hpz_partition_size=2"}) {
    for (bool off : {false, true}) {
      std::vector<std::string> sets = s3;
      sets.push_back(layout);
      if (off) sets.insert(sets.end(), offloaded.begin(), offloaded.end());
      v.push_back(sets);
    }
  }
  return v;
}

BOOST_AUTO_TEST_CASE(cuda_trainer_fp32_steps_match_the_cpu_trainer,
                     *boost::unit_test::precondition(test::CudaPresent{})) {
  const Run cpu = train(doc(kShortSteps), {});
  auto variants = gpu_variants(mpi_world().size() > 1);
  if (mpi_world().size() == 4) {
    for (auto& sets : layout_variants()) variants.push_back(sets);
  }
  // Real cuBLAS sums in another order than the emulation's double loop and the CPU
  // device's blocks; the margin a GPU leaves is printed (review Q2).
  const double tolerance = kEmulated ? 1e-5 : 1e-4;
  for (const auto& sets : variants) {
    const Run gpu = train(doc(kShortSteps), sets);
    double worst = 0;
    std::string name;
    for (const auto& s : sets) name += s + " ";
    BOOST_TEST_CONTEXT(name) {
      for (size_t i = 0; i < static_cast<size_t>(kShortSteps); ++i) {
        BOOST_TEST(std::abs(gpu.losses[i] - cpu.losses[i]) < tolerance * cpu.losses[i]);
        worst = std::max(worst, std::abs(gpu.losses[i] - cpu.losses[i]) / cpu.losses[i]);
      }
    }
    BOOST_TEST_MESSAGE("fp32 " << name << "at " << mpi_world().size() << " rank(s): worst relative loss gap "
                               << worst << " over " << kShortSteps << " steps (tolerance " << tolerance << ")");
  }
  // bf16 with states on the GPU (the compute copies, casts and mixed GEMMs of that path),
  // and stage 3 with everything offloaded (bf16 gathers of uploaded shards).
  const Run cpu16 = train(doc(kShortSteps), {"bf16.enabled=true"});
  const Run gpu16 = train(doc(kShortSteps), {"bf16.enabled=true", "device.type=cuda"});
  const Run inf16 = train(doc(kShortSteps), {"bf16.enabled=true", "device.type=cuda", "zero_optimization.stage=3",
                                             "zero_optimization.offload_optimizer.device=cpu",
                                             "zero_optimization.offload_param.device=cpu"});
  // Each attention kernel named (the default, auto, takes the tensor cores here: bf16,
  // head size 16, the emulated H100).
  const Run simt16 = train(doc(kShortSteps), {"bf16.enabled=true", "device.type=cuda", "device.attention_kernel=simt"});
  const Run tc16 =
      train(doc(kShortSteps), {"bf16.enabled=true", "device.type=cuda", "device.attention_kernel=tensor_cores"});
  for (size_t i = 0; i < static_cast<size_t>(kShortSteps); ++i) {
    BOOST_TEST(std::abs(gpu16.losses[i] - cpu16.losses[i]) < 1e-2 * cpu16.losses[i]);
    BOOST_TEST(std::abs(inf16.losses[i] - cpu16.losses[i]) < 1e-2 * cpu16.losses[i]);
    BOOST_TEST(std::abs(simt16.losses[i] - cpu16.losses[i]) < 1e-2 * cpu16.losses[i]);
    BOOST_TEST(std::abs(tc16.losses[i] - cpu16.losses[i]) < 1e-2 * cpu16.losses[i]);
    BOOST_TEST(tc16.losses[i] == gpu16.losses[i]);  // auto chose the tensor cores
  }
}

// QLoRA on the GPU (lora.base_dtype nf4): the NF4 blobs uploaded as bytes, dequantized by
// the cuda kernel into bf16 panels for cuBLAS, stages 0 and 3 (shards in host memory, so
// the base crosses PCIe in 4 bits; and everything on the device: bf16 shards, device Adam
// on the adapters' fp32 master beside them): the CPU trainer's losses within the bf16 margin;
// with device.nf4_gemm fused (the base dequantized in the GEMM's operand load, no panel) the
// panel path's within the GEMM's rounding, stage 3 offloaded too.
BOOST_AUTO_TEST_CASE(qlora_on_the_gpu_follows_the_cpu_trainer, *boost::unit_test::precondition(test::CudaPresent{})) {
  json d = doc(kShortSteps);
  d["bf16"] = {{"enabled", true}};
  d["lora"] = {{"r", 4}, {"target_modules", "all-linear"}, {"base_dtype", "nf4"}};
  const Run cpu = train(d, {});
  const Run gpu = train(d, {"device.type=cuda"});
  const Run off = train(d, {"device.type=cuda", "zero_optimization.stage=3", "zero_optimization.offload_optimizer.device=cpu",
                            "zero_optimization.offload_param.device=cpu"});
  const Run dev3 = train(d, {"device.type=cuda", "zero_optimization.stage=3"});
  const Run fused = train(d, {"device.type=cuda", "device.nf4_gemm=fused"});
  const Run fused_off = train(d, {"device.type=cuda", "device.nf4_gemm=fused", "zero_optimization.stage=3",
                                  "zero_optimization.offload_optimizer.device=cpu",
                                  "zero_optimization.offload_param.device=cpu"});
  for (size_t i = 0; i < static_cast<size_t>(kShortSteps); ++i) {
    BOOST_TEST(std::abs(gpu.losses[i] - cpu.losses[i]) < 1e-2 * cpu.losses[i]);
    BOOST_TEST(std::abs(fused.losses[i] - gpu.losses[i]) < 1e-3 * gpu.losses[i]);
    BOOST_TEST(std::abs(fused_off.losses[i] - fused.losses[i]) <= (kEmulated ? 0.0 : 1e-5) * fused.losses[i]);
    // The same kernels on the same bytes (a GPU's cuBLAS may choose by pointer alignment).
    BOOST_TEST(std::abs(off.losses[i] - gpu.losses[i]) <= (kEmulated ? 0.0 : 1e-5) * gpu.losses[i]);
    BOOST_TEST(std::abs(dev3.losses[i] - gpu.losses[i]) <= (kEmulated ? 0.0 : 1e-5) * gpu.losses[i]);
  }
  BOOST_TEST_MESSAGE("qlora: cpu " << cpu.losses.back() << ", gpu " << gpu.losses.back() << ", gpu offloaded "
                                   << off.losses.back() << ", gpu fused " << fused.losses.back());
}

// device.attention_kernel=tensor_cores where they cannot run (an fp32 model) stops the
// run before its first step, naming the key and what is missing.
BOOST_AUTO_TEST_CASE(tensor_cores_for_an_fp32_model_are_refused_naming_the_key,
                     *boost::unit_test::precondition(test::CudaPresent{})) {
  BOOST_CHECK_EXCEPTION(train(doc(1), {"device.type=cuda", "device.attention_kernel=tensor_cores"}),
                        std::invalid_argument, [](const std::invalid_argument& e) {
                          BOOST_TEST_MESSAGE(e.what());
                          const std::string m = e.what();
                          return m.find("key 'device.attention_kernel'") != std::string::npos &&
                                 m.find("bf16 or f16 activations") != std::string::npos &&
                                 m.find("head size 16") != std::string::npos;
                        });
}

// Only shards cross PCIe (docs/design/zero.md, "Bytes over PCIe"): at stage 3 with parameters
// and optimizer offloaded, per micro-batch each unit's shard goes up twice (forward's and
// backward's gathers) in the compute dtype and its reduced fp32 gradient shard comes down
// once; besides, the tokens and targets go up and the loss comes down. The cuda device
// counts every copy; a step must stay within 10% of that minimum.
BOOST_AUTO_TEST_CASE(offloaded_stage3_moves_shards_not_units, *boost::unit_test::precondition(test::CudaPresent{})) {
  for (const bool bf16 : {false, true}) {
    std::ostringstream log;
    std::vector<std::string> sets = {"device.type=cuda", "zero_optimization.stage=3",
                                     "zero_optimization.offload_optimizer.device=cpu",
                                     "zero_optimization.offload_param.device=cpu", "gradient_accumulation_steps=2"};
    if (bf16) sets.push_back("bf16.enabled=true");
    runtime::Trainer t(runtime::config_from_json(doc(2), "cuda", "", sets, mpi_world().size()), mpi_world(), log);
    const runtime::TrainReport rep = t.run();
    // GPT ties its head to the embedding: unit 0 is gathered a third time (forward's head
    // keeps it for backward's head; backward's embedding gathers it again).
    int64_t shard_elems = 0, gathered = 0;
    for (int u = 0; u < t.units().num_units(); ++u) {
      shard_elems += t.units().partition_of(u).shard;
      gathered += (u == 0 ? 3 : 2) * t.units().partition_of(u).shard;
    }
    const uint64_t micro = 2, B = kMicroBatch, T = 32, param_bytes = bf16 ? 2 : 4;
    const uint64_t up = micro * (static_cast<uint64_t>(gathered) * param_bytes + 2 * B * T * 4);
    const uint64_t down = micro * static_cast<uint64_t>(shard_elems) * 4 + 8;
    for (const runtime::StepStats& s : rep.steps) {
      // The copies are traced on the device's clock as activities of their own; every
      // shard copy is one (the rest of the bytes are the tokens, the loss and id flags).
      const size_t up_a = static_cast<size_t>(Activity::upload), down_a = static_cast<size_t>(Activity::download);
      BOOST_TEST(s.time.bytes[up_a] == up - micro * 2 * B * T * 4);
      BOOST_TEST(s.time.bytes[down_a] == micro * static_cast<uint64_t>(shard_elems) * 4);
      BOOST_TEST(s.time.busy_s[up_a] > 0.0);
      BOOST_TEST(s.time.busy_s[down_a] > 0.0);
      BOOST_TEST_MESSAGE((bf16 ? "bf16" : "fp32") << " step " << s.step << " at " << mpi_world().size()
                                                  << " rank(s): up " << s.to_device_bytes << " B (minimum " << up
                                                  << "), down " << s.to_host_bytes << " B (minimum " << down << ")");
      BOOST_TEST(s.to_device_bytes >= up);
      BOOST_TEST(s.to_device_bytes <= up + up / 10);
      BOOST_TEST(s.to_host_bytes >= down);
      BOOST_TEST(s.to_host_bytes <= down + down / 10);
    }
  }
}

// The same with adapters (LoRA on a bf16 base, QLoRA on an NF4 one): the base goes up once
// per use inside each unit's stored shard (trained shard, alignment gap, frozen shard, in
// the shards' 16-bit dtype) and never comes down: the gradients that come down are the
// trained shards' only. The NF4 base's uploads are the smaller.
BOOST_AUTO_TEST_CASE(offloaded_adapters_move_the_base_up_once_per_use_and_never_down,
                     *boost::unit_test::precondition(test::CudaPresent{})) {
  uint64_t ups[2] = {0, 0};
  for (const bool nf4 : {false, true}) {
    std::ostringstream log;
    json d = doc(2);
    d["bf16"] = {{"enabled", true}};
    d["lora"] = {{"r", 4}, {"target_modules", "all-linear"}, {"base_dtype", nf4 ? "nf4" : "compute"}};
    const std::vector<std::string> sets = {"device.type=cuda", "zero_optimization.stage=3",
                                           "zero_optimization.offload_optimizer.device=cpu",
                                           "zero_optimization.offload_param.device=cpu", "gradient_accumulation_steps=2"};
    runtime::Trainer t(runtime::config_from_json(d, "cuda", "", sets, mpi_world().size()), mpi_world(), log);
    const runtime::TrainReport rep = t.run();
    uint64_t stored = 0, trained = 0;
    for (int u = 0; u < t.units().num_units(); ++u) {
      // GPT's tied embedding is gathered three times a micro-batch (see above).
      stored += static_cast<uint64_t>((u == 0 ? 3 : 2) * t.units().spans_of(u).stored());
      if (t.units().trains(u)) trained += static_cast<uint64_t>(t.units().partition_of(u).shard);
    }
    const uint64_t micro = 2;
    const size_t up_a = static_cast<size_t>(Activity::upload), down_a = static_cast<size_t>(Activity::download);
    for (const runtime::StepStats& s : rep.steps) {
      BOOST_TEST(s.time.bytes[up_a] == micro * stored * 2);        // bf16 shards, the base's bytes once per use
      BOOST_TEST(s.time.bytes[down_a] == micro * trained * 4);     // fp32 gradients of the adapters only
      ups[nf4 ? 1 : 0] = s.time.bytes[up_a];
    }
    BOOST_TEST_MESSAGE((nf4 ? "QLoRA" : "LoRA") << " at " << mpi_world().size() << " rank(s): up "
                                                << ups[nf4 ? 1 : 0] << " B a step, down " << micro * trained * 4 << " B");
  }
  BOOST_TEST(ups[1] < ups[0]);
}

// Review F6: on a GPU the step breakdown and the trace hold device time. The emulation
// runs kernels only when the step's loss is read, after every unit's span has closed, so
// spans timed by the host (enqueue time) would hold a sliver of the step, while spans
// timed by device marks hold the kernels' execution; at several ranks the collectives,
// which the host only queues, show device time too.
BOOST_AUTO_TEST_CASE(gpu_spans_are_timed_on_the_device, *boost::unit_test::precondition(test::CudaPresent{})) {
  for (const char* stage : {"zero_optimization.stage=0", "zero_optimization.stage=3"}) {
    std::ostringstream log;
    runtime::Trainer t(runtime::config_from_json(doc(2), "cuda", "", {"device.type=cuda", stage}, mpi_world().size()),
                       mpi_world(), log);
    const runtime::TrainReport rep = t.run();
    const StepBreakdown& b = rep.steps.back().time;
    const double compute = b.busy_s[static_cast<size_t>(Activity::compute)];
    BOOST_TEST_MESSAGE(stage << ": step wall " << b.wall_s << " s, compute on the device " << compute << " s");
    // Four ranks on two cores shared with other work gave 0.29-0.69 of the step (their
    // kernels wait for a core; 0.3 failed there once). Enqueue time would be a sliver
    // (review F6).
    BOOST_TEST(compute > 0.1 * b.wall_s);
    BOOST_TEST(compute <= 1.05 * b.wall_s);
    if (mpi_world().size() > 1) {
      const double comm = b.busy_s[static_cast<size_t>(Activity::all_reduce)] +
                          b.busy_s[static_cast<size_t>(Activity::all_gather)] +
                          b.busy_s[static_cast<size_t>(Activity::reduce_scatter)];
      BOOST_TEST(comm > 0.0);
    }
  }
}

// Issue 17: the shards' copies and the collectives run beside the kernels, not between
// them. Stage 3 with parameters and optimizer offloaded, 2 micro-batches per step:
// - On the emulation, which runs one op at a time, "beside" is the order the code asks a
//   GPU to keep (the emulator's vector clocks: stream order, event waits, blocking host
//   waits), over the steady-state steps 2 and 3: a copy or collective that no kernel is
//   ordered against, and that is ordered against no kernel, may run while that kernel
//   does. Nearly every shard upload, gradient download and collective must have such a
//   kernel (the exceptions, each with its reason, below), and the host may block only a
//   few times per step; a host wait after every op (FERRY_CUDA_SYNC=1) leaves none, a
//   copy stream made to wait for compute leaves 8 of 44 uploads.
// - On a GPU, the trace's device-timed spans: some upload and download time (and at
//   several ranks, some collective time) falls inside compute spans.
BOOST_AUTO_TEST_CASE(copies_and_collectives_run_beside_kernels, *boost::unit_test::precondition(test::CudaPresent{})) {
  const std::string trace = (std::filesystem::path(nvme_dir()) / "overlap.json").string();
  const std::vector<std::string> sets = {"device.type=cuda",
                                         "zero_optimization.stage=3",
                                         "zero_optimization.offload_optimizer.device=cpu",
                                         "zero_optimization.offload_param.device=cpu",
                                         "gradient_accumulation_steps=2",
                                         "log.trace=" + trace};
  const bool several = mpi_world().size() > 1;
#ifdef FERRY_CUDA_EMULATION
  auto& emu = ferry_emu::emu();
  emu.set_record_order(true);
  std::vector<ferry_emu::Emulator::Ordered> ops;
  size_t host_waits = 0;
  {
    std::ostringstream log;
    runtime::Trainer t(runtime::config_from_json(doc(2), "cuda", "", sets, mpi_world().size()), mpi_world(), log);
    // The set-up (initial weights) and the first step, which records the unit order and
    // fetches on demand, are not the steady state: prefetching starts with the second.
    t.train_step(0);
    emu.take_order();
    emu.take_host_waits();
    for (int64_t step = 1; step < 3; ++step) t.train_step(step);
    ops = emu.take_order();
    host_waits = emu.take_host_waits();
  }
  emu.set_record_order(false);
  auto is = [](const ferry_emu::Emulator::Ordered& o, const char* prefix) { return o.what.rfind(prefix, 0) == 0; };
  std::vector<const ferry_emu::Emulator::Ordered*> kernels;
  std::set<const ferry_emu::Stream*> busy_streams;  // where kernels or collectives run
  for (const auto& o : ops) {
    if (!is(o, "memcpy") && !is(o, "memset") && !is(o, "nccl") && !is(o, "cudaFree")) kernels.push_back(&o);
    if (!is(o, "memcpy") && !is(o, "memset") && !is(o, "cudaFree")) busy_streams.insert(o.stream);
  }
  // Shard copies run on the copy streams, where no kernel or collective runs (the tokens
  // go up there too; the loss and the error flags come down after the compute stream's
  // kernels, NCCL stages host buffers on its own stream).
  std::map<std::string, std::pair<int, int>> beside;  // kind -> (ops with a concurrent kernel, ops)
  for (const auto& o : ops) {
    std::string kind;
    const bool copy_stream = !busy_streams.count(o.stream);
    if (is(o, "memcpy HtoD") && copy_stream) kind = "upload";
    else if (is(o, "memcpy DtoH") && copy_stream) kind = "download";
    else if (is(o, "nccl")) kind = o.what;
    else continue;
    const bool any = std::any_of(kernels.begin(), kernels.end(),
                                 [&](const auto* k) { return ferry_emu::Emulator::concurrent(o, *k); });
    if (!any && std::getenv("FERRY_TEST_SHOW_ORDER")) BOOST_TEST_MESSAGE("ordered against every kernel: " << kind << " op " << o.id);
    beside[kind].first += any;
    beside[kind].second += 1;
  }
  BOOST_TEST(kernels.size() > 100u);
  BOOST_TEST_MESSAGE("host waits at " << mpi_world().size() << " rank(s): " << host_waits << " in 2 steps");
  // The host waits a handful of times per step (the loss read, the gradient norms, the
  // step's last reductions, NCCL's host-staged scalars): 10 in 2 steps at 1 rank, 13-15
  // at 2 and 4, 12 with 6 layers instead of 2. A wait per unit and micro-batch would add
  // 16 here.
  BOOST_TEST(host_waits <= 2 * 10u);
  for (const auto& [kind, n] : beside)
    BOOST_TEST_MESSAGE(kind << " at " << mpi_world().size() << " rank(s): " << n.first << " of " << n.second
                            << " may run beside a kernel");
  // Steps 2 and 3, 2 micro-batches each, 4 units: every shard crosses as its own upload
  // (the tied embedding three times), the tokens and targets go up beside them.
  BOOST_TEST(beside["upload"].second >= 2 * 2 * 4 * 2);
  BOOST_TEST(beside["download"].second >= 2 * 2 * 4);
  // Uploads are issued ahead of use, beside the kernels of the units before. Some are not:
  // a step's first (nothing queued before it), and one into a block a kernel has just
  // released (the allocator prefers idle blocks; whether one is idle depends on the
  // seeded device progress): 2-6 of 44 over seeds 1-7.
  BOOST_TEST(beside["upload"].first >= beside["upload"].second * 8 / 10);
  // Gradient shards come down after their own reduce-scatter, beside the next units'
  // backward. Per step two cannot: the last unit's (no compute left) and the loss read.
  BOOST_TEST(beside["download"].first >= beside["download"].second - 2 * 2);
  if (several) {
    // A micro-batch's first gather is consumed by the next kernel; the others are
    // issued ahead (measured 28 of 36 at 2 and 4 ranks). Reductions run beside the
    // backward of the units before, all but a step's last (14 of 16 unloaded). A rank that
    // lags (a loaded machine: NCCL is emulated over MPI, in real time) finds its peer
    // already waiting, so its reduction completes at once; the queue's next poll finishes
    // it and orders the compute stream after it before another kernel is issued: nothing
    // was left to overlap, on a GPU too. Measured with two CPU hogs at nice 19: 14 on 20
    // rank-runs, 13 on 4; CI saw 12 twice (docs/design/testing.md). A schedule that
    // ordered reductions against the backward would leave 0-2.
    BOOST_TEST(beside["ncclAllGather"].first >= beside["ncclAllGather"].second * 2 / 3);
    BOOST_TEST(beside["ncclReduceScatter"].first >= beside["ncclReduceScatter"].second * 2 / 3);
    BOOST_TEST(beside["ncclReduceScatter"].second >= 2 * 2 * 4);
  }
#else
  train(doc(kShortSteps), sets);
  // The trace, rank by rank: spans on the device clock, tid = activity + 1.
  std::map<int, std::vector<std::pair<double, double>>> spans;
  std::ifstream in(trace_path_for_rank(trace, mpi_world().rank()));
  for (std::string line; std::getline(in, line);) {
    const size_t b = line.find('{'), e_end = line.rfind('}');
    if (b == std::string::npos || e_end == std::string::npos || e_end < b) continue;
    line = line.substr(b, e_end - b + 1);  // one event per line, between "[" and "]" and commas
    const json e = json::parse(line, nullptr, false);
    if (e.is_discarded() || !e.is_object() || e.value("ph", "") != "X") continue;
    spans[e.value("tid", 0) - 1].push_back({e.value("ts", 0.0), e.value("ts", 0.0) + e.value("dur", 0.0)});
  }
  auto inside_compute = [&](Activity a) {
    double t = 0;
    for (const auto& [b, e] : spans[static_cast<int>(a)])
      for (const auto& [cb, ce] : spans[static_cast<int>(Activity::compute)]) t += std::max(0.0, std::min(e, ce) - std::max(b, cb));
    return t;
  };
  for (Activity a : {Activity::upload, Activity::download}) {
    BOOST_TEST_MESSAGE(activity_name(a) << ": " << inside_compute(a) * 1e-3 << " ms inside compute spans");
    BOOST_TEST(inside_compute(a) > 0.0);
  }
  if (several)
    BOOST_TEST(inside_compute(Activity::all_gather) + inside_compute(Activity::reduce_scatter) > 0.0);
#endif
}

// At any number of ranks (one GPU each): every collective on device buffers, and host
// buffers staged through device memory.
BOOST_AUTO_TEST_CASE(nccl_moves_device_and_host_buffers,
                     *boost::unit_test::precondition(test::CudaPresent{})) {
  auto dev = nn::make_cuda_device(size_t{64} << 20);
  auto nccl = comm::NcclCommunicator::create(mpi_world(), nn::cuda_compute_stream(*dev), 60);
  const int W = nccl->size(), me = nccl->rank();
  BOOST_TEST(W == mpi_world().size());
  constexpr size_t n = 1001;
  auto value = [](int rank, size_t i) { return static_cast<float>(i) * 0.5f - 7.f + static_cast<float>(rank); };
  std::vector<float> mine(n);
  for (size_t i = 0; i < n; ++i) mine[i] = value(me, i);
  const Tensor a = Tensor::empty(*dev, DType::f32, {static_cast<int64_t>(n)}),
               b = Tensor::empty(*dev, DType::f32, {static_cast<int64_t>(n) * W});
  dev->copy_from_host(a, mine.data());
  dev->fill(b, 0);
  auto w = nccl->all_gather(a.data(), b.data(), n, comm::DataType::f32);
  nccl->order_consumer(*w);  // the compute stream reads b after the gather, no host wait
  const std::vector<float> gathered = host_values(b);
  for (int r = 0; r < W; ++r)
    for (size_t i = 0; i < n; i += 97) BOOST_TEST(gathered[static_cast<size_t>(r) * n + i] == value(r, i));
  dev->scale(a, 2.0);  // ordered before the reduction by the communicator's event
  w = nccl->all_reduce(a.data(), n, comm::DataType::f32, comm::ReduceOp::avg);
  nccl->order_consumer(*w);
  const std::vector<float> got = host_values(a);
  for (size_t i = 0; i < n; i += 97) {
    double mean = 0;
    for (int r = 0; r < W; ++r) mean += 2.0 * value(r, i) / W;
    BOOST_TEST(std::abs(got[i] - mean) <= 1e-5 * (1 + std::abs(mean)));
  }
  const Tensor shard = Tensor::empty(*dev, DType::f32, {7});
  dev->fill(b, 1.0);
  w = nccl->reduce_scatter(b.data(), shard.data(), 7, comm::DataType::f32, comm::ReduceOp::sum);
  nccl->order_consumer(*w);
  for (float x : host_values(shard)) BOOST_TEST(x == static_cast<float>(W));
  double host[2] = {1.5 + me, -2.0};  // host buffers are staged through device memory
  nccl->all_reduce(host, 2, comm::DataType::f64, comm::ReduceOp::sum)->wait();
  BOOST_TEST(host[0] == 1.5 * W + W * (W - 1) / 2.0);
  BOOST_TEST(host[1] == -2.0 * W);
  int32_t root_value = me == 0 ? 41 : -1;
  nccl->broadcast(&root_value, 1, comm::DataType::i32, 0)->wait();
  BOOST_TEST(root_value == 41);
  nccl->barrier()->wait();
}

// Without a GPU the NCCL backend refuses to start and says why.
BOOST_AUTO_TEST_CASE(nccl_reports_why_it_is_unavailable) {
  const comm::NcclStatus s = comm::nccl_status();
  if (s.reason.empty()) return;  // a GPU is here: the test above ran
  BOOST_CHECK_EXCEPTION(comm::NcclCommunicator::create(mpi_world(), nullptr, 60), comm::CommError,
                        [&](const comm::CommError& e) {
                          return std::string(e.what()).find(s.reason) != std::string::npos;
                        });
}

// The GPU arena's peak on the offloaded path stays bounded by the prefetch settings, not
// by the model: against the CPU device's arena (the same activations and gathered units,
// which test_plan equals to the byte), the GPU holds only shards in flight, gradients
// waiting for their download and blocks whose fence has not fired. Measured on the
// emulation: 1.7-3.7 units more at prefetch depths 1-3 (a 195 KiB unit, seeds 1-7; which
// step peaks highest depends on the seeded device progress); asked: at most depth + 4
// units, every step. Emulation only: a real GPU's GEMM scratch comes from the
// slab too, so there the first-run script prints the peaks instead.
BOOST_AUTO_TEST_CASE(offloaded_gpu_arena_stays_bounded_by_the_prefetch_depth,
                     *boost::unit_test::precondition(test::CudaPresent{})) {
  if (!kEmulated) return;
  json d = doc(3);
  d["model"] = {{"n_layer", 4}, {"n_head", 2}, {"n_embd", 64}, {"block_size", 16}};
  d["train_micro_batch_size_per_gpu"] = 1;
  for (int depth : {1, 3}) {
    std::vector<size_t> peak[2];
    int64_t largest = 0;
    for (int on_gpu = 0; on_gpu < 2; ++on_gpu) {
      std::ostringstream log;
      const std::vector<std::string> sets = {std::string("device.type=") + (on_gpu ? "cuda" : "cpu"),
                                             "zero_optimization.stage=3",
                                             "zero_optimization.offload_optimizer.device=cpu",
                                             "zero_optimization.offload_param.device=cpu",
                                             "schedule.prefetch_depth=" + std::to_string(depth)};
      runtime::Trainer t(runtime::config_from_json(d, "cuda", "", sets, mpi_world().size()), mpi_world(), log);
      for (const runtime::StepStats& s : t.run().steps) peak[on_gpu].push_back(s.device_peak_bytes);
      for (int u = 0; u < t.units().num_units(); ++u) largest = std::max(largest, t.units().partition_of(u).padded);
    }
    const size_t unit_bytes = static_cast<size_t>(largest) * 4;
    for (size_t s = 0; s < peak[0].size(); ++s) {
      BOOST_TEST_MESSAGE("depth " << depth << " step " << s + 1 << ": GPU arena peak " << peak[1][s] << " B, cpu "
                                  << peak[0][s] << " B, largest unit " << unit_bytes << " B");
      BOOST_TEST(peak[1][s] <= peak[0][s] + static_cast<size_t>(depth + 4) * unit_bytes);
    }

  }
}
