// Offload placements end to end, in one process: every legal placement of the optimizer
// state (none/cpu/nvme) and of the parameters (none/cpu/nvme, stage 3) gives the same
// losses bit for bit; a model whose states are several times the device arena trains with
// offload and fails at start without; bad placements and folders are refused by name.
#define BOOST_TEST_MODULE offload
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <ostream>

#include "nn/device.h"
#include "offload/storage.h"
#include "runtime/train/trainer.h"
#include "test_util.h"

using namespace ferry;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("offload") {}
};

json doc(int stage, const std::string& opt, const std::string& par, const std::string& nvme) {
  json d = {{"model", {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"block_size", 16}}},
            {"data", {{"path", std::string(FERRY_SOURCE_DIR) + "/tests/data/kjv-64k.txt"}}},
            {"device", {{"memory", "64MiB"}, {"threads", 2}}},
            {"train_micro_batch_size_per_gpu", 4},
            {"gradient_accumulation_steps", 2},
            {"optimizer", {{"params", {{"lr", 0.003}, {"weight_decay", 0.1}}}}},
            {"train", {{"steps", 4}, {"eval_every", 0}, {"eval_batches", 1}, {"sample_tokens", 0}}},
            {"zero_optimization",
             {{"stage", stage},
              {"offload_optimizer", {{"device", opt}, {"nvme_path", nvme}}},
              {"offload_param", {{"device", par}, {"nvme_path", nvme}, {"buffer_size", 4096}}}}}};
  return d;
}

std::vector<double> losses(const json& d) {
  comm::SingleProcessCommunicator c;
  std::ostream discard(nullptr);
  runtime::Trainer t(runtime::config_from_json(d, "test", "", {}), c, discard);
  std::vector<double> out;
  for (const auto& s : t.run().steps) out.push_back(s.loss);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_placement_gives_identical_losses) {
  TempDir dir;
  int runs = 0;
  for (int stage = 1; stage <= 3; ++stage) {
    // Per stage: stages 2-3 reduce gradients per micro-batch, stage 1 per step, so their
    // sums differ in the last bits; placement must not change a single bit.
    const std::vector<double> reference = losses(doc(stage, "none", "none", dir.path.string()));
    for (const char* opt : {"none", "cpu", "nvme"}) {
      for (const char* par : {"none", "cpu", "nvme"}) {
        if (stage < 3 && std::string(par) != "none") continue;  // parameters are sharded only at stage 3
        BOOST_TEST_CONTEXT("stage " << stage << ", optimizer " << opt << ", parameters " << par) {
          BOOST_TEST(losses(doc(stage, opt, par, dir.path.string())) == reference, boost::test_tools::per_element());
          ++runs;
        }
        if (stage == 3 && std::string(par) == "nvme") {
          // Part of the parameters cached in host memory (max_in_cpu), the rest on nvme.
          json d = doc(stage, opt, par, dir.path.string());
          d["zero_optimization"]["offload_param"]["max_in_cpu"] = 20000;
          BOOST_TEST(losses(d) == reference, boost::test_tools::per_element());
        }
      }
    }
  }
  BOOST_TEST(runs == 3 + 3 + 9);
}

