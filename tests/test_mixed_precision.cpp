// Mixed precision end to end (bf16.enabled, fp16.enabled with loss scaling):
// - bf16 follows the fp32 run over 200 steps within the stated tolerance;
// - bf16 and fp16 runs are bit-identical across ZeRO stages, placements and schedules at 2 ranks
//   (the compute copies are 16-bit, and stage 3's offloaded parameter shards, which hold the
//   same roundings of the fp32 master; gradients and reductions stay fp32; NVMe moves
//   half the parameter bytes), and
//   the stage-3 all-gathers move exactly half the bytes of fp32's;
// - fp16: overflowing steps are skipped (weights and Adam state untouched, the schedule
//   does not advance) and logged; the scale follows DeepSpeed's rule; a resumed run
//   continues the loss curve and the scaler exactly.
#define BOOST_TEST_MODULE mixed_precision
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <ostream>
#include <sstream>

#include "runtime/train/loss_scaler.h"
#include "runtime/train/trainer.h"
#include "test_util.h"

using namespace ferry;
using nlohmann::json;

namespace {

json doc(int64_t steps) {
  return {{"model", {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"block_size", 32}}},
          {"data", {{"path", std::string(FERRY_SOURCE_DIR) + "/examples/data/kjv.txt"}}},
          {"device", {{"memory", "64MiB"}, {"threads", 1}}},
          {"train_micro_batch_size_per_gpu", 4},
          {"gradient_accumulation_steps", 1},
          {"optimizer", {{"params", {{"lr", 0.001}, {"weight_decay", 0.1}}}}},
          {"train", {{"steps", steps}, {"eval_every", 0}, {"eval_batches", 2}, {"sample_tokens", 0}}}};
}

struct Run {
  std::vector<runtime::StepStats> steps;
  double val = 0;
  std::vector<std::vector<float>> weights;
  std::string log;
};

Run train(const json& d, const std::vector<std::string>& sets, int world = 1) {
  std::vector<Run> runs(static_cast<size_t>(world));
  test::run_ranks(world, [&](int rank, comm::Communicator& c) {
    std::ostringstream log;
    runtime::Trainer t(runtime::config_from_json(d, "mixed", "", sets, world), c, log);
    const runtime::TrainReport rep = t.run();
    Run& r = runs[static_cast<size_t>(rank)];
    r.steps = rep.steps;
    r.val = rep.val_losses.back().second;
    for (int u = 0; u < t.model().num_units(); ++u) r.weights.push_back(t.units().full_weights(u));
    r.log = log.str();
  });
  return runs[0];
}

std::vector<double> losses(const Run& r) {
  std::vector<double> out;
  for (const auto& s : r.steps) out.push_back(s.loss);
  return out;
}

double window_mean(const Run& r, size_t begin, size_t n) {
  double s = 0;
  for (size_t i = begin; i < begin + n; ++i) s += r.steps[i].loss / static_cast<double>(n);
  return s;
}

}  // namespace

// The stated tolerance: over 200 steps the bf16 loss, averaged over each window of 20
// steps, stays within 0.1 nats of the fp32 run's, and the final validation loss within
// 0.05. bf16 keeps 8 significant bits; at lr 0.001 the two trajectories stay together
// (measured: worst window 0.0023 in the release build, 0.0020 in the sanitizer build;
// validation within 0.001). At lr 0.003 this tiny model sits at the edge of stability:
// a loss spike in one run and not the other made a window differ by 0.17 in the sanitizer
// build (other rounding, the same code) while the release build measured 0.05, so the
// statement depended on the compiler. A broken path (weights not refreshed after updates,
// a gradient in bf16) is off by far more than 0.1.
BOOST_AUTO_TEST_CASE(bf16_follows_fp32_for_200_steps) {
  const Run fp32 = train(doc(200), {});
  const Run bf16 = train(doc(200), {"bf16.enabled=true"});
  BOOST_TEST(bf16.log.find("bf16 compute weights") != std::string::npos);
  BOOST_TEST(bf16.log.find("bf16 activations; fp32 gradients, reductions, master weights and Adam state") != std::string::npos);
  double worst = 0;
  for (size_t w = 0; w < 200; w += 20) {
    const double gap = std::abs(window_mean(bf16, w, 20) - window_mean(fp32, w, 20));
    BOOST_TEST_MESSAGE("steps " << w + 1 << "-" << w + 20 << ": fp32 " << window_mean(fp32, w, 20) << ", bf16 "
                                << window_mean(bf16, w, 20) << ", gap " << gap);
    worst = std::max(worst, gap);
  }
  BOOST_TEST_MESSAGE("worst window gap " << worst << "; validation fp32 " << fp32.val << ", bf16 " << bf16.val);
  BOOST_TEST(worst < 0.1);
  BOOST_TEST(std::abs(window_mean(bf16, 0, 20) - window_mean(fp32, 0, 20)) < 1e-3);
  BOOST_TEST(std::abs(bf16.val - fp32.val) < 0.05);
  BOOST_TEST(losses(bf16) != losses(fp32), boost::test_tools::per_element());  // it did compute in bf16
  BOOST_TEST(window_mean(bf16, 180, 20) < bf16.steps[0].loss - 2.0);
}

