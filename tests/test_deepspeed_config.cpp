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
  BOOST_TEST(c.offload.optimizer_device == ferry::offload::Tier::cpu);
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
  BOOST_TEST(c.offload.optimizer_device == ferry::offload::Tier::nvme);
  BOOST_TEST(c.offload.param_device == ferry::offload::Tier::nvme);
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

// Issue 37: the files users already have (tests/data/user_files/configs, sources in its README).
namespace {
const std::string kUser = kSource + "/tests/data/user_files/configs/";
}  // namespace

// Axolotl's ZeRO-3 files: max_live_parameters 0 is DeepSpeed's "nothing gathered ahead"
// (its schema takes ge=0); a bad value is named as the file writes it; --set replaces a
// file's value before the value is checked.
BOOST_AUTO_TEST_CASE(axolotl_zero3_max_live_parameters_zero) {
  const Config c = load_config(kModel, {}, 1, kUser + "axolotl_zero3_bf16.json");
  BOOST_TEST(c.zero.stage == 3);
  BOOST_TEST(c.zero.max_live_parameters == 0);
  BOOST_TEST(c.zero.prefetch_bucket_size == 14745);  // "auto": floor(0.9 x 128^2)
  BOOST_TEST(c.bf16);
  for (const char* k : {"zero_optimization.max_reuse_distance", "zero_optimization.param_persistence_threshold",
                        "zero_optimization.sub_group_size", "zero_optimization.gather_16bit_weights_on_model_save"}) {
    BOOST_TEST(contains(c.deepspeed.ignored, k), k);
  }
  ferry::test::TempDir dir("ds_live");
  const std::string bad = write(dir.path / "bad.json", {{"zero_optimization", {{"stage", 3}, {"max_live_parameters", -1}}}});
  const std::string e = error_of<ConfigError>([&] { load_config(kModel, {}, 1, bad); });
  BOOST_TEST(has(e, bad + ": key 'zero_optimization.max_live_parameters' must be >= 0, got -1"), e);
  const Config o = load_config(kModel, {"zero_optimization.stage3_max_live_parameters=5000"}, 1, bad);
  BOOST_TEST(o.zero.max_live_parameters == 5000);
  // A key both files set differently names the DeepSpeed spelling and ferry's.
  const std::string ferry = write(dir.path / "ferry.json", [] {
    json d = model_doc();
    d["zero_optimization"]["stage3_max_live_parameters"] = 10;
    return d;
  }());
  const std::string zero = write(dir.path / "zero.json", {{"zero_optimization", {{"max_live_parameters", 0}}}});
  const std::string m = error_of<ConfigError>([&] { load_config(ferry, {}, 1, zero); });
  BOOST_TEST(has(m, "key 'zero_optimization.max_live_parameters' ('zero_optimization.stage3_max_live_parameters') is 0 here but 10"), m);
}

