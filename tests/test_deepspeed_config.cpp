// --deepspeed: DeepSpeed configuration files as users publish them (examples/deepspeed/,
// the Hugging Face ZeRO-2 CPU-offload file and a ZeRO-3 NVMe file) become the same
// Config as ferry's own keys would; "auto" resolved; ignored keys listed; keys whose
// absence would change the run refused naming the file and the key; the tensorboard and
// csv_monitor sections.
#define BOOST_TEST_MODULE deepspeed_config
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <fstream>

#include "runtime/config/config.h"
#include "error_of.h"
#include "test_util.h"

using namespace ferry::runtime;
using nlohmann::json;
namespace fs = std::filesystem;

using ferry::test::error_of;
using ferry::test::has;
using ferry::test::contains;

namespace {

const std::string kSource = FERRY_SOURCE_DIR;
const std::string kModel = kSource + "/examples/configs/tiny-model.json";
const std::string kZero2 = kSource + "/examples/deepspeed/zero2_cpu_offload.json";
const std::string kZero3 = kSource + "/examples/deepspeed/zero3_nvme_offload.json";


std::string write(const fs::path& p, const json& doc) {
  std::ofstream(p) << doc.dump(2);
  return p.string();
}

json model_doc() {
  json doc = json::parse(std::ifstream(kModel));
  doc["data"]["path"] = kSource + "/examples/data/kjv.txt";
  return doc;
}

}  // namespace

BOOST_AUTO_TEST_CASE(hugging_face_zero2_cpu_offload) {
  const Config c = load_config(kModel, {}, 2, kZero2);
  BOOST_TEST(c.zero.stage == 2);
  BOOST_TEST(c.offload.optimizer_device == "cpu");
  BOOST_TEST(c.offload.optimizer_pin);
  BOOST_TEST(c.zero.reduce_bucket_size == 200'000'000);
  BOOST_TEST(c.zero.allgather_bucket_size == 200'000'000);
  BOOST_TEST(c.zero.overlap_comm);
  // "auto": ferry's file sets none of these, so ferry's defaults.
  BOOST_TEST(c.micro_batch == 16);
  BOOST_TEST(c.grad_accum == 1);
  BOOST_TEST(c.grad_clip == 1.0);
  BOOST_TEST(c.optimizer.lr == 1e-3);
  BOOST_TEST(c.resolved["train_batch_size"] == 32);  // 16 x 1 x 2 ranks
  BOOST_TEST(c.scheduler.type == "WarmupLR");
  BOOST_TEST(c.scheduler.warmup_max_lr == c.optimizer.lr);  // Hugging Face's rule: the optimizer's lr
  BOOST_TEST(c.deepspeed.path == kZero2);
  BOOST_TEST(contains(c.deepspeed.autos_resolved, "train_micro_batch_size_per_gpu = 16"));
  BOOST_TEST(contains(c.deepspeed.autos_resolved, "scheduler.params.warmup_max_lr = 0.001"));
  // fp16/bf16 "auto": the ferry file's choice, as Hugging Face takes TrainingArguments'.
  BOOST_TEST(contains(c.deepspeed.autos_resolved, "bf16.enabled = false"));
  BOOST_TEST(contains(c.deepspeed.autos_resolved, "fp16.enabled = false"));
  BOOST_TEST((c.zero.compute == ferry::nn::DType::f32));
  BOOST_TEST(c.loss_scaling.hysteresis == 2);
  BOOST_TEST(c.deepspeed.autos_resolved.size() == 13u);
  for (const char* k : {"steps_per_print", "wall_clock_breakdown", "zero_optimization.contiguous_gradients",
                        "zero_optimization.reduce_scatter", "zero_optimization.allgather_partitions"}) {
    BOOST_TEST(contains(c.deepspeed.ignored, k), k);
  }
  BOOST_TEST(c.deepspeed.ignored.size() == 5u);
}

