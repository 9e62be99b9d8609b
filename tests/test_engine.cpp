// runtime/train/engine.h: the one assembly of a rank's engine. What test_plan and test_train
// do not already show: the hooks' contract (the model exists before any state; every unit's
// initial weights come through init_unit and land in the shards, bf16 masters included),
// a run engine and a counting one of the same configuration placing the same bytes in each
// tier, and the tiers read once from the configuration's words.
#define BOOST_TEST_MODULE engine
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "testing/fake_communicator.h"
#include "runtime/config/config.h"
#include "runtime/train/engine.h"

using namespace ferry;
using namespace ferry::runtime;
using nn::Tensor;

namespace {

Config tiny(const std::vector<std::string>& sets = {}) {
  const nlohmann::json doc = {{"model", {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"block_size", 16}, {"vocab_size", 256}}},
                              {"train_micro_batch_size_per_gpu", 2},
                              {"data", {{"path", "unused.txt"}}}};
  return config_from_json(doc, "test", "", sets);
}

// Every unit's weights set to unit + 1 (the real elements; padding stays 0).
EngineHooks constant_hooks(std::vector<int>& calls, bool& model_first) {
  EngineHooks h;
  h.model_ready = [&model_first](Engine& e) { model_first = e.model().num_units() > 0; };
  h.init_unit = [&calls](Engine&, int u, const Tensor& full) {
    calls.push_back(u);
    full.device().fill(full, static_cast<double>(u + 1));
  };
  return h;
}

}  // namespace

BOOST_AUTO_TEST_CASE(hooks_initialise_every_unit_before_the_optimizer_reads_them) {
  for (const char* stage : {"zero_optimization.stage=0", "zero_optimization.stage=3"}) {
    BOOST_TEST_CONTEXT(stage) {
      comm::SingleProcessCommunicator world;
      const Config c = tiny({stage});
      std::vector<int> calls;
      bool model_first = false;
      Engine e(c, world, constant_hooks(calls, model_first));
      BOOST_TEST(model_first);
      const int n = e.units().num_units();
      BOOST_TEST(n == e.model().num_units());
      for (int u = 0; u < n; ++u) BOOST_TEST(std::count(calls.begin(), calls.end(), u) >= 1);
      for (int u = 0; u < n; ++u) {
        const ShardedUnits::Owned o = e.units().owned(u);
        std::vector<float> w(static_cast<size_t>(o.length));
        e.compute().copy_to_host(w.data(), o.weights.view(0, {o.length}));
        const int64_t real = std::min<int64_t>(o.length, e.units().partition_of(u).numel - o.begin);
        for (int64_t i = 0; i < real; ++i) BOOST_TEST_REQUIRE(w[static_cast<size_t>(i)] == static_cast<float>(u + 1));
      }
      e.finish_updates();  // twice is harmless: the destructor finds none
    }
  }
}

BOOST_AUTO_TEST_CASE(bf16_masters_come_from_the_hook_not_from_rounded_shards) {
  // stage 3, bf16 compute and the optimizer on cpu: the shards are bf16, the fp32 masters
  // are made again through init_unit on the host (1/3 is not a bf16 value).
  comm::SingleProcessCommunicator world;
  const Config c = tiny({"zero_optimization.stage=3", "bf16.enabled=true", "zero_optimization.offload_optimizer.device=cpu",
                         "zero_optimization.offload_param.device=cpu"});
  EngineHooks h;
  int calls = 0;
  h.init_unit = [&calls](Engine&, int, const Tensor& full) {
    ++calls;
    full.device().fill(full, 1.0 / 3.0);
  };
  Engine e(c, world, h);
  BOOST_TEST(e.units().owned_rounded());
  BOOST_TEST(calls >= 2 * e.units().num_units());  // the shards, then the masters
}

BOOST_AUTO_TEST_CASE(a_run_and_a_count_place_the_same_bytes) {
  for (const char* opt : {"none", "cpu"}) {
    BOOST_TEST_CONTEXT("offload_optimizer " << opt) {
      const Config c = tiny({"zero_optimization.stage=3", std::string("zero_optimization.offload_optimizer.device=") + opt});
      comm::SingleProcessCommunicator world;
      const Engine run(c, world, {});
      const Engine count(c, 1);
      BOOST_TEST((count.kind() == EngineKind::count));
      const TierMemory a = run.memory_by_tier(), b = count.memory_by_tier();
      BOOST_TEST(a.device_in_use == b.device_in_use);
      BOOST_TEST(a.host_states == b.host_states);
      BOOST_TEST(a.host_pinned == b.host_pinned);
      BOOST_TEST(a.nvme == b.nvme);
      BOOST_TEST(run.optimizer().tier() == c.offload.optimizer_device);
      BOOST_TEST((b.host_states > 0) == (std::string(opt) == "cpu"));
    }
  }
}

BOOST_AUTO_TEST_CASE(tiers_are_read_once_from_their_words) {
  using offload::Tier;
  for (const Tier t : {Tier::device, Tier::cpu, Tier::nvme}) BOOST_TEST((offload::tier_from_word(offload::tier_word(t)) == t));
  BOOST_TEST(!offload::tier_from_word("device").has_value());  // the word for the device is "none"
  BOOST_TEST(!offload::tier_from_word("NVME").has_value());
  const Config c = tiny({"zero_optimization.stage=2", "zero_optimization.offload_optimizer.device=cpu"});
  BOOST_TEST(c.offload.optimizer_device == Tier::cpu);
  BOOST_TEST(c.offload.param_device == Tier::device);
  BOOST_TEST(c.resolved["zero_optimization"]["offload_optimizer"]["device"] == "cpu");  // written back as its word
  BOOST_CHECK_EXCEPTION(tiny({"zero_optimization.offload_optimizer.device=disk"}), ConfigError, [](const ConfigError& e) {
    return std::string(e.what()).find("key 'zero_optimization.offload_optimizer.device' must be one of none, cpu, nvme, "
                                      "got \"disk\"") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(a_world_of_another_size_is_refused) {
  testing::FakeGroup group(2);
  const std::unique_ptr<comm::Communicator> world = group.communicator(0);
  BOOST_CHECK_EXCEPTION(Engine(tiny(), *world, {}), std::invalid_argument, [](const std::invalid_argument& e) {
    return std::string(e.what()).find("resolved for world size 1 but the communicator has 2 ranks") != std::string::npos;
  });
}