// Keys that would change the run are refused, their harmless values listed: tensor and
// sequence parallelism of one rank, bf16 master weights off, LoCo (ZeRO++ only).
BOOST_AUTO_TEST_CASE(parallelism_and_precision_keys) {
  const std::string e = error_of<ConfigError>([&] { load_config(kModel, {}, 2, kUser + "ds_autotp_size2.json"); });
  BOOST_TEST(has(e, "ds_autotp_size2.json: key 'tensor_parallel.autotp_size': tensor parallelism (AutoTP) over 2 ranks"), e);
  BOOST_TEST(has(e, "the global batch and the run would change"), e);
  ferry::test::TempDir dir("ds_parallel");
  const std::vector<std::pair<json, std::string>> refused = {
      {{{"sequence_parallel_size", 4}}, "key 'sequence_parallel_size': sequence parallelism (Ulysses) over 4 ranks"},
      {{{"tensor_parallel", {{"tp", {{"tp_size", 2}}}}}}, "key 'tensor_parallel.tp.tp_size'"},
      {{{"tensor_parallel", {{"autotp_size", "2"}}}}, "key 'tensor_parallel.autotp_size': must be a whole number"},
      {{{"bf16", {{"enabled", true}, {"bf16_master_weights_and_grads", true}}}}, "key 'bf16.bf16_master_weights_and_grads'"},
      {{{"torch_autocast", {{"enabled", true}}}}, "key 'torch_autocast'"},
      {{{"scheduler", {{"type", "WarmupLR"}, {"params", {{"last_batch_iteration", 99}}}}}}, "key 'scheduler.params.last_batch_iteration'"},
  };
  int n = 0;
  for (const auto& [doc, part] : refused) {
    const std::string ds = write(dir.path / (std::to_string(n++) + "r.json"), doc);
    const std::string r = error_of<ConfigError>([&] { load_config(kModel, {}, 1, ds); });
    BOOST_TEST(has(r, ds + ": " + part), r);
  }
  const std::string ok = write(dir.path / "ok.json", {{"tensor_parallel", {{"autotp_size", 1}}},
                                                      {"sequence_parallel_size", 1},
                                                      {"zero_optimization", {{"stage", 2}, {"zeropp_loco_param", {{"err_beta", 0.8}}}}},
                                                      {"torch_autocast", {{"enabled", false}}}});
  const Config c = load_config(kModel, {}, 1, ok);
  for (const char* k : {"tensor_parallel.autotp_size", "sequence_parallel_size", "zero_optimization.zeropp_loco_param.err_beta",
                        "torch_autocast.enabled"}) {
    BOOST_TEST(contains(c.deepspeed.ignored, k), k);
  }
}

// train_batch_size from the DeepSpeed file: the error names that file, and ferry's file for
// the micro batch it gave.
BOOST_AUTO_TEST_CASE(batch_error_names_the_file_of_the_value) {
  const std::string ds = kUser + "ds_batch_mismatch.json";
  const std::string e = error_of<ConfigError>([&] { load_config(kModel, {}, 1, ds); });
  BOOST_TEST(has(e, ds + ": train_batch_size (64) must equal train_micro_batch_size_per_gpu (4) x "
                         "gradient_accumulation_steps (1) x world size (1) = 4"), e);
  ferry::test::TempDir dir("ds_batch");
  const std::string ferry = write(dir.path / "ferry.json", [] {
    json d = model_doc();
    d["train_micro_batch_size_per_gpu"] = 3;
    return d;
  }());
  const std::string only = write(dir.path / "tbs.json", {{"train_batch_size", 64}, {"gradient_accumulation_steps", 2}});
  const std::string m = error_of<ConfigError>([&] { load_config(ferry, {}, 2, only); });
  BOOST_TEST(has(m, only + ": train_batch_size (64) must equal train_micro_batch_size_per_gpu (3, from " + ferry + ")"), m);
}