BOOST_AUTO_TEST_CASE(zero3_nvme_offload) {
  const Config c = load_config(kModel, {"train.steps=40"}, 1, kZero3);
  BOOST_TEST(c.zero.stage == 3);
  BOOST_TEST(c.offload.optimizer_device == "nvme");
  BOOST_TEST(c.offload.param_device == "nvme");
  BOOST_TEST(c.offload.optimizer_paths == std::vector<std::string>{"/local_nvme"});
  BOOST_TEST(c.offload.optimizer_buffers == 4);
  BOOST_TEST(c.offload.param_buffers == 5);
  BOOST_TEST(c.offload.param_buffer_size == 100'000'000);
  BOOST_TEST(c.offload.max_in_cpu == 1'000'000'000);
  BOOST_TEST(c.offload.aio.intra_op_parallelism == 1);  // aio.thread_count
  BOOST_TEST(c.offload.aio.block_size == 1048576u);
  BOOST_TEST(c.micro_batch == 4);
  BOOST_TEST(c.grad_accum == 2);
  BOOST_TEST(c.optimizer.lr == 3e-4);
  BOOST_TEST(c.optimizer.beta2 == 0.95);
  BOOST_TEST(c.optimizer.weight_decay == 0.1);
  BOOST_TEST(c.scheduler.type == "WarmupDecayLR");
  BOOST_TEST(c.scheduler.total_num_steps == 40);  // "auto": train.steps
  // "auto" bucket sizes as the Hugging Face integration computes them from the hidden size.
  BOOST_TEST(c.zero.reduce_bucket_size == 128 * 128);
  BOOST_TEST(c.zero.prefetch_bucket_size == 14745);  // floor(0.9 x 128^2)
  BOOST_TEST(c.zero.max_live_parameters == 1'000'000'000);
  BOOST_TEST(contains(c.deepspeed.ignored, "zero_optimization.sub_group_size"));
  BOOST_TEST(contains(c.deepspeed.ignored, "zero_optimization.stage3_param_persistence_threshold"));
  BOOST_TEST(contains(c.deepspeed.ignored, "zero_optimization.offload_optimizer.fast_init"));
}

// The same run described with ferry's keys resolves to the same configuration.
BOOST_AUTO_TEST_CASE(same_config_as_ferry_keys) {
  const Config via_ds = load_config(kModel, {"train.steps=40"}, 1, kZero3);
  json native = model_doc();
  native["train"]["steps"] = 40;
  native["train_micro_batch_size_per_gpu"] = 4;
  native["gradient_accumulation_steps"] = 2;
  native["gradient_clipping"] = 1.0;
  native["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 3e-4}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", 0.1}}}};
  native["scheduler"] = {{"type", "WarmupDecayLR"},
                         {"params", {{"warmup_min_lr", 0}, {"warmup_max_lr", 3e-4}, {"warmup_num_steps", 10}}}};
  native["zero_optimization"] = {
      {"stage", 3},
      {"overlap_comm", true},
      {"reduce_bucket_size", 16384},
      {"stage3_prefetch_bucket_size", 14745},
      {"stage3_max_live_parameters", 1e9},
      {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/local_nvme"}, {"pin_memory", true}, {"buffer_count", 4}}},
      {"offload_param",
       {{"device", "nvme"}, {"nvme_path", "/local_nvme"}, {"pin_memory", true}, {"buffer_count", 5},
        {"buffer_size", 1e8}, {"max_in_cpu", 1e9}}}};
  native["aio"] = {{"block_size", 1048576}, {"queue_depth", 8}, {"intra_op_parallelism", 1},
                   {"single_submit", false}, {"overlap_events", true}};
  const Config direct = config_from_json(native, "native.json", "/", {}, 1);
  BOOST_TEST(via_ds.resolved == direct.resolved, via_ds.resolved.dump() << "\n" << direct.resolved.dump());
}

BOOST_AUTO_TEST_CASE(deepspeed_defaults_where_they_change_the_result) {
  ferry::test::TempDir dir("ds_defaults");
  const std::string ds = write(dir.path / "ds.json", {{"zero_optimization", {{"stage", 1}}}});
  const Config c = load_config(kModel, {}, 1, ds);
  BOOST_TEST(c.grad_clip == 0.0);  // DeepSpeed does not clip unless asked; ferry's own default is 1.0
  BOOST_TEST(c.zero.stage == 1);
  const Config set = load_config(kModel, {"gradient_clipping=0.5"}, 1, ds);
  BOOST_TEST(set.grad_clip == 0.5);  // --set applies last
}

