// Configuration: defaults, overrides, and every kind of error naming the file and the key.
#define BOOST_TEST_MODULE config
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "runtime/config/config.h"
#include "runtime/config/config_schema.h"
#include "runtime/train/lr_schedule.h"
#include "error_of.h"

using namespace ferry::runtime;
using nlohmann::json;
namespace fs = std::filesystem;

using ferry::test::error_of;
using ferry::test::has;

namespace {

const json kMinimal = {{"data", {{"path", "corpus.txt"}}}};

Config from(json doc, std::vector<std::string> sets = {}) {
  return config_from_json(doc, "cfg.json", "/base", sets);
}


}  // namespace

BOOST_AUTO_TEST_CASE(defaults_fill_everything) {
  Config c = from(kMinimal);
  BOOST_TEST(c.model.n_layer == 4);
  BOOST_TEST(c.model.vocab_size == 256);
  BOOST_TEST(c.micro_batch == 16);
  BOOST_TEST(c.grad_accum == 1);
  BOOST_TEST(c.optimizer.beta2 == 0.999);
  BOOST_TEST(c.device.memory == 4ull << 30);
  BOOST_TEST(c.data.path == "/base/corpus.txt");  // relative to the config file's folder
  BOOST_TEST(c.scheduler.type.empty());
  BOOST_TEST(c.resolved["train_batch_size"] == 16);
  BOOST_TEST(!c.resolved.contains("scheduler"));
}

BOOST_AUTO_TEST_CASE(overrides_are_checked_like_the_file) {
  Config c = from(kMinimal, {"model.n_layer=2", "device.memory=512MiB", "optimizer.params.betas=[0.8,0.9]"});
  BOOST_TEST(c.model.n_layer == 2);
  BOOST_TEST(c.device.memory == 512ull << 20);
  BOOST_TEST(c.optimizer.beta1 == 0.8);
  std::string e = error_of<ConfigError>([] { from(kMinimal, {"model.n_layers=2"}); });
  BOOST_TEST(has(e, "--set model.n_layers=2"), e);
  BOOST_TEST(has(e, "did you mean 'model.n_layer'"), e);
  e = error_of<ConfigError>([] { from(kMinimal, {"model.n_layer=two"}); });
  BOOST_TEST(has(e, "'model.n_layer' must be an integer"), e);
  e = error_of<ConfigError>([] { from(kMinimal, {"model=3"}); });
  BOOST_TEST(has(e, "is a section"), e);
  e = error_of<ConfigError>([] { from(kMinimal, {"no_equals_sign"}); });
  BOOST_TEST(has(e, "key.path=value"), e);
}

BOOST_AUTO_TEST_CASE(unknown_keys_suggest_the_closest) {
  std::string e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"model", {{"n_embed", 64}}}}); });
  BOOST_TEST(has(e, "cfg.json: unknown key 'model.n_embed' (did you mean 'model.n_embd'?)"), e);
  e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"gradient_acumulation_steps", 2}}); });
  BOOST_TEST(has(e, "did you mean 'gradient_accumulation_steps'"), e);
  e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"zzzzzzzz", 1}}); });
  BOOST_TEST(has(e, "unknown key 'zzzzzzzz'"), e);
  BOOST_TEST(!has(e, "did you mean"), e);
}

BOOST_AUTO_TEST_CASE(wrong_types_and_ranges_name_the_key) {
  std::string e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"model", {{"n_head", "4"}}}}); });
  BOOST_TEST(has(e, "key 'model.n_head' must be an integer, got \"4\""), e);
  e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"model", {{"n_layer", 0}}}}); });
  BOOST_TEST(has(e, "key 'model.n_layer' must be >= 1, got 0"), e);
  // lr 0 is taken (PyTorch and DeepSpeed take it; people check a pipeline with it); below 0 is not.
  BOOST_TEST(from({{"data", {{"path", "x"}}}, {"optimizer", {{"params", {{"lr", 0}}}}}}).optimizer.lr == 0.0);
  e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"optimizer", {{"params", {{"lr", -1e-5}}}}}}); });
  BOOST_TEST(has(e, "'optimizer.params.lr' must be >= 0"), e);
  e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"optimizer", {{"params", {{"betas", {0.9, 1.0}}}}}}}); });
  BOOST_TEST(has(e, "betas in [0, 1)"), e);
  e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}, {"format", "csv"}}}}); });
  BOOST_TEST(has(e, "'data.format' must be one of text, uint16"), e);
  e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"device", {{"type", "tpu"}}}}); });
  BOOST_TEST(has(e, "'device.type' must be one of cpu, cuda, got \"tpu\""), e);
  e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"device", {{"memory", "12 parsecs"}}}}); });
  BOOST_TEST(has(e, "device.memory"), e);
  e = error_of<ConfigError>([] { from({{"data", 5}}); });
  BOOST_TEST(has(e, "'data' is a section and must be an object"), e);
  e = error_of<ConfigError>([] { from(json::object()); });
  BOOST_TEST(has(e, "'data.path' is required"), e);
}