// accelerate YAMLs of the DeepSpeed kind, inline keys or deepspeed_config_file, through
// --deepspeed and --fsdp; the other kinds go where they belong or are refused.
BOOST_AUTO_TEST_CASE(accelerate_deepspeed_yaml) {
  const Config t = load_config(kModel, {}, 2, kUser + "trl_deepspeed_zero3.yaml");
  BOOST_TEST(t.zero.stage == 3);
  BOOST_TEST(t.fp16);
  BOOST_TEST(!t.bf16);
  BOOST_TEST(t.grad_accum == 1);
  BOOST_TEST(t.offload.optimizer_device == ferry::offload::Tier::device);
  BOOST_TEST(t.grad_clip == 1.0);  // accelerate's "auto": ferry's default, as the Trainer's max_grad_norm
  BOOST_TEST(contains(t.deepspeed.resolved, "deepspeed_config.zero_stage = 3 -> zero_optimization.stage = 3"));
  BOOST_TEST(contains(t.deepspeed.resolved, "mixed_precision = fp16 -> bf16.enabled = false, fp16.enabled = true"));
  for (const char* k : {"deepspeed_config.zero3_init_flag", "deepspeed_config.deepspeed_multinode_launcher", "machine_rank",
                        "tpu_env", "rdzv_backend"}) {
    BOOST_TEST(contains(t.deepspeed.ignored, k), k);
  }
  BOOST_TEST(t.deepspeed.warnings.size() == 1u);
  BOOST_TEST(has(t.deepspeed.warnings.at(0), "num_processes is 8 but the run has 2 rank(s)"));

  const Config h = load_config(kModel, {}, 1, "", kUser + "handbook_deepspeed_zero3.yaml");  // --fsdp
  BOOST_TEST(h.zero.stage == 3);
  BOOST_TEST(h.bf16);
  BOOST_TEST(h.offload.optimizer_device == ferry::offload::Tier::cpu);
  BOOST_TEST(h.offload.param_device == ferry::offload::Tier::cpu);
  BOOST_TEST(h.deepspeed.path == kUser + "handbook_deepspeed_zero3.yaml");
  BOOST_TEST(has(h.deepspeed.warnings.at(0), "distributed_type DEEPSPEED, read as --deepspeed reads it"));

  const Config f = load_config(kModel, {}, 2, kUser + "accelerate_ds_file.yaml");
  BOOST_TEST(f.zero.stage == 2);
  BOOST_TEST(f.offload.optimizer_device == ferry::offload::Tier::cpu);
  BOOST_TEST(f.zero.reduce_bucket_size == 200'000'000);
  BOOST_TEST(contains(f.deepspeed.ignored, "zero_optimization.reduce_scatter"));
  BOOST_TEST(contains(f.deepspeed.resolved, "deepspeed_config.deepspeed_config_file = ds_config_zero2.json -> the DeepSpeed "
                                            "keys of " + kUser + "ds_config_zero2.json"));

  ferry::test::TempDir dir("accelerate_ds");
  const auto yaml = [&](const std::string& name, const std::string& text) {
    const fs::path p = dir.path / name;
    std::ofstream(p) << text;
    return p.string();
  };
  const std::string head = "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n";
  const std::vector<std::pair<std::string, std::string>> refused = {
      {head + "deepspeed_config:\n  zero_stage: 7\n", "key 'deepspeed_config.zero_stage' must be in [0, 3], got 7"},
      {head + "deepspeed_config:\n  zero_stag: 3\n", "key 'deepspeed_config.zero_stag': is not a key of accelerate's "
                                                     "deepspeed_config; did you mean 'zero_stage'?"},
      {head + "deepspeed_config:\n  offload_optimizer_device: disk\n  zero_stage: 2\n",
       "key 'deepspeed_config.offload_optimizer_device' must be one of none, cpu, nvme, got \"disk\""},
      {head + "deepspeed_config:\n  deepspeed_config_file: ds.json\n  zero_stage: 3\n",
       "key 'deepspeed_config.zero_stage': is set beside deepspeed_config_file, which accelerate refuses"},
      {head + "deepspeed_config:\n  deepspeed_config_file: missing.json\n", "key 'deepspeed_config.deepspeed_config_file': names missing.json"},
      {head + "mixed_precision: fp8\n", "key 'mixed_precision': fp8 training is not implemented"},
      {head + "num_procesess: 2\n", "key 'num_procesess': is not an accelerate key ferry knows"},
      {head + "parallelism_config:\n  parallelism_config_tp_size: 2\n", "key 'parallelism_config.parallelism_config_tp_size'"},
      {"compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\n", "key 'distributed_type': is MULTI_GPU, not DEEPSPEED or FSDP"},
  };
  int n = 0;
  for (const auto& [text, part] : refused) {
    const std::string p = yaml(std::to_string(n++) + "r.yaml", text);
    const std::string e = error_of<ConfigError>([&] { load_config(kModel, {}, 1, p); });
    BOOST_TEST(has(e, p + ": " + part), e);
  }
  // The file's explicit precision against the YAML's: refused; "auto" takes the YAML's.
  write(dir.path / "ds.json", {{"fp16", {{"enabled", true}}}, {"zero_optimization", {{"stage", 1}}}});
  const std::string clash = yaml("clash.yaml", head + "deepspeed_config:\n  deepspeed_config_file: ds.json\nmixed_precision: bf16\n");
  const std::string ce = error_of<ConfigError>([&] { load_config(kModel, {}, 1, clash); });
  BOOST_TEST(has(ce, clash + ": key 'mixed_precision': is bf16 but " + (dir.path / "ds.json").string() + " enables fp16"), ce);
  write(dir.path / "auto.json", {{"bf16", {{"enabled", "auto"}}}, {"zero_optimization", {{"stage", 1}}}});
  const Config a = load_config(kModel, {}, 1, yaml("auto.yaml", head + "deepspeed_config:\n  deepspeed_config_file: auto.json\nmixed_precision: bf16\n"));
  BOOST_TEST(a.bf16);
  BOOST_TEST(a.zero.stage == 1);
  // An inline key accelerate does not read is listed as such; accelerate's defaults apply.
  const Config d = load_config(kModel, {}, 1, yaml("d.yaml", head + "deepspeed_config:\n  stage3_max_live_parameters: 1e9\n"));
  BOOST_TEST(d.zero.stage == 2);
  BOOST_TEST(contains(d.deepspeed.ignored, "deepspeed_config.stage3_max_live_parameters (accelerate does not pass it to DeepSpeed)"));
  // JSON with a leading comment is JSON; YAML with one is YAML.
  const std::string commented = yaml("c.conf", "// ZeRO-1\n{\"zero_optimization\": {\"stage\": 1}}\n");
  BOOST_TEST(load_config(kModel, {}, 1, commented).zero.stage == 1);
  const Config y = load_config(kModel, {}, 1, yaml("plain.yaml", "# a DeepSpeed file in YAML\nzero_optimization:\n  stage: 1\n"));
  BOOST_TEST(y.zero.stage == 1);
  // An FSDP accelerate file given to --deepspeed is read as --fsdp reads it.
  const Config s = load_config(kSource + "/examples/configs/llama-tiny.json", {}, 2, kSource + "/examples/fsdp/accelerate_fsdp.yaml");
  BOOST_TEST(s.zero.stage == 3);
  BOOST_TEST(has(s.fsdp.warnings.at(0), "distributed_type FSDP, read as --fsdp reads it"));
}

