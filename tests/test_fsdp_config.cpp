// --fsdp: PyTorch FSDP configurations as users have them (the Hugging Face Trainer's
// fsdp_config JSON, an accelerate YAML file, the Trainer's "full_shard offload" string)
// become the same Config as ferry's own keys would; keys that do not change the run are
// listed; what ferry cannot honour, unknown keys and malformed files name the file and key.
#define BOOST_TEST_MODULE fsdp_config
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <fstream>

#include "runtime/config/config.h"
#include "runtime/config/fsdp_config.h"
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
const std::string kGpt = kSource + "/examples/configs/tiny-model.json";
const std::string kLlama = kSource + "/examples/configs/llama-tiny.json";
const std::string kJson = kSource + "/examples/fsdp/fsdp_config.json";
const std::string kYaml = kSource + "/examples/fsdp/accelerate_fsdp.yaml";


std::string write_text(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
  return p.string();
}
std::string write(const fs::path& p, const json& doc) { return write_text(p, doc.dump(2)); }

// ferry's resolved runtime keys, for "the same Config as ferry's own keys".
json runtime_of(const Config& c) {
  json r = c.resolved;
  for (const char* k : {"data", "log", "train", "checkpoint"}) r.erase(k);
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(trainer_json_example_is_ferrys_keys) {
  const Config c = load_config(kLlama, {}, 2, "", kJson);
  BOOST_TEST(c.zero.stage == 3);
  BOOST_TEST(c.bf16);
  BOOST_TEST(!c.fp16);
  BOOST_TEST(c.zero.overlap_comm);
  BOOST_TEST(c.offload.optimizer_device == ferry::offload::Tier::device);
  BOOST_TEST(c.fsdp.path == kJson);
  for (const char* k : {"fsdp_sync_module_states", "fsdp_use_orig_params"}) BOOST_TEST(contains(c.fsdp.ignored, k), k);
  BOOST_TEST(c.fsdp.ignored.size() == 2u);
  BOOST_TEST(c.fsdp.warnings.empty());
  BOOST_TEST(!c.fsdp.resolved.empty());
  const Config same = load_config(kLlama,
                                  {"zero_optimization.stage=3", "bf16.enabled=true", "fp16.enabled=false",
                                   "zero_optimization.overlap_comm=true"},
                                  2);
  BOOST_TEST(runtime_of(c) == runtime_of(same));
}

BOOST_AUTO_TEST_CASE(every_sharding_strategy) {
  ferry::test::TempDir dir("fsdp_strategies");
  struct Case {
    json value;
    int stage;
  };
  for (const Case& k : {Case{"FULL_SHARD", 3}, Case{"SHARD_GRAD_OP", 2}, Case{"NO_SHARD", 0}, Case{"full_shard", 3},
                        Case{1, 3}, Case{2, 2}, Case{3, 0}}) {
    const std::string f = write(dir.path / "s.json", json{{"fsdp_sharding_strategy", k.value}});
    const Config c = load_config(kGpt, {}, 2, "", f);
    BOOST_TEST(c.zero.stage == k.stage, k.value.dump());
    BOOST_TEST(c.zero.shard_group_size == 0);
  }
  // No strategy: FSDP's default, FULL_SHARD.
  BOOST_TEST(load_config(kGpt, {}, 2, "", write(dir.path / "d.json", json::object())).zero.stage == 3);
  // Hybrid: sharded within a node; the ranks per node from --set, ferry's file or accelerate's counts.
  for (const auto& [name, stage] : {std::pair<std::string, int>{"HYBRID_SHARD", 3}, {"_HYBRID_SHARD_ZERO2", 2}}) {
    const std::string f = write(dir.path / "h.json", json{{"fsdp_sharding_strategy", name}});
    const std::string e = error_of<ConfigError>([&] { load_config(kGpt, {}, 4, "", f); });
    BOOST_TEST(has(e, f), e);
    BOOST_TEST(has(e, "zero_optimization.shard_group_size"), e);
    const Config c = load_config(kGpt, {"zero_optimization.shard_group_size=2"}, 4, "", f);
    BOOST_TEST(c.zero.stage == stage, name);
    BOOST_TEST(c.zero.shard_group_size == 2);
  }
  const std::string acc = write_text(dir.path / "h.yaml",
                                "distributed_type: FSDP\nnum_machines: 2\nnum_processes: 4\n"
                                "fsdp_config:\n  sharding_strategy: HYBRID_SHARD\n");
  const Config c = load_config(kGpt, {}, 4, "", acc);
  BOOST_TEST(c.zero.stage == 3);
  BOOST_TEST(c.zero.shard_group_size == 2);
  // reshard_after_forward (FSDP2): false at stage 3 keeps the parameters from forward to backward.
  BOOST_TEST(load_config(kGpt, {}, 2, "", write(dir.path / "r.json", json{{"fsdp_reshard_after_forward", false}}))
                 .zero.stage == 2);
  BOOST_TEST(load_config(kGpt, {}, 2, "", write(dir.path / "r.json", json{{"reshard_after_forward", true}}))
                 .zero.stage == 3);
  BOOST_TEST(load_config(kGpt, {}, 2, "",
                         write(dir.path / "r.json", json{{"fsdp_reshard_after_forward", "SHARD_GRAD_OP"}}))
                 .zero.stage == 2);
  const std::string bad = write(dir.path / "b.json", json{{"fsdp_sharding_strategy", "QUARTER_SHARD"}});
  const std::string e = error_of<ConfigError>([&] { load_config(kGpt, {}, 2, "", bad); });
  BOOST_TEST((has(e, bad) && has(e, "fsdp_sharding_strategy") && has(e, "QUARTER_SHARD")), e);
}

BOOST_AUTO_TEST_CASE(offload_moves_what_the_stage_shards) {
  ferry::test::TempDir dir("fsdp_offload");
  const Config full = load_config(kGpt, {}, 2, "", write(dir.path / "f.json", json{{"fsdp_offload_params", true}}));
  BOOST_TEST(full.zero.stage == 3);
  BOOST_TEST(full.offload.optimizer_device == ferry::offload::Tier::cpu);
  BOOST_TEST(full.offload.param_device == ferry::offload::Tier::cpu);
  const Config two = load_config(
      kGpt, {}, 2, "",
      write(dir.path / "t.json", json{{"fsdp_sharding_strategy", "SHARD_GRAD_OP"}, {"fsdp_offload_params", true}}));
  BOOST_TEST(two.zero.stage == 2);
  BOOST_TEST(two.offload.optimizer_device == ferry::offload::Tier::cpu);
  BOOST_TEST(two.offload.param_device == ferry::offload::Tier::device);
  const Config off = load_config(kGpt, {}, 2, "", write(dir.path / "o.json", json{{"offload_params", "false"}}));
  BOOST_TEST(off.offload.optimizer_device == ferry::offload::Tier::device);
  const std::string none =
      write(dir.path / "n.json", json{{"fsdp_sharding_strategy", "NO_SHARD"}, {"fsdp_offload_params", true}});
  const std::string e = error_of<ConfigError>([&] { load_config(kGpt, {}, 2, "", none); });
  BOOST_TEST((has(e, none) && has(e, "fsdp_offload_params")), e);
}

BOOST_AUTO_TEST_CASE(prefetch_is_overlap_comm) {
  ferry::test::TempDir dir("fsdp_prefetch");
  auto overlap = [&](const json& doc) {
    return load_config(kGpt, {}, 2, "", write(dir.path / "p.json", doc)).zero.overlap_comm;
  };
  BOOST_TEST(overlap(json{{"fsdp_backward_prefetch", "BACKWARD_PRE"}}));
  BOOST_TEST(overlap(json{{"fsdp_backward_prefetch_policy", "BACKWARD_POST"}}));
  BOOST_TEST(!overlap(json{{"fsdp_backward_prefetch", "NO_PREFETCH"}}));
  BOOST_TEST(!overlap(json{{"backward_prefetch", nullptr}, {"forward_prefetch", false}}));
  BOOST_TEST(overlap(json{{"fsdp_backward_prefetch", "NO_PREFETCH"}, {"fsdp_forward_prefetch", true}}));
  BOOST_TEST(overlap(json{{"fsdp_forward_prefetch", true}}));
  BOOST_TEST(overlap(json{{"fsdp_forward_prefetch", false}}));  // ferry's default stands
  const std::string bad = write(dir.path / "b.json", json{{"fsdp_backward_prefetch", "SIDEWAYS"}});
  const std::string e = error_of<ConfigError>([&] { load_config(kGpt, {}, 2, "", bad); });
  BOOST_TEST((has(e, bad) && has(e, "fsdp_backward_prefetch")), e);
  const std::string both =
      write(dir.path / "2.json", json{{"fsdp_backward_prefetch", "BACKWARD_PRE"}, {"backward_prefetch_policy", "NO_PREFETCH"}});
  BOOST_TEST(has(error_of<ConfigError>([&] { load_config(kGpt, {}, 2, "", both); }), "set it once"));
}

BOOST_AUTO_TEST_CASE(mixed_precision_names) {
  ferry::test::TempDir dir("fsdp_precision");
  for (const char* n : {"BFLOAT16", "bf16", "bfloat16"}) {
    const Config c = load_config(kGpt, {}, 1, "", write(dir.path / "m.json", json{{"fsdp_mixed_precision", n}}));
    BOOST_TEST((c.bf16 && !c.fp16), n);
  }
  for (const char* n : {"FP16", "fp16"}) {
    const Config c = load_config(kGpt, {}, 1, "", write(dir.path / "m.json", json{{"fsdp_mixed_precision", n}}));
    BOOST_TEST((!c.bf16 && c.fp16), n);
  }
  for (const char* n : {"no", "FP32"}) {
    const Config c = load_config(kGpt, {}, 1, "", write(dir.path / "m.json", json{{"mixed_precision", n}}));
    BOOST_TEST((!c.bf16 && !c.fp16), n);
  }
  const std::string fp8 = write_text(dir.path / "8.yaml", "distributed_type: FSDP\nmixed_precision: fp8\nfsdp_config: {}\n");
  BOOST_TEST(has(error_of<ConfigError>([&] { load_config(kGpt, {}, 1, "", fp8); }), "mixed_precision"));
  const std::string clash = write_text(dir.path / "c.yaml",
                                  "distributed_type: FSDP\nmixed_precision: fp16\n"
                                  "fsdp_config:\n  fsdp_mixed_precision: bf16\n");
  const std::string e = error_of<ConfigError>([&] { load_config(kGpt, {}, 1, "", clash); });
  BOOST_TEST((has(e, clash) && has(e, "set it once")), e);
  // A key ferry's file sets differently: both named, as with --deepspeed.
  ferry::test::TempDir d2("fsdp_conflict");
  json doc = json::parse(std::ifstream(kGpt));
  doc["data"]["path"] = kSource + "/examples/data/kjv.txt";
  doc["bf16"] = {{"enabled", false}};
  const std::string ferry_file = write(d2.path / "ferry.json", doc);
  const std::string f = write(d2.path / "f.json", json{{"fsdp_mixed_precision", "bf16"}});
  const std::string c2 = error_of<ConfigError>([&] { load_config(ferry_file, {}, 1, "", f); });
  BOOST_TEST((has(c2, "bf16.enabled") && has(c2, ferry_file) && has(c2, "set it in one file")), c2);
  // --set applies last.
  BOOST_TEST(!load_config(kGpt, {"bf16.enabled=false"}, 1, "", f).bf16);
}

BOOST_AUTO_TEST_CASE(activation_checkpointing_and_matching_keys) {
  ferry::test::TempDir dir("fsdp_ac");
  const Config c = load_config(kGpt, {}, 1, "",
                               write(dir.path / "a.json", json{{"fsdp_activation_checkpointing", true},
                                                               {"fsdp_state_dict_type", "FULL_STATE_DICT"},
                                                               {"fsdp_cpu_ram_efficient_loading", false},
                                                               {"fsdp_auto_wrap_policy", "SIZE_BASED_WRAP"},
                                                               {"fsdp_min_num_params", 100000},
                                                               {"fsdp_version", 2},
                                                               {"xla", false}}));
  BOOST_TEST(c.activation_checkpointing);
  for (const char* k : {"fsdp_auto_wrap_policy", "fsdp_min_num_params", "fsdp_version", "xla"}) {
    BOOST_TEST(contains(c.fsdp.ignored, k), k);
  }
  const std::string v3 = write(dir.path / "v.json", json{{"fsdp_version", 3}});
  BOOST_TEST(has(error_of<ConfigError>([&] { load_config(kGpt, {}, 1, "", v3); }), "fsdp_version"));
}

BOOST_AUTO_TEST_CASE(layer_class_must_be_the_models_block) {
  // The example names Llama's and Mistral's classes: fine for Llama, not for GPT-2.
  BOOST_TEST(load_config(kLlama, {}, 1, "", kJson).zero.stage == 3);
  const std::string e = error_of<ConfigError>([&] { load_config(kGpt, {}, 1, "", kJson); });
  BOOST_TEST((has(e, kJson) && has(e, "LlamaDecoderLayer") && has(e, "GPT2Block")), e);
  ferry::test::TempDir dir("fsdp_cls");
  BOOST_TEST(load_config(kGpt, {}, 1, "", write(dir.path / "g.json", json{{"transformer_layer_cls_to_wrap", "GPT2Block"}}))
                 .zero.stage == 3);
  const std::string m = write_text(dir.path / "m.yaml",
                              "distributed_type: FSDP\nfsdp_config:\n  transformer_layer_cls_to_wrap: "
                              "MistralDecoderLayer, Qwen2DecoderLayer\n");
  BOOST_TEST(has(error_of<ConfigError>([&] { load_config(kLlama, {}, 1, "", m); }), "MistralDecoderLayer, Qwen2DecoderLayer"));
  BOOST_TEST(load_config(kLlama, {"model.arch=qwen2"}, 1, "", m).zero.stage == 3);
  BOOST_TEST(fsdp_block_class("mistral") == "MistralDecoderLayer");
}

BOOST_AUTO_TEST_CASE(unknown_keys_are_refused) {
  ferry::test::TempDir dir("fsdp_unknown");
  const std::string f = write(dir.path / "u.json", json{{"fsdp_sharding_strategy", "FULL_SHARD"}, {"fsdp_shard_everything", true}});
  const std::string e = error_of<ConfigError>([&] { load_config(kGpt, {}, 1, "", f); });
  BOOST_TEST((has(e, f) && has(e, "fsdp_shard_everything")), e);
  const std::string y = write_text(dir.path / "u.yaml", "distributed_type: FSDP\nfsdp_config: {}\nmagic_speedup: true\n");
  const std::string ey = error_of<ConfigError>([&] { load_config(kGpt, {}, 1, "", y); });
  BOOST_TEST((has(ey, y) && has(ey, "magic_speedup")), ey);
  const std::string ddp = write_text(dir.path / "d.yaml", "distributed_type: MULTI_GPU\nfsdp_config: {}\n");
  BOOST_TEST(has(error_of<ConfigError>([&] { load_config(kGpt, {}, 1, "", ddp); }), "distributed_type"));
  const std::string ds = kSource + "/examples/deepspeed/zero2_cpu_offload.json";
  BOOST_TEST(has(error_of<ConfigError>([&] { load_config(kGpt, {}, 1, ds, kJson); }), "--deepspeed"));
}

BOOST_AUTO_TEST_CASE(malformed_files_name_the_file_and_key) {
  ferry::test::TempDir dir("fsdp_malformed");
  struct Case {
    std::string name, text, part;
  };
  for (const Case& k : {Case{"a.json", "{\"fsdp_offload_params\": tru", "not valid JSON"},
                        Case{"b.yaml", "fsdp_config:\n  sharding_strategy: [FULL_SHARD\n", "not valid YAML"},
                        Case{"c.json", "[1, 2]", "mapping"},
                        Case{"d.json", "{\"fsdp_offload_params\": 3}", "fsdp_offload_params"},
                        Case{"e.json", "{\"fsdp_sharding_strategy\": {\"a\": 1}}", "fsdp_sharding_strategy"},
                        Case{"f.json", "{\"fsdp_transformer_layer_cls_to_wrap\": [1]}", "fsdp_transformer_layer_cls_to_wrap"},
                        Case{"g.yaml", "distributed_type: FSDP\nfsdp_config: 7\n", "fsdp_config"},
                        Case{"h.yaml", "distributed_type: FSDP\nfsdp_config: {}\nnum_processes: two\n", "num_processes"},
                        Case{"i.json", "   \n", "empty"},
                        Case{"j.yaml", "- just\n- a list\n", "mapping"}}) {
    const std::string f = write_text(dir.path / k.name, k.text);
    const std::string e = error_of<ConfigError>([&] { load_config(kGpt, {}, 1, "", f); });
    BOOST_TEST((has(e, f) && has(e, k.part)), k.name + ": " + e);
  }
  const std::string missing = (dir.path / "nope.json").string();
  BOOST_TEST(has(error_of<ConfigError>([&] { load_config(kGpt, {}, 1, "", missing); }), "cannot open"));
  // Aliases of aliases: 12 lines that expand to 10^12 nodes are refused at once, and
  // nesting deeper than the parser's limit is an error, not a stack overflow.
  std::string bomb = "a0: &a0 [1,1,1,1,1,1,1,1,1,1]\n";
  for (int i = 1; i < 12; ++i) {
    const std::string n = std::to_string(i), prev = std::to_string(i - 1);
    bomb.append("a").append(n).append(": &a").append(n).append(" [");
    for (int j = 0; j < 10; ++j) bomb.append(j ? ",*a" : "*a").append(prev);
    bomb.append("]\n");
  }
  bomb += "fsdp_config:\n  x: *a11\n";
  const std::string b = write_text(dir.path / "bomb.yaml", bomb);
  BOOST_TEST(has(error_of<ConfigError>([&] { load_config(kGpt, {}, 1, "", b); }), "YAML expands to more than"));
  // A long string repeated through aliases stays under the node budget: the text budget
  // stops it (4 KB of YAML, 320 MB expanded); bytes that are not UTF-8 are named by line.
  std::string text = "&a \"" + std::string(4000, 'x') + "\"";
  for (const char* names : {"ba", "cb", "dc", "ed"}) {
    std::string next = "&";
    next.append(1, names[0]).append(" [").append(text);
    for (int j = 0; j < 9; ++j) next.append(", *").append(1, names[1]);
    text = next.append("]");
  }
  const std::string bytes = write_text(dir.path / "bytes.yaml", "fsdp_offload_params: &f [" + text + ", *e]\n");
  BOOST_TEST(has(error_of<ConfigError>([&] { load_config(kGpt, {}, 1, "", bytes); }), "MiB of text"));
  const std::string latin = write_text(dir.path / "latin.yaml", "fsdp_offload_params: \xff\n");
  BOOST_TEST(has(error_of<ConfigError>([&] { load_config(kGpt, {}, 1, "", latin); }), latin + ": line 1, column 22: not UTF-8 text"));
  std::string nested = "fsdp_config:\n  x: ";
  nested.append(100000, '[').append(100000, ']').append("\n");
  const std::string deep = write_text(dir.path / "deep.yaml", nested);
  BOOST_TEST(has(error_of<ConfigError>([&] { load_config(kGpt, {}, 1, "", deep); }), deep));
}

BOOST_AUTO_TEST_CASE(accelerate_yaml_with_and_without_prefix) {
  const Config c = load_config(kLlama, {}, 2, "", kYaml);
  BOOST_TEST(c.zero.stage == 3);
  BOOST_TEST(c.bf16);
  BOOST_TEST(c.zero.overlap_comm);
  BOOST_TEST(!c.activation_checkpointing);
  BOOST_TEST(c.fsdp.warnings.empty());
  for (const char* k : {"compute_environment", "fsdp_config.fsdp_use_orig_params", "machine_rank", "downcast_bf16"}) {
    BOOST_TEST(contains(c.fsdp.ignored, k), k);
  }
  // The same without the prefix.
  ferry::test::TempDir dir("fsdp_yaml");
  std::ifstream in(kYaml);
  std::string text, line;
  while (std::getline(in, line)) {
    const size_t at = line.find("  fsdp_");
    if (at == 0) line.erase(2, 5);
    text += line;
    text += '\n';
  }
  BOOST_TEST(!has(text, "  fsdp_"));
  const Config bare = load_config(kLlama, {}, 2, "", write_text(dir.path / "bare.yaml", text));
  BOOST_TEST(runtime_of(bare) == runtime_of(c));
  // num_processes other than the world size: a warning, the run's ranks apply.
  const Config one = load_config(kLlama, {}, 1, "", kYaml);
  BOOST_TEST(one.fsdp.warnings.size() == 1u);
  BOOST_TEST(has(one.fsdp.warnings[0], "num_processes"));
  BOOST_TEST(one.world_size == 1);
  // PyYAML's unquoted no is false: read as mixed_precision "no".
  const std::string no = write_text(dir.path / "no.yaml",
                               "distributed_type: FSDP\nmixed_precision: no\nfsdp_config:\n  fsdp_offload_params: true\n");
  const Config n = load_config(kGpt, {}, 1, "", no);
  BOOST_TEST((!n.bf16 && !n.fp16 && n.offload.param_device == ferry::offload::Tier::cpu));
}

BOOST_AUTO_TEST_CASE(trainer_string_form) {
  BOOST_TEST(is_fsdp_trainer_string("full_shard auto_wrap offload"));
  BOOST_TEST(!is_fsdp_trainer_string("full_shard auto_wrap turbo"));
  BOOST_TEST(!is_fsdp_trainer_string(""));
  const Config c = load_config(kGpt, {}, 2, "", "full_shard auto_wrap offload");
  BOOST_TEST(c.zero.stage == 3);
  BOOST_TEST(c.offload.optimizer_device == ferry::offload::Tier::cpu);
  BOOST_TEST(c.offload.param_device == ferry::offload::Tier::cpu);
  BOOST_TEST(load_config(kGpt, {}, 2, "", "shard_grad_op").zero.stage == 2);
  BOOST_TEST(load_config(kGpt, {}, 2, "", "no_shard auto_wrap").zero.stage == 0);
  const Config h = load_config(kGpt, {"zero_optimization.shard_group_size=2"}, 4, "", "hybrid_shard_zero2");
  BOOST_TEST((h.zero.stage == 2 && h.zero.shard_group_size == 2));
  BOOST_TEST(has(error_of<ConfigError>([&] { load_config(kGpt, {}, 2, "", "full_shard shard_grad_op"); }), "two sharding"));
  // Not the Trainer's words and not a file: a missing file.
  BOOST_TEST(has(error_of<ConfigError>([&] { load_config(kGpt, {}, 2, "", "full_shard turbo"); }), "cannot open"));
}

// Issue 37: a Trainer fsdp_config of 2025 (FSDP2 keys, fsdp_cuda_graphs) runs; every key is
// applied (with what it did), listed as ignored, or refused.
BOOST_AUTO_TEST_CASE(trainer_fsdp2_file_every_key_accounted) {
  const std::string file = kSource + "/tests/data/user_files/configs/trainer_fsdp_config.json";
  const Config c = load_config(kGpt, {}, 2, "", file);
  BOOST_TEST(c.zero.stage == 3);
  BOOST_TEST(c.zero.overlap_comm);
  for (const char* k : {"fsdp_cuda_graphs", "fsdp_version", "fsdp_use_orig_params", "fsdp_sync_module_states"}) {
    BOOST_TEST(contains(c.fsdp.ignored, k), k);
  }
  BOOST_TEST(c.fsdp.ignored.size() == 4u);
  const json doc = json::parse(std::ifstream(file));
  for (const auto& item : doc.items()) {
    const std::string key = item.key();  // not a structured binding: the lambda below captures it (clang 14)
    const bool listed = contains(c.fsdp.ignored, key) ||
                        std::any_of(c.fsdp.resolved.begin(), c.fsdp.resolved.end(),
                                    [&](const std::string& line) { return line.starts_with(key + " = "); });
    BOOST_TEST(listed, key);
  }
  BOOST_TEST(contains(c.fsdp.resolved, "fsdp_reshard_after_forward = true -> zero_optimization.stage = 3 (parameters "
                                       "freed after forward, gathered again in backward)"));
  ferry::test::TempDir dir("fsdp_issue37");
  // CUDA graphs replay the same kernels on the same data: true is ignored too.
  BOOST_TEST(contains(load_config(kGpt, {}, 2, "", write(dir.path / "g.json", json{{"fsdp_cuda_graphs", true}})).fsdp.ignored,
                      "fsdp_cuda_graphs"));
  const Config r = load_config(kGpt, {}, 2, "", write(dir.path / "r.json", json{{"fsdp_reshard_after_forward", false}}));
  BOOST_TEST(contains(r.fsdp.resolved, "fsdp_reshard_after_forward = false -> zero_optimization.stage = 2 (parameters "
                                       "stay gathered from forward to backward, as SHARD_GRAD_OP)"));
  const std::string both = write(dir.path / "b.json", json{{"fsdp_reshard_after_forward", true}, {"fsdp_sharding_strategy", "SHARD_GRAD_OP"}});
  const std::string e = error_of<ConfigError>([&] { load_config(kGpt, {}, 2, "", both); });
  BOOST_TEST(has(e, both + ": key 'fsdp_reshard_after_forward': true frees parameters after forward (FULL_SHARD), but "
                           "fsdp_sharding_strategy keeps them (stage 2)"), e);
  // FSDP2's MixedPrecisionPolicy: the parameters' dtype computes; reductions stay fp32.
  const Config m = load_config(kGpt, {}, 2, "", write(dir.path / "m.json", json{{"mixed_precision_policy",
                                                                                 {{"param_dtype", "bfloat16"}, {"reduce_dtype", "float32"}}}}));
  BOOST_TEST(m.bf16);
  const std::string low = write(dir.path / "low.json", json{{"mixed_precision_policy", {{"param_dtype", "bfloat16"}, {"reduce_dtype", "bfloat16"}}}});
  BOOST_TEST(has(error_of<ConfigError>([&] { load_config(kGpt, {}, 2, "", low); }),
                 low + ": key 'mixed_precision_policy.reduce_dtype': ferry reduces gradients and returns outputs in fp32 only"));
}