// A number an integer setting cannot hold is refused naming the key, in the file and from
// --set: storing it wrapped (an integer past an int field) or was undefined behaviour (a
// float such as 2e81 for a 64-bit bucket size; found by tests/fuzz/fuzz_deepspeed.cpp).
BOOST_AUTO_TEST_CASE(numbers_beyond_an_integer_setting_are_refused) {
  std::string e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"zero_optimization", {{"reduce_bucket_size", 2e81}}}}); });
  BOOST_TEST(has(e, "cfg.json: key 'zero_optimization.reduce_bucket_size' is 2e+81, beyond the range of this integer setting"), e);
  e = error_of<ConfigError>([] { from(kMinimal, {"zero_optimization.stage3_max_live_parameters=1e19"}); });
  BOOST_TEST(has(e, "key 'zero_optimization.stage3_max_live_parameters' is 1e+19, beyond the range"), e);
  e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"checkpoint", {{"keep_last", int64_t{1} << 40}}}}); });
  BOOST_TEST(has(e, "key 'checkpoint.keep_last' is 1099511627776, beyond the range"), e);
  e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"model", {{"n_layer", uint64_t{1} << 63}}}}); });
  BOOST_TEST(has(e, "key 'model.n_layer' is 9223372036854775808, beyond the range"), e);
  // A shape whose element counts would overflow the layout's 64-bit products (n_embd 2^40:
  // 3 x 2^80 elements in one matrix; found by tests/fuzz/fuzz_config.cpp).
  e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"model", {{"n_embd", int64_t{1} << 40}, {"n_head", 1}}}}); });
  BOOST_TEST(has(e, "cfg.json: model.n_layer 4, n_embd 1099511627776, vocab_size 256, block_size 128 give a model of "
                    "about"),
             e);
  BOOST_TEST(has(e, "parameters, beyond 2^50"), e);
  BOOST_TEST(from({{"data", {{"path", "x"}}}, {"model", {{"preset", "llama-405b"}}}}).model.n_layer == 126);
  // The largest values the fields hold are taken.
  BOOST_TEST(from({{"data", {{"path", "x"}}}, {"zero_optimization", {{"reduce_bucket_size", 9e18}}}}).zero.reduce_bucket_size ==
             int64_t{9'000'000'000'000'000'000});
  BOOST_TEST(from({{"data", {{"path", "x"}}}, {"checkpoint", {{"keep_last", INT32_MAX}}}}).checkpoint.keep_last == INT32_MAX);
}

BOOST_AUTO_TEST_CASE(cross_key_checks) {
  std::string e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"model", {{"n_embd", 100}, {"n_head", 3}}}}); });
  BOOST_TEST(has(e, "model.n_embd (100) must be a multiple of model.n_head (3)"), e);
  e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"bf16", {{"enabled", true}}}, {"fp16", {{"enabled", true}}}}); });
  BOOST_TEST(has(e, "bf16.enabled and fp16.enabled are both true; choose one"), e);
  e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"fp16", {{"min_loss_scale", 0}}}}); });
  BOOST_TEST(has(e, "fp16.min_loss_scale"), e);
  e = error_of<ConfigError>([] {
    from({{"data", {{"path", "x"}}}, {"train_batch_size", 64}, {"train_micro_batch_size_per_gpu", 8},
          {"gradient_accumulation_steps", 2}});
  });
  BOOST_TEST(has(e, "train_batch_size (64) must equal"), e);
  BOOST_TEST(has(e, "= 16"), e);
  Config ok = from({{"data", {{"path", "x"}}}, {"train_batch_size", 16}, {"train_micro_batch_size_per_gpu", 8},
                    {"gradient_accumulation_steps", 2}});
  BOOST_TEST(ok.global_batch() == 16);
  e = error_of<ConfigError>([] {
    from({{"data", {{"path", "x"}}}, {"scheduler", {{"type", "WarmupCosineLR"}, {"params", {{"warmup_max_lr", 0.1}}}}}});
  });
  BOOST_TEST(has(e, "'scheduler.params.warmup_max_lr' is not a parameter of WarmupCosineLR"), e);
  e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"scheduler", {{"params", {{"warmup_num_steps", 3}}}}}}); });
  BOOST_TEST(has(e, "without scheduler.type"), e);
}

