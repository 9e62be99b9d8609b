// ZeRO stages 0-3 across real MPI ranks (run under mpiexec -n 1..4 by ctest).
//
// Every rank also trains, alone, the single-process reference with the same global batch
// (world size 1, accumulation x N: the sampler makes it the same sequences), so the
// expected values need no communication. Then per stage: the same loss at every step and
// the same final weights; and stage 3's device peak is a 1/N shard of stage 0's model
// states plus one unit's working set.
#define BOOST_TEST_MODULE zero_mpi
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <memory>
#include <ostream>

#include "comm/mpi_communicator.h"
#include "comm/shm_collectives.h"
#include "nn/cpu_device.h"
#include "runtime/train/trainer.h"

using namespace ferry;
using nlohmann::json;

namespace {

struct Mpi {
  static inline std::unique_ptr<comm::MpiCommunicator> world;
  Mpi() { world = comm::MpiCommunicator::world(/*timeout_s=*/240); }
  ~Mpi() { world.reset(); }
};

json base_doc() {
  return {{"model", {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 24}, {"block_size", 16}}},
          {"data", {{"path", std::string(FERRY_SOURCE_DIR) + "/examples/data/kjv.txt"}}},
          {"device", {{"memory", "256MiB"}, {"threads", 1}}},
          {"train_micro_batch_size_per_gpu", 2},
          {"gradient_accumulation_steps", 2},
          {"gradient_clipping", 0.5},  // active: the global norm is above it in these steps
          {"optimizer", {{"params", {{"lr", 0.003}, {"weight_decay", 0.1}}}}},
          {"train", {{"steps", 4}, {"eval_every", 0}, {"eval_batches", 1}, {"sample_tokens", 0}}}};
}

struct Run {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;
  size_t peak = 0;
};

Run train(runtime::Config cfg, comm::Communicator& c) {
  std::ostream discard(nullptr);
  runtime::Trainer t(cfg, c, discard);
  Run r;
  const runtime::TrainReport rep = t.run();
  for (const auto& s : rep.steps) r.losses.push_back(s.loss);
  for (int u = 0; u < t.model().num_units(); ++u) r.weights.push_back(t.units().full_weights(u));
  r.peak = rep.device_peak_bytes;
  return r;
}

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(Mpi);

BOOST_AUTO_TEST_CASE(every_stage_matches_the_single_process_reference) {
  comm::Communicator& world = *Mpi::world;
  const int W = world.size();
  comm::SingleProcessCommunicator alone;
  const Run ref = train(runtime::config_from_json(base_doc(), "ref", "", {"gradient_accumulation_steps=" + std::to_string(2 * W)}, 1), alone);
  struct Variant {
    int stage;
    int bucket;  // elements per collective; small ones force the packed, chunked path
  };
  for (Variant v : {Variant{0, 500000000}, Variant{1, 500000000}, Variant{2, 500000000}, Variant{2, 100},
                    Variant{3, 500000000}, Variant{3, 100}}) {
    BOOST_TEST_CONTEXT("world " << W << ", stage " << v.stage << ", bucket " << v.bucket) {
      json doc = base_doc();
      doc["zero_optimization"] = {{"stage", v.stage}, {"reduce_bucket_size", v.bucket}, {"allgather_bucket_size", v.bucket}};
      const Run run = train(runtime::config_from_json(doc, "zero", "", {}, W), world);
      BOOST_REQUIRE(run.losses.size() == ref.losses.size());
      // Tolerances: the reference sums 2N micro-batch gradients in one fp32 buffer; the
      // sharded run sums 2 per rank, then N across ranks: the same terms in another order,
      // ~1e-7 relative apart. Four AdamW steps keep losses within 1e-5 relative. Weights:
      // Adam divides by sqrt(v), which amplifies rounding for coordinates with tiny
      // gradients; measured worst differences are 4e-7 to 8e-6 (1 to 4 ranks). The bounds,
      // 1e-4 for any weight and 1e-5 for 99.9% of them, are far below what a wrong shard,
      // a missed reduction or a wrong scale does (lr = 3e-3 per step on many weights).
      for (size_t i = 0; i < ref.losses.size(); ++i) {
        BOOST_TEST(std::abs(run.losses[i] - ref.losses[i]) <= 1e-5 * std::abs(ref.losses[i]));
      }
      size_t total = 0, close = 0;
      double worst = 0;
      for (size_t u = 0; u < ref.weights.size(); ++u) {
        BOOST_REQUIRE(run.weights[u].size() == ref.weights[u].size());
        for (size_t i = 0; i < ref.weights[u].size(); ++i) {
          const double d = std::abs(static_cast<double>(run.weights[u][i]) - ref.weights[u][i]);
          worst = std::max(worst, d);
          close += d <= 1e-5;
          ++total;
        }
      }
      BOOST_TEST(worst <= 1e-4);
      BOOST_TEST(static_cast<double>(close) >= 0.999 * static_cast<double>(total));
      BOOST_TEST_MESSAGE("world " << W << " stage " << v.stage << " bucket " << v.bucket << ": worst weight diff "
                                  << worst << ", " << total - close << " of " << total << " above 1e-5");
    }
  }
}