BOOST_AUTO_TEST_CASE(
    bf16_and_fp16_are_identical_across_stages_and_schedules_and_gather_half_the_bytes) {
  test::TempDir dir("mixed");
  const json d = doc(3);
  // fp16 too: its stage-3 shards off the device are f16 (CPU Adam's f16 copy-out).
  for (const std::string low : {"bf16.enabled=true", "fp16.enabled=true"}) {
    const Run reference = train(d, {low, "zero_optimization.stage=0"}, 2);
    for (int stage = 1; stage <= 3; ++stage) {
      for (bool sequential : {false, true}) {
        for (const char* place : {"none", "cpu", "nvme"}) {
          if (stage < 3 && std::string(place) != "none") continue;
          BOOST_TEST_CONTEXT(low << ", stage " << stage
                                 << (sequential ? ", sequential" : ", overlapped") << ", offload "
                                 << place) {
            std::vector<std::string> sets = {
                low, "zero_optimization.stage=" + std::to_string(stage),
                "zero_optimization.offload_optimizer.device=" + std::string(place),
                "zero_optimization.offload_param.device=" +
                    std::string(stage == 3 ? place : "none")};
            if (sequential)
              sets.insert(sets.end(), {"zero_optimization.overlap_comm=false",
                                       "schedule.overlap_offload=false"});
            if (std::string(place) == "nvme") {
              // 16-bit parameter shards on NVMe: 2048-element tiles, written by CPU Adam's
              // copy-out.
              sets.insert(sets.end(),
                          {"zero_optimization.offload_optimizer.nvme_path=" + dir.path.string(),
                           "zero_optimization.offload_param.nvme_path=" + dir.path.string(),
                           "zero_optimization.offload_param.buffer_size=8192"});
            }
            const Run r = train(d, sets, 2);
            BOOST_TEST(losses(r) == losses(reference), boost::test_tools::per_element());
            BOOST_TEST(r.weights == reference.weights);
          }
        }
      }
    }
    // 16-bit parameter shards on NVMe: half the parameter bytes read of fp32's.
    {
      const std::vector<std::string> nvme = {
          "zero_optimization.stage=3",
          "zero_optimization.offload_optimizer.device=nvme",
          "zero_optimization.offload_param.device=nvme",
          "zero_optimization.offload_optimizer.nvme_path=" + dir.path.string(),
          "zero_optimization.offload_param.nvme_path=" + dir.path.string(),
          "zero_optimization.offload_param.buffer_size=8192"};
      std::vector<std::string> half = nvme;
      half.push_back(low);
      const Run f32 = train(d, nvme, 2), b16 = train(d, half, 2);
      // Reads: every one of a step is taken inside it (the prefetcher's flights end with the
      // step). Writes and the optimizer's I/O run on the update thread and may fall into the
      // next step's window, so their per-step bytes depend on timing: not compared here.
      const auto read = static_cast<size_t>(Activity::param_read);
      for (size_t i = 1; i < 3; ++i) {
        BOOST_TEST(f32.steps[i].time.bytes[read] > 0u);
        BOOST_TEST(b16.steps[i].time.bytes[read] * 2 == f32.steps[i].time.bytes[read]);
      }
    }
  }
  // Stage 3 at 2 ranks: the weights' all-gathers carry bf16, the reductions fp32.
  const Run f = train(d, {"zero_optimization.stage=3", "gradient_clipping=0"}, 2);
  const Run b = train(d, {"zero_optimization.stage=3", "gradient_clipping=0", "bf16.enabled=true"}, 2);
  const auto gather = static_cast<size_t>(Activity::all_gather);
  const auto reduce = static_cast<size_t>(Activity::reduce_scatter);
  for (size_t i = 0; i < 3; ++i) {
    BOOST_TEST(f.steps[i].time.bytes[gather] > 0u);
    BOOST_TEST(b.steps[i].time.bytes[gather] * 2 == f.steps[i].time.bytes[gather]);
    BOOST_TEST(b.steps[i].time.bytes[reduce] == f.steps[i].time.bytes[reduce]);
  }
}

// DeepSpeed's DynamicLossScaler, replayed by hand: window 3, hysteresis 2, from 2^4.
BOOST_AUTO_TEST_CASE(the_loss_scale_follows_deepspeeds_rule) {
  runtime::LossScaling cfg;
  cfg.initial_scale_power = 4;
  cfg.window = 3;
  cfg.hysteresis = 2;
  cfg.min_scale = 8;
  runtime::LossScaler s(cfg);
  const std::vector<std::pair<bool, double>> seq = {
      {false, 16}, {false, 16}, {false, 32},  // iteration 2: (2 - (-1)) % 3 == 0 -> doubles
      {true, 32},                             // first overflow: hysteresis 2 -> 1, scale kept
      {true, 16},                             // second: halves
      {false, 16}, {false, 16}, {false, 32},  // three good steps since the overflow at 4: doubles, hysteresis 2
      {true, 32}, {true, 16}, {true, 8},      // hysteresis spent: every overflow halves, down to min 8
  };
  for (size_t i = 0; i < seq.size(); ++i) {
    s.update(seq[i].first);
    BOOST_TEST(s.scale() == seq[i].second, "after update " << i);
  }
  BOOST_TEST(s.skipped() == 5);
  BOOST_CHECK_THROW(s.update(true), std::runtime_error);  // overflow at the minimum: the run stops
  // consecutive_hysteresis: a good step refills it, so isolated overflows never halve.
  cfg.consecutive_hysteresis = true;
  runtime::LossScaler c(cfg);
  for (int i = 0; i < 4; ++i) {
    c.update(true);
    c.update(false);
  }
  BOOST_TEST(c.scale() == 16.0);
  // The state round-trips.
  runtime::LossScaler r(cfg);
  r.restore(s.state());
  BOOST_TEST(r.state() == s.state());
  BOOST_CHECK_THROW(r.restore(json{{"scale", 2.0}}), std::runtime_error);
}