BOOST_AUTO_TEST_CASE(files_bad_json_and_missing) {
  const fs::path dir = fs::temp_directory_path() / "ferry_test_config";
  fs::create_directories(dir);
  {
    std::ofstream(dir / "bad.json") << "{\"model\": {\"n_layer\": 2,}}";
  }
  std::string e = error_of<ConfigError>([&] { load_config((dir / "bad.json").string(), {}); });
  BOOST_TEST(has(e, "bad.json: not valid JSON"), e);
  e = error_of<ConfigError>([&] { load_config((dir / "absent.json").string(), {}); });
  BOOST_TEST(has(e, "absent.json: cannot open"), e);
  {  // a number past a double: json's out_of_range escaped before (tests/fuzz/fuzz_config.cpp)
    std::ofstream(dir / "huge.json") << R"({"data": {"path": "c.txt"}, "train": {"steps": 1e999}})";
  }
  e = error_of<ConfigError>([&] { load_config((dir / "huge.json").string(), {}); });
  BOOST_TEST(has(e, "huge.json: not valid JSON: [json.exception.out_of_range.406] number overflow parsing '1e999'"), e);
  {
    std::ofstream(dir / "typo.json") << R"({"data": {"path": "c.txt"}, "train": {"stpes": 3}})";
  }
  e = error_of<ConfigError>([&] { load_config((dir / "typo.json").string(), {}); });
  BOOST_TEST(has(e, "typo.json: unknown key 'train.stpes' (did you mean 'train.steps'?)"), e);
  fs::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(byte_sizes) {
  BOOST_TEST(parse_bytes(json(1000), "x") == 1000u);
  BOOST_TEST(parse_bytes(json("2GiB"), "x") == 2ull << 30);
  BOOST_TEST(parse_bytes(json("1.5GB"), "x") == 1500000000ull);
  BOOST_TEST(parse_bytes(json("64 KiB"), "x") == 65536u);
  BOOST_CHECK_THROW(parse_bytes(json("3 lightyears"), "x"), ConfigError);
  BOOST_CHECK_THROW(parse_bytes(json(-1), "x"), ConfigError);
  BOOST_CHECK_THROW(parse_bytes(json(true), "x"), ConfigError);
}

BOOST_AUTO_TEST_CASE(deepspeed_schedules) {
  SchedulerConfig s;
  BOOST_TEST(learning_rate(s, 0.01, 123) == 0.01);  // no scheduler: constant
  s.type = "WarmupLR";
  s.warmup_min_lr = 0;
  s.warmup_max_lr = 0.1;
  s.warmup_num_steps = 100;
  s.warmup_type = "linear";
  BOOST_TEST(learning_rate(s, 1, 0) == 0.0);
  BOOST_TEST(learning_rate(s, 1, 50) == 0.05, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(learning_rate(s, 1, 500) == 0.1);
  s.warmup_type = "log";  // log(step + 1) / log(warmup)
  BOOST_TEST(learning_rate(s, 1, 9) == 0.1 * std::log(10.0) / std::log(100.0), boost::test_tools::tolerance(1e-12));
  s.type = "WarmupDecayLR";
  s.total_num_steps = 300;
  BOOST_TEST(learning_rate(s, 1, 200) == 0.1 * 100.0 / 200.0, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(learning_rate(s, 1, 300) == 0.0);
  s.type = "WarmupCosineLR";
  s.warmup_type = "linear";
  s.warmup_min_ratio = 0.0;
  s.cos_min_ratio = 0.1;
  BOOST_TEST(learning_rate(s, 2.0, 50) == 1.0, boost::test_tools::tolerance(1e-12));
  // Halfway through the decay: ratio = 0.1 + 0.9 * (1 + cos(pi/2)) / 2 = 0.55.
  BOOST_TEST(learning_rate(s, 2.0, 199) == 2.0 * 0.55, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(learning_rate(s, 2.0, 299) == 2.0 * 0.1, boost::test_tools::tolerance(1e-12));
}

// One source of defaults: every knob's table default equals what a default-built Config
// holds in the knob's own field, so struct initialisers (config.h, sections.h and the nn/
// and offload/ structs Config holds) cannot drift from the table.
bool same_value(const Knob& k, const json& held, const json& want) {
  const json w = k.type == KnobType::bytes ? json(parse_bytes(want, k.path)) : want;
  if (w.is_number()) return held.is_number() && held.get<double>() == w.get<double>();
  return held == w;
}

BOOST_AUTO_TEST_CASE(knob_defaults_match_structs) {
  const Config fresh;
  size_t bound = 0;
  for (const Knob& k : config_knobs()) {
    if (!k.bind) continue;  // consumed by the cross-key rules only (model.preset, train_batch_size)
    ++bound;
    if (k.default_value.is_null()) continue;  // absent unless given: the rules say what absence means
    const json held = k.bind.read(fresh);
    BOOST_TEST(same_value(k, held, k.default_value), k.path << ": table " << k.default_value.dump() << ", struct "
                                                            << held.dump());
  }
  BOOST_TEST(bound == config_knobs().size() - 2);
}

// The binding stores what the resolved configuration prints, for every knob it prints.
BOOST_AUTO_TEST_CASE(bound_fields_match_resolved) {
  json doc = kMinimal;
  doc["model"] = {{"arch", "llama"}, {"n_kv_head", 2}, {"rope_theta", 5e5}};
  doc["device"] = {{"memory", "3GiB"}};
  doc["zero_optimization"] = {{"stage", 3}, {"reduce_bucket_size", 1e6},
                              {"offload_param", {{"device", "nvme"}, {"nvme_path", "/tmp/a,/tmp/b"}}}};
  doc["optimizer"] = {{"params", {{"betas", {0.8, 0.9}}}}};
  doc["scheduler"] = {{"type", "WarmupDecayLR"}, {"params", {{"warmup_num_steps", 7}}}};
  const Config c = from(doc, {"train.steps=30", "aio.block_size=8192"});
  size_t compared = 0;
  for (const Knob& k : config_knobs()) {
    std::string pointer = "/" + k.path;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    const json::json_pointer ptr(pointer);
    if (!k.bind || !c.resolved.contains(ptr)) continue;
    BOOST_TEST(same_value(k, k.bind.read(c), c.resolved[ptr]), k.path << ": field " << k.bind.read(c).dump()
                                                                      << ", resolved " << c.resolved[ptr].dump());
    ++compared;
  }
  BOOST_TEST(compared > 60u);
  BOOST_TEST(c.offload.param_paths == (std::vector<std::string>{"/tmp/a", "/tmp/b"}));
  BOOST_TEST(c.device.memory == 3ull << 30);
  BOOST_TEST(c.scheduler.total_num_steps == 30);  // train.steps
  BOOST_TEST(c.optimizer.beta1 == 0.8);
}

// DeepSpeed's batch arithmetic: train_batch_size with a key left out derives that key.
BOOST_AUTO_TEST_CASE(batch_derived_as_deepspeed) {
  auto cfg = [](json extra, int world) {
    json doc = kMinimal;
    doc.update(extra);
    return config_from_json(doc, "cfg.json", "/base", {}, world);
  };
  Config c = cfg({{"train_batch_size", 64}, {"train_micro_batch_size_per_gpu", 8}}, 2);
  BOOST_TEST(c.grad_accum == 4);  // 64 / 8 / 2
  BOOST_TEST(c.resolved["gradient_accumulation_steps"] == 4);
  c = cfg({{"train_batch_size", 48}, {"gradient_accumulation_steps", 3}}, 2);
  BOOST_TEST(c.micro_batch == 8);  // 48 / 2 / 3
  BOOST_TEST(c.resolved["train_micro_batch_size_per_gpu"] == 8);
  c = cfg({{"train_batch_size", 12}}, 3);
  BOOST_TEST(c.micro_batch == 4);
  BOOST_TEST(c.grad_accum == 1);
  // Not divisible: DeepSpeed's floor, then its assertion that the three multiply out.
  std::string e = error_of<ConfigError>([&] { cfg({{"train_batch_size", 50}, {"train_micro_batch_size_per_gpu", 8}}, 2); });
  BOOST_TEST(has(e, "cfg.json: train_batch_size (50) must equal train_micro_batch_size_per_gpu (8) x "
                    "gradient_accumulation_steps (3) x world size (2) = 48"), e);
  e = error_of<ConfigError>([&] { cfg({{"train_batch_size", 2}, {"gradient_accumulation_steps", 4}}, 2); });
  BOOST_TEST(has(e, "cfg.json: train_batch_size (2) is too small for world size 2 and gradient_accumulation_steps 4"), e);
}

// total_num_steps below the warmup: DeepSpeed warns and runs. The values below are
// DeepSpeed's lr_schedules.py (WarmupDecayLR/WarmupCosineLR._get_gamma, get_lr_ratio) run in
// Python on the same parameters, copied here.
BOOST_AUTO_TEST_CASE(deepspeed_schedules_total_below_warmup) {
  const auto tol = boost::test_tools::tolerance(1e-12);
  SchedulerConfig s;
  s.type = "WarmupDecayLR";
  s.warmup_min_lr = 0.01;
  s.warmup_max_lr = 0.1;
  s.warmup_num_steps = 10;
  s.total_num_steps = 6;
  s.warmup_type = "linear";
  BOOST_TEST(learning_rate(s, 1, 0) == 0.01, tol);
  BOOST_TEST(learning_rate(s, 1, 3) == 0.037000000000000005, tol);
  BOOST_TEST(learning_rate(s, 1, 9) == 0.09100000000000001, tol);  // past total: still warming
  BOOST_TEST(learning_rate(s, 1, 10) == 0.01, tol);                 // then warmup_min_lr
  BOOST_TEST(learning_rate(s, 1, 20) == 0.01, tol);
  BOOST_TEST(has(schedule_warning(s), "total_num_steps 6 is less than warmup_num_steps 10"), schedule_warning(s));
  s.warmup_type = "log";
  BOOST_TEST(learning_rate(s, 1, 4) == 0.07290730039024168, tol);
  BOOST_TEST(learning_rate(s, 1, 9) == 0.09999999999999999, tol);
  BOOST_TEST(learning_rate(s, 1, 10) == 0.01, tol);
  // warmup_num_steps below 2 warms over 2 steps (DeepSpeed's max(2, ...)).
  s.warmup_num_steps = 0;
  s.total_num_steps = 8;
  s.warmup_min_lr = 0.0;
  BOOST_TEST(learning_rate(s, 1, 0) == 0.0, tol);
  BOOST_TEST(learning_rate(s, 1, 1) == 0.1, tol);
  BOOST_TEST(learning_rate(s, 1, 3) == 0.08333333333333334, tol);
  BOOST_TEST(schedule_warning(s) == "");

  SchedulerConfig c;
  c.type = "WarmupCosineLR";
  c.warmup_num_steps = 10;
  c.total_num_steps = 6;
  c.warmup_type = "linear";
  c.warmup_min_ratio = 0.1;
  c.cos_min_ratio = 0.2;
  const std::vector<std::pair<int64_t, double>> cosine = {{0, 0.2}, {5, 1.1}, {9, 1.82}, {10, 1.765685424949238},
                                                          {12, 0.634314575050762}, {14, 0.6343145750507619},
                                                          {16, 1.765685424949238}, {20, 0.6343145750507627}};
  for (const auto& [step, lr] : cosine) BOOST_TEST(learning_rate(c, 2.0, step) == lr, tol);
  BOOST_TEST(has(schedule_warning(c), "total_num_steps 6 is less than warmup_num_steps 10"), schedule_warning(c));
  // Past total_num_steps DeepSpeed's cosine is not clamped: it rises again.
  c.total_num_steps = 30;
  c.warmup_min_ratio = 0.0;
  c.cos_min_ratio = 0.0;
  BOOST_TEST(learning_rate(c, 2.0, 40) == 1.1564344650402307, tol);
  BOOST_TEST(learning_rate(c, 2.0, 60) == 0.8435655349597704, tol);
  BOOST_TEST(schedule_warning(c) == "");
  // Equal to the warmup: DeepSpeed divides by zero; ferry holds cos_min_ratio and says so.
  c.total_num_steps = 10;
  c.cos_min_ratio = 0.3;
  BOOST_TEST(learning_rate(c, 2.0, 10) == 0.6, tol);
  BOOST_TEST(has(schedule_warning(c), "divides by zero"), schedule_warning(c));
  // The configuration accepts it (it used to refuse total_num_steps <= warmup_num_steps).
  const Config cfg = from({{"data", {{"path", "x"}}},
                           {"train", {{"steps", 6}}},
                           {"scheduler", {{"type", "WarmupCosineLR"}, {"params", {{"warmup_num_steps", 50}}}}}});
  BOOST_TEST(cfg.scheduler.total_num_steps == 6);
  BOOST_TEST(cfg.scheduler.warmup_num_steps == 50);
  const Config zero_total = from({{"data", {{"path", "x"}}},
                                  {"scheduler", {{"type", "WarmupDecayLR"}, {"params", {{"total_num_steps", 0}}}}}});
  BOOST_TEST(zero_total.scheduler.total_num_steps == 0);
  BOOST_TEST(learning_rate(zero_total.scheduler, 1, 1000) == 0.0);  // warmup_min_lr after the warmup
}

// Named shapes: the preset sets arch and every dimension the file does not set itself.
BOOST_AUTO_TEST_CASE(model_presets) {
  json doc = kMinimal;
  doc["model"] = {{"preset", "llama-8b"}, {"block_size", 4096}};
  const Config c = from(doc);
  BOOST_TEST(c.model_arch == "llama");
  BOOST_TEST(c.llama.n_layer == 32);
  BOOST_TEST(c.llama.n_head == 32);
  BOOST_TEST(c.llama.n_kv_head == 8);
  BOOST_TEST(c.llama.n_embd == 4096);
  BOOST_TEST(c.llama.intermediate == 14336);
  BOOST_TEST(c.llama.vocab_size == 128256);
  BOOST_TEST(c.llama.rope_theta == 500000.0);
  BOOST_TEST(c.llama.block_size == 4096);  // the file's own value wins over the preset's 2048
  // Meta's published parameter count for Llama 3 8B, from ferry's own layout.
  int64_t params = 0;
  for (const auto& u : ferry::nn::Llama::layout(c.llama))
    for (const auto& t : u.tensors) params += t.numel();
  BOOST_TEST(params == 8030261248);
  BOOST_TEST(from(kMinimal, {"model.preset=llama-70b"}).llama.n_layer == 80);
  BOOST_TEST(from(kMinimal, {"model.preset=llama-405b"}).llama.n_embd == 16384);
  BOOST_TEST(from(kMinimal, {"model.preset=llama-1b"}).llama.intermediate == 8192);
  const Config g = from(kMinimal, {"model.preset=gpt2-small"});
  BOOST_TEST(g.model_arch == "gpt2");
  BOOST_TEST(g.model.n_embd == 768);
  BOOST_TEST(g.model.vocab_size == 50257);
  BOOST_TEST(!g.resolved["model"].contains("rope_theta"));
  BOOST_TEST(has(error_of<ConfigError>([] { from(kMinimal, {"model.preset=llama-9b"}); }), "key 'model.preset' must be one of"));
}

BOOST_AUTO_TEST_CASE(llama_keys) {
  const Config c = from(kMinimal, {"model.arch=llama", "model.n_head=8", "model.n_kv_head=2", "model.n_embd=64"});
  BOOST_TEST(c.llama.n_kv_head == 2);
  BOOST_TEST(c.llama.intermediate == 192);  // 8/3 x 64 = 170.7, up to a multiple of 64
  BOOST_TEST(c.resolved["model"]["intermediate_size"] == 192);
  BOOST_TEST(from(kMinimal, {"model.arch=llama"}).llama.n_kv_head == 4);  // absent: n_head
  std::string e = error_of<ConfigError>([] { from(kMinimal, {"model.arch=llama", "model.n_head=4", "model.n_kv_head=3"}); });
  BOOST_TEST(has(e, "model.n_head (4) must be a multiple of model.n_kv_head (3)"), e);
  e = error_of<ConfigError>([] { from(kMinimal, {"model.arch=llama", "model.n_head=128", "model.n_embd=128"}); });
  BOOST_TEST(has(e, "even head size"), e);
  e = error_of<ConfigError>([] { from(kMinimal, {"model.n_kv_head=2"}); });
  BOOST_TEST(has(e, "model.n_kv_head applies to the llama family (llama, mistral, qwen2, qwen3) only"), e);
  e = error_of<ConfigError>([] { from(kMinimal, {"model.rope_scaling.factor=8"}); });
  BOOST_TEST(has(e, "model.rope_scaling.factor applies to the llama family"), e);
  e = error_of<ConfigError>([] { from(kMinimal, {"model.arch=llama", "model.rope_scaling.low_freq_factor=2"}); });
  BOOST_TEST(has(e, "model.rope_scaling needs model.rope_scaling.factor"), e);
  e = error_of<ConfigError>([] { from(kMinimal, {"model.n_positions=64", "model.block_size=128"}); });
  BOOST_TEST(has(e, "model.block_size (128) exceeds model.n_positions (64)"), e);
  const auto q = from(kMinimal, {"model.arch=qwen2", "model.tie_word_embeddings=true"});
  BOOST_TEST(q.llama.qkv_bias);
  BOOST_TEST(q.llama.tie_embeddings);
  e = error_of<ConfigError>([] { from(kMinimal, {"model.preset=llama-8b", "data.format=uint16"}); });
  BOOST_TEST(has(e, "data.format 'uint16' holds token ids below 65536 but model.vocab_size is 128256"), e);
}

// Hugging Face Trainer names: the common ones are ferry's keys under another spelling, the
// schedule words become the DeepSpeed scheduler with the Trainer's curve, the rest say what
// to set instead.
BOOST_AUTO_TEST_CASE(trainer_names_are_taken_as_ferrys_keys) {
  Config c = from({{"data", {{"path", "x"}}},
                   {"learning_rate", 2e-5},
                   {"gradient_checkpointing", true},
                   {"per_device_train_batch_size", 4},
                   {"gradient_accumulation_steps", 2},
                   {"max_steps", 40},
                   {"save_steps", 10},
                   {"save_total_limit", 3},
                   {"logging_steps", 5},
                   {"weight_decay", 0.01},
                   {"max_grad_norm", 0.5},
                   {"adam_beta2", 0.95},
                   {"seed", 7},
                   {"bf16", true},
                   {"resume_from_checkpoint", true},
                   {"checkpoint", {{"dir", "ck"}}}});
  BOOST_TEST(c.optimizer.lr == 2e-5);
  BOOST_TEST(c.activation_checkpointing);
  BOOST_TEST(c.micro_batch == 4);
  BOOST_TEST(c.grad_accum == 2);
  BOOST_TEST(c.train.steps == 40);
  BOOST_TEST(c.checkpoint.every_steps == 10);
  BOOST_TEST(c.checkpoint.keep_last == 3);
  BOOST_TEST(c.log.every == 5);
  BOOST_TEST(c.optimizer.weight_decay == 0.01);
  BOOST_TEST(c.grad_clip == 0.5);
  BOOST_TEST(c.optimizer.beta1 == 0.9);
  BOOST_TEST(c.optimizer.beta2 == 0.95);
  BOOST_TEST(c.model_seed == 7u);
  BOOST_TEST(c.data.seed == 7u);
  BOOST_TEST(c.bf16);
  BOOST_TEST(c.checkpoint.resume == "auto");
  const auto said = [&](const std::string& line) {
    return std::find(c.trainer_keys.begin(), c.trainer_keys.end(), line) != c.trainer_keys.end();
  };
  BOOST_TEST(said("learning_rate = 2e-05 -> optimizer.params.lr"));
  BOOST_TEST(said("resume_from_checkpoint = true -> checkpoint.resume = \"auto\""));
  // --set takes them too; ferry's own section `bf16` stays an object.
  c = from(kMinimal, {"learning_rate=3e-4", "gradient_checkpointing=true"});
  BOOST_TEST(c.optimizer.lr == 3e-4);
  BOOST_TEST(c.activation_checkpointing);
  BOOST_TEST(from({{"data", {{"path", "x"}}}, {"bf16", {{"enabled", true}}}}).bf16);
  // The same setting twice with two values is an error naming both spellings.
  std::string e = error_of<ConfigError>(
      [] { from({{"data", {{"path", "x"}}}, {"learning_rate", 1e-4}, {"optimizer", {{"params", {{"lr", 1e-3}}}}}}); });
  BOOST_TEST(has(e, "key 'learning_rate' is 0.0001 but 'optimizer.params.lr' is 0.001"), e);
  e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"optim", "adamw_bnb_8bit"}}); });
  BOOST_TEST(has(e, "key 'optim' is \"adamw_bnb_8bit\""), e);
  e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"max_steps", -1}}); });
  BOOST_TEST(has(e, "ferry counts optimizer steps"), e);
}