// LoRA (docs/guide/adapters.md): the base frozen, each rank holding its share of the
// adapters and of the base, dropout on; the same losses and weights as the single process.
BOOST_AUTO_TEST_CASE(lora_at_every_stage_matches_the_single_process_reference) {
  comm::Communicator& world = *Mpi::world;
  const int W = world.size();
  json doc = base_doc();
  // Dropout on: its masks are keyed by global position, the same at every world size.
  doc["lora"] = {{"r", 4}, {"lora_alpha", 16}, {"lora_dropout", 0.1}, {"target_modules", json::array({"c_attn", "c_proj", "c_fc"})}};
  comm::SingleProcessCommunicator alone;
  const Run ref = train(runtime::config_from_json(doc, "ref", "", {"gradient_accumulation_steps=" + std::to_string(2 * W)}, 1), alone);
  for (int stage = 0; stage <= 3; ++stage) {
    for (int bucket : {500000000, 100}) {
      BOOST_TEST_CONTEXT("world " << W << ", lora, stage " << stage << ", bucket " << bucket) {
        doc["zero_optimization"] = {{"stage", stage}, {"reduce_bucket_size", bucket}, {"allgather_bucket_size", bucket}};
        const Run run = train(runtime::config_from_json(doc, "zero", "", {}, W), world);
        BOOST_REQUIRE(run.losses.size() == ref.losses.size());
        for (size_t i = 0; i < ref.losses.size(); ++i) {
          BOOST_TEST(std::abs(run.losses[i] - ref.losses[i]) <= 1e-5 * std::abs(ref.losses[i]));
        }
        double worst = 0;
        for (size_t u = 0; u < ref.weights.size(); ++u) {
          BOOST_REQUIRE(run.weights[u].size() == ref.weights[u].size());
          for (size_t i = 0; i < ref.weights[u].size(); ++i)
            worst = std::max(worst, std::abs(static_cast<double>(run.weights[u][i]) - ref.weights[u][i]));
        }
        BOOST_TEST(worst <= 1e-4);
      }
    }
  }
}