// DeepSpeed's precision sections map onto ferry's keys of the same names.
BOOST_AUTO_TEST_CASE(bf16_and_fp16_sections_map) {
  ferry::test::TempDir dir("ds_precision");
  const std::string bf = write(dir.path / "bf16.json", {{"bf16", {{"enabled", true}, {"immediate_grad_update", false}}}});
  const Config b = load_config(kModel, {}, 1, bf);
  BOOST_TEST((b.zero.compute == ferry::nn::DType::bf16));
  BOOST_TEST(!b.fp16);
  BOOST_TEST(contains(b.deepspeed.ignored, "bf16.immediate_grad_update"));
  const std::string alias = write(dir.path / "bfloat16.json", {{"bfloat16", {{"enabled", true}}}});
  BOOST_TEST((load_config(kModel, {}, 1, alias).zero.compute == ferry::nn::DType::bf16));
  const std::string fp = write(dir.path / "fp16.json", {{"fp16",
                                                          {{"enabled", true},
                                                           {"loss_scale", 0},
                                                           {"initial_scale_power", 12},
                                                           {"loss_scale_window", 500},
                                                           {"hysteresis", 3},
                                                           {"consecutive_hysteresis", true},
                                                           {"min_loss_scale", 4},
                                                           {"auto_cast", false}}}});
  const Config f = load_config(kModel, {}, 1, fp);
  BOOST_TEST((f.zero.compute == ferry::nn::DType::f16));
  BOOST_TEST(f.fp16);
  BOOST_TEST(f.loss_scaling.static_scale == 0.0);
  BOOST_TEST(f.loss_scaling.initial_scale_power == 12);
  BOOST_TEST(f.loss_scaling.window == 500);
  BOOST_TEST(f.loss_scaling.hysteresis == 3);
  BOOST_TEST(f.loss_scaling.consecutive_hysteresis);
  BOOST_TEST(f.loss_scaling.min_scale == 4.0);
  BOOST_TEST(contains(f.deepspeed.ignored, "fp16.auto_cast"));
}

BOOST_AUTO_TEST_CASE(refused_keys_name_the_file_and_key) {
  ferry::test::TempDir dir("ds_refused");
  const std::vector<std::pair<json, std::vector<std::string>>> cases = {
      {{{"amp", {{"enabled", true}}}}, {"key 'amp.enabled'", "bf16"}},
      {{{"fp16", {{"enabled", true}, {"fp16_master_weights_and_grads", true}}}}, {"key 'fp16.fp16_master_weights_and_grads'"}},
      {{{"fp16", {{"enabled", true}}}, {"bf16", {{"enabled", true}}}}, {"bf16.enabled and fp16.enabled are both true"}},
      {{{"optimizer", {{"type", "Lamb"}, {"params", {{"lr", 1e-3}}}}}}, {"key 'optimizer.type'", "\"Lamb\""}},
      {{{"optimizer", {{"type", "Adam"}, {"params", {{"adam_w_mode", false}}}}}}, {"key 'optimizer.params.adam_w_mode'"}},
      {{{"scheduler", {{"type", "OneCycle"}}}}, {"key 'scheduler.type'", "WarmupLR, WarmupDecayLR"}},
      {{{"communication_data_type", "fp16"}}, {"key 'communication_data_type'"}},
      {{{"communication_data_type", true}}, {"key 'communication_data_type'"}},
      {{{"zero_optimization", {{"zero_quantized_weights", true}}}}, {"key 'zero_optimization.zero_quantized_weights'"}},
      {{{"pipeline", {{"stages", 2}}}}, {"key 'pipeline'"}},
      {{{"curriculum_learning", {{"enabled", true}}}}, {"key 'curriculum_learning.enabled'"}},
      {{{"model", {{"n_layer", 2}}}}, {"key 'model'", "--config"}},
      {{{"zero_optimization", {{"stage", 5}}}}, {"key 'zero_optimization.stage' must be in [0, 3]"}},
      // A float no integer setting holds: refused under this file's name (tests/fuzz/fuzz_deepspeed.cpp).
      {{{"zero_optimization", {{"reduce_bucket_size", 2e81}}}},
       {"key 'zero_optimization.reduce_bucket_size' is 2e+81, beyond the range of this integer setting"}},
      {{{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.5}}}}}, {"scheduler", {{"type", "WarmupLR"}}}},
       {}},  // accepted: control
  };
  int n = 0;
  for (const auto& [doc, parts] : cases) {
    const std::string ds = write(dir.path / ("ds" + std::to_string(n++) + ".json"), doc);
    if (parts.empty()) {
      BOOST_TEST(load_config(kModel, {}, 1, ds).optimizer.lr == 0.5);
      continue;
    }
    const std::string e = error_of<ConfigError>([&] { load_config(kModel, {}, 1, ds); });
    BOOST_TEST(has(e, ds + ": "), e);
    for (const std::string& p : parts) BOOST_TEST(has(e, p), e);
  }
}