BOOST_AUTO_TEST_CASE(trainer_schedule_words_give_the_trainers_curve) {
  // linear with warmup_ratio 0.1 of 50 steps: 5 warmup steps from 0 to the lr, then linear to 0.
  Config c = from({{"data", {{"path", "x"}}}, {"learning_rate", 1e-4}, {"lr_scheduler_type", "linear"},
                   {"warmup_ratio", 0.1}, {"max_steps", 50}});
  BOOST_TEST(c.scheduler.type == "WarmupDecayLR");
  BOOST_TEST(c.scheduler.warmup_num_steps == 5);
  BOOST_TEST(c.scheduler.warmup_type == "linear");
  BOOST_TEST(c.scheduler.warmup_max_lr == 1e-4);
  BOOST_TEST(c.scheduler.total_num_steps == 50);
  // transformers' get_linear_schedule_with_warmup at steps 0, 2, 5, 30, 50.
  const auto hf_linear = [](int64_t s) { return s < 5 ? 1e-4 * s / 5.0 : 1e-4 * std::max(0.0, (50.0 - s) / 45.0); };
  for (int64_t s : {2, 5, 30, 50}) {
    BOOST_TEST(std::abs(learning_rate(c.scheduler, c.optimizer.lr, s) - hf_linear(s)) <= 1e-12, "step " << s);
  }
  // cosine: to 0 at the end (cos_min_ratio 0), ceil of the ratio as the Trainer rounds.
  c = from({{"data", {{"path", "x"}}}, {"lr_scheduler_type", "cosine"}, {"warmup_ratio", 0.03}, {"max_steps", 100}});
  BOOST_TEST(c.scheduler.type == "WarmupCosineLR");
  BOOST_TEST(c.scheduler.warmup_num_steps == 3);
  BOOST_TEST(c.scheduler.cos_min_ratio == 0.0);
  // DeepSpeed's WarmupCosineLR counts the first decay step as done: transformers'
  // get_cosine_schedule_with_warmup one step later (docs/guide/finetune.md says so).
  const auto hf_cosine = [&](int64_t s) {
    return c.optimizer.lr * 0.5 * (1.0 + std::cos(M_PI * static_cast<double>(s - 3) / 97.0));
  };
  for (int64_t s : {3, 50, 99}) {
    BOOST_TEST(std::abs(learning_rate(c.scheduler, c.optimizer.lr, s) - hf_cosine(s + 1)) <= 1e-15, "step " << s);
  }
  // warmup_steps alone: the Trainer's default schedule, linear.
  c = from(kMinimal, {"warmup_steps=20", "max_steps=200"});
  BOOST_TEST(c.scheduler.type == "WarmupDecayLR");
  BOOST_TEST(c.scheduler.warmup_num_steps == 20);
  c = from({{"data", {{"path", "x"}}}, {"lr_scheduler_type", "constant"}});
  BOOST_TEST(c.scheduler.type.empty());
  std::string e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"lr_scheduler_type", "polynomial"}}); });
  BOOST_TEST(has(e, "ferry runs linear, cosine, constant and constant_with_warmup"), e);
  e = error_of<ConfigError>([] {
    from({{"data", {{"path", "x"}}}, {"lr_scheduler_type", "cosine"}, {"scheduler", {{"type", "WarmupLR"}}}});
  });
  BOOST_TEST(has(e, "both set the schedule"), e);
}