// nvme_path folders that do not exist yet are created, as DeepSpeed does; where one cannot
// be, the error names the folder, the file, the key and the OS error.
BOOST_AUTO_TEST_CASE(nvme_folders_created) {
  ferry::test::TempDir dir("ds_nvme_new");
  fs::copy_file(kUser + "ds_nvme_new_folder.json", dir.path / "ds.json");
  const Config c = load_config(kModel, {}, 1, (dir.path / "ds.json").string());
  BOOST_TEST(c.nvme_folders.size() == 2u);
  BOOST_TEST(!fs::exists(dir.path / "nvme-swap"));  // loading alone creates nothing
  create_nvme_folders(c);
  BOOST_TEST(fs::is_directory(dir.path / "nvme-swap/optimizer"));
  BOOST_TEST(fs::is_directory(dir.path / "nvme-swap/params"));
  create_nvme_folders(c);  // existing: nothing to do
  std::ofstream(dir.path / "file") << "x";
  const std::string ds = write(dir.path / "under_file.json",
                               {{"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "file/swap"}}}}}});
  const Config u = load_config(kModel, {}, 1, ds);
  const std::string e = error_of<ConfigError>([&] { create_nvme_folders(u); });
  BOOST_TEST(has(e, ds + ": key 'zero_optimization.offload_optimizer.nvme_path': cannot create the nvme_path folder " +
                        (dir.path / "file/swap").string() + ": "), e);
  BOOST_TEST(has(e, "Not a directory"), e);
}