BOOST_AUTO_TEST_CASE(both_files_setting_a_key_differently) {
  ferry::test::TempDir dir("ds_conflict");
  const std::string ferry = write(dir.path / "ferry.json", [] {
    json d = model_doc();
    d["gradient_accumulation_steps"] = 4;
    d["train_micro_batch_size_per_gpu"] = 8;
    return d;
  }());
  const std::string ds = write(dir.path / "ds.json", {{"gradient_accumulation_steps", 2}, {"train_micro_batch_size_per_gpu", "auto"}});
  const std::string e = error_of<ConfigError>([&] { load_config(ferry, {}, 1, ds); });
  BOOST_TEST(has(e, ds + ": key 'gradient_accumulation_steps' is 2 here but 4 in " + ferry), e);
  // "auto" takes ferry's file's value; the same value in both is fine.
  const std::string same = write(dir.path / "same.json", {{"gradient_accumulation_steps", 4}, {"train_micro_batch_size_per_gpu", "auto"}});
  const Config c = load_config(ferry, {}, 1, same);
  BOOST_TEST(c.micro_batch == 8);
  BOOST_TEST(c.grad_accum == 4);
  // Unknown keys are listed, not fatal; nvme paths are relative to the DeepSpeed file.
  const std::string rel = write(dir.path / "rel.json",
                                {{"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "swap"}}}}},
                                 {"my_custom_key", 1}});
  const Config r = load_config(ferry, {}, 1, rel);
  BOOST_TEST(r.offload.optimizer_paths == std::vector<std::string>{(dir.path / "swap").string()});
  BOOST_TEST(contains(r.deepspeed.ignored, "my_custom_key (unknown to ferry)"));
  const std::string missing = (dir.path / "nope.json").string();
  BOOST_TEST(has(error_of<ConfigError>([&] { load_config(ferry, {}, 1, missing); }), missing + ": cannot open the DeepSpeed configuration file"));
}

// DeepSpeed's monitors: tensorboard and csv_monitor write under output_path/job_name
// (relative to the DeepSpeed file, job_name "DeepSpeedJobName" when absent); a disabled one
// writes nothing and is not listed; their keys of no effect here are listed; wandb and comet
// stay listed as ignored.
BOOST_AUTO_TEST_CASE(tensorboard_and_csv_monitor_sections) {
  ferry::test::TempDir dir("ds_monitors");
  const std::string ds = write(dir.path / "ds.json", {{"tensorboard", {{"enabled", true}, {"output_path", "logs/tb"}, {"job_name", "run1"}}},
                                                      {"csv_monitor", {{"enabled", true}, {"output_path", "/abs/csv"}}},
                                                      {"wandb", {{"enabled", true}, {"project", "p"}}},
                                                      {"comet", {{"enabled", false}}}});
  const Config c = load_config(kModel, {}, 1, ds);
  BOOST_TEST(c.log.tensorboard == (dir.path / "logs/tb/run1").lexically_normal().string());
  BOOST_TEST(c.log.csv == "/abs/csv/DeepSpeedJobName");
  BOOST_TEST(contains(c.deepspeed.ignored, "wandb.enabled"));
  BOOST_TEST(!contains(c.deepspeed.ignored, "tensorboard.enabled"));
  const std::string off = write(dir.path / "off.json", {{"tensorboard", {{"enabled", false}, {"output_path", "x"}}},
                                                        {"csv_monitor", {{"enabled", true}, {"flush_secs", 5}}}});
  const Config o = load_config(kModel, {}, 1, off);
  BOOST_TEST(o.log.tensorboard.empty());
  BOOST_TEST(o.log.csv == (dir.path / "DeepSpeedJobName").string());
  BOOST_TEST(contains(o.deepspeed.ignored, "csv_monitor.flush_secs"));
  const std::string bad = write(dir.path / "bad.json", {{"tensorboard", {{"enabled", "yes"}}}});
  const std::string e = error_of<ConfigError>([&] { load_config(kModel, {}, 1, bad); });
  BOOST_TEST(has(e, bad + ": key 'tensorboard.enabled': must be true or false"), e);
}