BOOST_AUTO_TEST_CASE(other_trainer_names_say_what_to_set) {
  std::string e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"num_train_epochs", 3}}); });
  BOOST_TEST(has(e, "unknown key 'num_train_epochs': ferry counts optimizer steps: set train.steps"), e);
  e = error_of<ConfigError>([] { from({{"data", {{"path", "x"}}}, {"output_dir", "out"}}); });
  BOOST_TEST(has(e, "checkpoint.dir"), e);
  e = error_of<ConfigError>([] { from(kMinimal, {"max_seq_length=2048"}); });
  BOOST_TEST(has(e, "--set max_seq_length=2048: unknown key 'max_seq_length': the sequence length is model.block_size"), e);
}

BOOST_AUTO_TEST_CASE(a_validation_file_or_none) {
  Config c = from({{"data", {{"path", "train.jsonl"}, {"val_path", "eval.jsonl"}}}});
  BOOST_TEST(c.data.val_path == "/base/eval.jsonl");
  BOOST_TEST(c.data.val_fraction == 0.0);  // all of data.path trains
  BOOST_TEST(c.resolved["data"]["val_fraction"] == 0);
  BOOST_TEST(from({{"data", {{"path", "x"}, {"val_fraction", 0}}}}).data.val_fraction == 0.0);
  const std::string e = error_of<ConfigError>(
      [] { from({{"data", {{"path", "x"}, {"val_path", "v"}, {"val_fraction", 0.1}}}}); });
  BOOST_TEST(has(e, "data.val_path and data.val_fraction 0.1 both choose the validation data"), e);
}