// QLoRA (lora.base_dtype nf4): the NF4 blobs of the frozen base sharded as bytes (a rank's
// shard may start or end inside a blob), gathered and offloaded. Measured equal at 1-4
// ranks; the bound is the fp32 cases' 1e-5 (a wrong blob byte moves the losses by percents).
BOOST_AUTO_TEST_CASE(qlora_at_every_stage_matches_the_single_process_reference) {
  comm::Communicator& world = *Mpi::world;
  const int W = world.size();
  json doc = base_doc();
  doc["bf16"] = {{"enabled", true}};
  doc["lora"] = {{"r", 4}, {"lora_alpha", 16}, {"target_modules", "all-linear"}, {"base_dtype", "nf4"}};
  comm::SingleProcessCommunicator alone;
  const Run ref = train(runtime::config_from_json(doc, "ref", "", {"gradient_accumulation_steps=" + std::to_string(2 * W)}, 1), alone);
  for (const auto& [stage, opt, par] : std::vector<std::tuple<int, const char*, const char*>>{
           {0, "none", "none"}, {2, "none", "none"}, {2, "cpu", "none"}, {3, "cpu", "none"}, {3, "cpu", "cpu"}}) {
    for (int bucket : {500000000, 100}) {
      BOOST_TEST_CONTEXT("world " << W << ", qlora, stage " << stage << ", optimizer " << opt << ", params " << par
                                  << ", bucket " << bucket) {
        doc["zero_optimization"] = {{"stage", stage},
                                    {"reduce_bucket_size", bucket},
                                    {"allgather_bucket_size", bucket},
                                    {"offload_optimizer", {{"device", opt}}},
                                    {"offload_param", {{"device", par}}}};
        const Run run = train(runtime::config_from_json(doc, "zero", "", {}, W), world);
        BOOST_REQUIRE(run.losses.size() == ref.losses.size());
        double worst = 0;
        for (size_t i = 0; i < ref.losses.size(); ++i) {
          worst = std::max(worst, std::abs(run.losses[i] - ref.losses[i]) / std::abs(ref.losses[i]));
        }
        BOOST_TEST(worst <= 1e-5);
        BOOST_TEST_MESSAGE("world " << W << " qlora stage " << stage << " " << opt << "/" << par << " bucket " << bucket
                                    << ": losses within " << worst);
      }
    }
  }
  // hpZ (node groups of 2): the node copies hold the whole gathered unit, NF4 blobs and
  // adapters, and serve every gather after a unit's first in the step.
  for (const char* base : {"nf4", "compute"}) {
    if (W % 2 != 0) break;
    BOOST_TEST_CONTEXT("world " << W << ", hpZ 2, base " << base) {
      json h = doc;
      h["lora"]["base_dtype"] = base;
      h["zero_optimization"] = {{"stage", 3}, {"zero_hpz_partition_size", 2}, {"offload_optimizer", {{"device", "cpu"}}}};
      json single = h;
      single["zero_optimization"] = {{"stage", 0}};
      const Run want = std::string(base) == "nf4"
                           ? ref
                           : train(runtime::config_from_json(single, "ref", "", {"gradient_accumulation_steps=" + std::to_string(2 * W)}, 1),
                                   alone);
      const Run run = train(runtime::config_from_json(h, "hpz", "", {}, W), world);
      BOOST_REQUIRE(run.losses.size() == want.losses.size());
      for (size_t i = 0; i < want.losses.size(); ++i) {
        BOOST_TEST(std::abs(run.losses[i] - want.losses[i]) <= 1e-5 * std::abs(want.losses[i]));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(stage3_peak_is_a_shard_plus_one_unit) {
  comm::Communicator& world = *Mpi::world;
  const int W = world.size();
  json doc = base_doc();
  doc["model"] = {{"n_layer", 6}, {"n_head", 2}, {"n_embd", 64}, {"block_size", 8}};
  doc["train_micro_batch_size_per_gpu"] = 1;
  doc["gradient_accumulation_steps"] = 1;
  doc["train"]["steps"] = 1;
  doc["zero_optimization"] = {{"stage", 0}};
  const Run s0 = train(runtime::config_from_json(doc, "s0", "", {}, W), world);
  doc["zero_optimization"] = {{"stage", 3}};
  const Run s3 = train(runtime::config_from_json(doc, "s3", "", {}, W), world);
  // Model states at stage 0: weights, gradients, Adam m and v, fp32, padded, every rank.
  const auto units = nn::GPT::layout({6, 2, 64, 256, 8});
  size_t padded = 0, largest = 0;
  for (const auto& u : units) {
    const size_t p = static_cast<size_t>(runtime::partition(u.numel, W, 0).padded) * 4;
    padded += p;
    largest = std::max(largest, p);
  }
  const size_t states0 = 4 * padded, states3 = states0 / static_cast<size_t>(W);
  const size_t other = s0.peak - states0;  // activations and temporaries: the same at both stages
  // One unit's working set at stage 3: its gathered weights and full gradient, plus the
  // tied embedding's (the head uses both), plus a reduce buffer: bounded by 3 x 2 units.
  const size_t working_set = 6 * largest;
  BOOST_TEST_MESSAGE("world " << W << ": stage 0 peak " << s0.peak << ", stage 3 peak " << s3.peak << ", states0 "
                              << states0 << ", other " << other << ", working-set bound " << working_set);
  BOOST_TEST(s3.peak <= states3 + other + working_set);
  BOOST_TEST(s3.peak >= states3);
  if (W > 1) BOOST_TEST(s3.peak < s0.peak);
}

BOOST_AUTO_TEST_CASE(node_grouping_and_sub_groups) {
  comm::MpiCommunicator& world = *Mpi::world;
  const int W = world.size(), r = world.rank();
  // One machine: every rank shares the node (MPI_COMM_TYPE_SHARED).
  BOOST_TEST(world.local_size() == W);
  BOOST_TEST(world.local_rank() == r);
  // Even and odd ranks form two groups; a sum inside each covers only its members.
  auto group = world.split(r % 2, r);
  BOOST_TEST(group->size() == (W + 1 - r % 2) / 2);
  BOOST_TEST(group->rank() == r / 2);
  double v = r;
  group->all_reduce(&v, 1, comm::DataType::f64, comm::ReduceOp::sum)->wait();
  double want = 0;
  for (int k = r % 2; k < W; k += 2) want += k;
  BOOST_TEST(v == want);
  // Work handles: test() and wait_for() see completion; the world still works afterwards.
  double x = 1;
  auto work = world.all_reduce(&x, 1, comm::DataType::f64, comm::ReduceOp::avg);
  BOOST_TEST(work->wait_for(std::chrono::seconds(60)));
  BOOST_TEST(work->test());
  BOOST_TEST(work->error().empty());
  BOOST_TEST(x == 1.0);
  group.reset();
}

BOOST_AUTO_TEST_CASE(shared_memory_collectives_match_mpi) {
  comm::MpiCommunicator& world = *Mpi::world;
  const int W = world.size(), r = world.rank();
  for (size_t window : {size_t{4096}, size_t{1} << 20}) {  // a tiny window forces many chunks
    comm::ShmCollectives shm(world.handle(), window);
    const size_t count = 3001;  // not a multiple of anything
    std::vector<float> send(count * static_cast<size_t>(W)), mine(count), want(count), got(count);
    for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>((i * 7 + static_cast<size_t>(r) * 13) % 101) * 0.25f;
    MPI_Reduce_scatter_block(send.data(), want.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, world.handle());
    shm.reduce_scatter_sum(send.data(), got.data(), count);
    // Sums of multiples of 0.25 below 2^20 are exact in fp32: any order gives the same bits.
    BOOST_TEST(got == want, boost::test_tools::per_element());
    for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(r * 100000 + static_cast<int>(i));
    std::vector<float> all_want(count * static_cast<size_t>(W)), all_got(count * static_cast<size_t>(W));
    MPI_Allgather(mine.data(), static_cast<int>(count), MPI_FLOAT, all_want.data(), static_cast<int>(count), MPI_FLOAT,
                  world.handle());
    shm.all_gather(mine.data(), all_got.data(), count);
    BOOST_TEST(all_got == all_want, boost::test_tools::per_element());
  }
}

// A rank that runs the units in another order is caught at the first differing unit,
// before the collectives of different units could mismatch: every rank gets the message.
BOOST_AUTO_TEST_CASE(unit_order_divergence_is_reported_on_every_rank) {
  comm::Communicator& world = *Mpi::world;
  if (world.size() < 2) return;
  std::vector<nn::UnitSpec> units(3);
  for (int u = 0; u < 3; ++u) {
    units[static_cast<size_t>(u)].name = "unit" + std::to_string(u);
    units[static_cast<size_t>(u)].add("w", {64 + 16 * u}, true);
  }
  nn::CpuDevice dev(16 << 20, 1);
  runtime::ShardedUnits su(dev, world, units, {3}, [](int, const nn::Tensor&) {});
  const int last = world.size() - 1;
  const std::vector<int> order = world.rank() == last ? std::vector<int>{0, 2, 1} : std::vector<int>{0, 1, 2};
  std::string message;
  su.begin_step(1);
  try {
    for (int u : order) {
      su.acquire_weights(u);
      su.release_weights(u);
    }
  } catch (const runtime::OrderError& e) {
    message = e.what();
  }
  BOOST_TEST(message.find("rank 0 uses unit 1 (unit1) and rank " + std::to_string(last) + " uses unit 2 (unit2)") !=
                 std::string::npos,
             message);
  world.barrier()->wait();
}