BOOST_AUTO_TEST_CASE(states_larger_than_the_device_train_only_with_offload) {
  TempDir dir;
  json d = doc(3, "nvme", "nvme", dir.path.string());
  d["model"] = {{"n_layer", 8}, {"n_head", 4}, {"n_embd", 128}, {"block_size", 16}};
  d["train_micro_batch_size_per_gpu"] = 2;
  d["gradient_accumulation_steps"] = 1;
  d["train"]["steps"] = 2;
  d["device"]["memory"] = "6MiB";
  // Model states: ~1.6M parameters x 16 bytes (fp32 weights, gradients, Adam m and v).
  const auto units = nn::GPT::layout({8, 4, 128, 256, 16});
  int64_t params = 0;
  for (const auto& u : units) params += u.numel;
  const double states = 16.0 * static_cast<double>(params);
  BOOST_TEST(states > 4 * 6.0 * (1 << 20));  // more than four times the arena
  comm::SingleProcessCommunicator c;
  std::ostream discard(nullptr);
  {
    runtime::Trainer t(runtime::config_from_json(d, "offloaded", "", {}), c, discard);
    const auto report = t.run();
    BOOST_TEST(report.steps.size() == 2u);
    BOOST_TEST(std::isfinite(report.steps.back().loss));
    BOOST_TEST(report.device_peak_bytes <= 6u << 20);
    BOOST_TEST_MESSAGE("states " << states << " bytes, device peak " << report.device_peak_bytes);
  }
  d["zero_optimization"]["offload_optimizer"]["device"] = "none";
  d["zero_optimization"]["offload_param"]["device"] = "none";
  d["zero_optimization"]["stage"] = 0;
  try {
    runtime::Trainer t(runtime::config_from_json(d, "not offloaded", "", {}), c, discard);
    BOOST_FAIL("a model over the arena started without offload");
  } catch (const nn::OutOfDeviceMemory& e) {
    BOOST_TEST(std::string(e.what()).find("device.memory") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(bad_nvme_paths_are_refused_before_training) {
  TempDir dir;
  const std::string missing = (dir.path / "missing").string();
  comm::SingleProcessCommunicator c;
  std::ostream discard(nullptr);
  for (const char* which : {"offload_optimizer", "offload_param"}) {
    json d = doc(3, "nvme", "nvme", dir.path.string());
    d["zero_optimization"][which]["nvme_path"] = missing;
    try {
      runtime::Trainer t(runtime::config_from_json(d, "test", "", {}), c, discard);
      BOOST_FAIL("a missing nvme_path was accepted");
    } catch (const offload::StorageError& e) {
      BOOST_TEST(std::string(e.what()).find(missing) != std::string::npos, e.what());
    }
  }
}

BOOST_AUTO_TEST_CASE(placement_rules_name_the_key) {
  auto error = [](const json& d) -> std::string {
    try {
      runtime::config_from_json(d, "cfg.json", "", {});
    } catch (const runtime::ConfigError& e) {
      return e.what();
    }
    return "";
  };
  BOOST_TEST(error(doc(2, "none", "cpu", "/tmp")).find("offload_param.device 'cpu' needs zero_optimization.stage 3") !=
             std::string::npos);
  BOOST_TEST(error(doc(0, "cpu", "none", "/tmp")).find("needs zero_optimization.stage 1, 2 or 3") != std::string::npos);
  json d = doc(3, "nvme", "none", "/tmp");
  d["zero_optimization"]["offload_optimizer"].erase("nvme_path");
  BOOST_TEST(error(d).find("needs zero_optimization.offload_optimizer.nvme_path") != std::string::npos);
  d = doc(3, "none", "none", "/tmp");
  d["zero_optimization"]["offload_optimizer"]["device"] = "disk";
  BOOST_TEST(error(d).find("must be one of none, cpu, nvme") != std::string::npos);
  d = doc(3, "none", "none", "/tmp");
  d["aio"] = {{"block_size", 1000}};
  BOOST_TEST(error(d).find("aio.block_size") != std::string::npos);
  // On a GPU, parameters off the device need the optimizer off it too (device Adam could
  // not reach host or nvme shards); on the CPU device the same placement runs.
  d = doc(3, "none", "cpu", "/tmp");
  BOOST_TEST(error(d).empty());
  d["device"] = {{"type", "cuda"}};
  BOOST_TEST(error(d).find("offload_param.device 'cpu' with offload_optimizer.device 'none' on a GPU") !=
             std::string::npos, error(d));
}

BOOST_AUTO_TEST_CASE(nvme_parameters_are_read_ahead_of_use) {
  TempDir dir;
  comm::SingleProcessCommunicator c;
  std::ostream discard(nullptr);
  json d = doc(3, "nvme", "nvme", dir.path.string());
  d["train"]["steps"] = 3;
  runtime::Trainer t(runtime::config_from_json(d, "test", "", {}), c, discard);
  t.run();
  // Step 1 records the unit order; steps 2 and 3 read each next unit while the current one
  // computes: forward and backward fetch every unit shard once or twice per step.
  const int64_t fetches_per_step = 2 * t.model().num_units();
  BOOST_TEST(t.units().prefetch_hits() >= fetches_per_step);
  BOOST_TEST_MESSAGE("prefetch hits: " << t.units().prefetch_hits());
}

BOOST_AUTO_TEST_CASE(failed_optimizer_writes_name_the_file_and_keep_the_last_step) {
  TempDir dir;
  std::ostream discard(nullptr);
  comm::SingleProcessCommunicator c;
  // The master weights after one clean step: what must survive a failure in step 2.
  std::vector<std::vector<float>> after_step1;
  {
    runtime::Trainer t(runtime::config_from_json(doc(3, "nvme", "none", dir.path.string()), "ref", "", {}), c, discard);
    t.train_step(0);
    // With clipping (the default) a step's updates and its commit run on the update thread
    // after train_step returns: read the state once they are done.
    t.sync_updates();
    for (int u = 0; u < t.model().num_units(); ++u) after_step1.push_back(t.optimizer().master(u));
  }
  for (int err : {EIO, ENOSPC}) {
    // Read by the hook on the I/O threads (swapper, update thread) as the main thread sets it.
    std::atomic<bool> armed{false};
    runtime::Config cfg = runtime::config_from_json(doc(3, "nvme", "none", dir.path.string()), "faulty", "", {});
    cfg.offload.fault = [&](bool write, const std::string& path, uint64_t, size_t, int64_t& result) {
      if (armed && write && path.find("ferry-optimizer") != std::string::npos) result = -err;
    };
    runtime::Trainer t(cfg, c, discard);
    t.train_step(0);
    t.sync_updates();  // step 1 committed before the fault is armed, so that step 2's writes fail
    armed = true;
    try {
      t.train_step(1);
      t.sync_updates();  // step 2's updates ran after train_step returned: their error comes here
      BOOST_FAIL("a failing optimizer-state write went unreported");
    } catch (const offload::StorageError& e) {
      BOOST_TEST(e.err == err);
      BOOST_TEST(e.path == (dir.path / "ferry-optimizer-rank0.swp").string(), e.path);
      BOOST_TEST(std::string(e.what()).find(std::strerror(err)) != std::string::npos, e.what());
    }
    armed = false;
    // Every pinned buffer the failed step held (the tile's master, m and v among them)
    // went back to the pool: the next use finds them all.
    BOOST_REQUIRE(t.pinned_pool());
    BOOST_TEST(t.pinned_pool()->in_use() == 0);
    // Nothing was committed: the state is exactly the one after step 1.
    for (int u = 0; u < t.model().num_units(); ++u) {
      BOOST_TEST(t.optimizer().master(u) == after_step1[static_cast<size_t>(u)], boost::test_tools::per_element());
    }
  }
}