BOOST_AUTO_TEST_CASE(fp16_overflow_steps_are_skipped_and_logged) {
  // 2^40 overflows fp16 at once; hysteresis 2 keeps it for the first overflow, halves it on
  // the second: two skipped steps, nothing updated.
  const json d = doc(2);
  const std::vector<std::string> sets = {"fp16.enabled=true", "fp16.initial_scale_power=40",
                                         "scheduler.type=WarmupLR", "scheduler.params.warmup_num_steps=10",
                                         "scheduler.params.warmup_type=linear"};
  std::vector<std::vector<float>> before;
  {
    comm::SingleProcessCommunicator c;
    std::ostream discard(nullptr);
    runtime::Trainer t(runtime::config_from_json(d, "mixed", "", sets), c, discard);
    for (int u = 0; u < t.model().num_units(); ++u) before.push_back(t.units().full_weights(u));
  }
  const Run r = train(d, sets);
  BOOST_REQUIRE(r.steps.size() == 2u);
  BOOST_TEST(r.steps[0].skipped);
  BOOST_TEST(r.steps[1].skipped);
  BOOST_TEST(r.steps[0].loss_scale == std::ldexp(1.0, 40));
  BOOST_TEST(r.steps[1].loss_scale == std::ldexp(1.0, 40));  // hysteresis: kept after the first
  BOOST_TEST(r.steps[1].lr == r.steps[0].lr);                // the schedule did not advance
  BOOST_TEST(r.weights == before);                           // nothing was updated

  // From 2^24 with hysteresis 1 the scale halves until the gradients fit, then training
  // proceeds: the loss falls and the schedule counts only the steps taken.
  const Run ok = train(doc(80), {"fp16.enabled=true", "fp16.initial_scale_power=24", "fp16.hysteresis=1",
                                 "scheduler.type=WarmupLR", "scheduler.params.warmup_num_steps=40",
                                 "scheduler.params.warmup_type=linear"});
  int skipped = 0;
  for (size_t i = 0; i < ok.steps.size(); ++i) {
    const auto& s = ok.steps[i];
    if (i > 0) {
      const auto& p = ok.steps[i - 1];
      // The scale only halves after a skipped step (hysteresis 1) and is kept otherwise
      // (the window, 1000, is never reached).
      BOOST_TEST(s.loss_scale == (p.skipped ? p.loss_scale / 2 : p.loss_scale), "step " << s.step);
      if (p.skipped) BOOST_TEST(s.lr == p.lr, "step " << s.step);
    }
    skipped += s.skipped ? 1 : 0;
  }
  BOOST_TEST_MESSAGE(skipped << " of 80 steps skipped; final scale " << ok.steps.back().loss_scale);
  BOOST_TEST(skipped >= 1);
  BOOST_TEST(skipped < 20);
  BOOST_TEST(!ok.steps.back().skipped);
  BOOST_TEST(window_mean(ok, 70, 10) < ok.steps[0].loss - 1.5);
}

BOOST_AUTO_TEST_CASE(fp16_resume_continues_the_curve_and_the_scale) {
  test::TempDir dir("mixed-ckpt");
  const std::string ck = (dir.path / "ckpt").string();
  const std::vector<std::string> fp16 = {"fp16.enabled=true", "fp16.initial_scale_power=22", "fp16.hysteresis=1",
                                         "fp16.loss_scale_window=4"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), fp16.begin(), fp16.end());
    return extra;
  };
  const Run whole = train(doc(12), fp16);
  train(doc(6), with({"checkpoint.dir=" + ck}));
  const Run resumed = train(doc(12), with({"checkpoint.dir=" + ck, "checkpoint.resume=auto"}));
  BOOST_REQUIRE(resumed.steps.size() == 6u);
  for (size_t i = 0; i < 6; ++i) {
    BOOST_TEST(resumed.steps[i].loss == whole.steps[6 + i].loss, "step " << 7 + i);
    BOOST_TEST(resumed.steps[i].loss_scale == whole.steps[6 + i].loss_scale, "step " << 7 + i);
    BOOST_TEST(resumed.steps[i].skipped == whole.steps[6 + i].skipped, "step " << 7 + i);
  }
  BOOST_TEST(resumed.weights == whole.weights);
}
