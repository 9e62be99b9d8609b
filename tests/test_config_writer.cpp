// ferry config (runtime/tools/config_writer.h): the DeepSpeed and ferry documents written for
// sets of choices, in DeepSpeed's key names, "auto" where no flag chose; the illegal
// combinations refused naming the flag; and what is written loads through ferry's loader
// to the chosen values.
#define BOOST_TEST_MODULE config_writer
#include <boost/test/unit_test.hpp>

#include <fstream>

#include "runtime/config/config.h"
#include "runtime/tools/config_writer.h"
#include "test_util.h"

using namespace ferry::runtime;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kTinyModel = std::string(FERRY_SOURCE_DIR) + "/examples/configs/tiny-model.json";

std::string refusal(const ConfigChoices& c, bool deepspeed = true) {
  try {
    if (deepspeed)
      deepspeed_config(c);
    else
      ferry_config(c);
  } catch (const ConfigError& e) {
    return e.what();
  }
  BOOST_FAIL("no refusal");
  return "";
}

std::string write(const fs::path& p, const nlohmann::ordered_json& doc) {
  std::ofstream(p) << doc.dump(2);
  return p.string();
}

}  // namespace

BOOST_AUTO_TEST_CASE(zero2_cpu_offload_bf16_in_deepspeed_names) {
  ConfigChoices c;
  c.zero_stage = 2;
  c.offload_optimizer = "cpu";
  c.bf16 = true;
  const json d = json::parse(deepspeed_config(c).doc.dump());
  BOOST_TEST(d["zero_optimization"]["stage"] == 2);
  BOOST_TEST(d["zero_optimization"]["offload_optimizer"] ==
             (json{{"device", "cpu"}, {"pin_memory", true}}));
  BOOST_TEST(!d["zero_optimization"].contains("offload_param"));
  BOOST_TEST(d["bf16"]["enabled"] == true);
  BOOST_TEST(d["fp16"]["enabled"] == false);
  // What no flag chose is Hugging Face's "auto".
  for (const char* key : {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                          "train_batch_size", "gradient_clipping"}) {
    BOOST_TEST(d[key] == "auto", key);
  }
  BOOST_TEST(d["optimizer"]["type"] == "AdamW");
  BOOST_TEST(d["optimizer"]["params"] ==
             (json{{"lr", "auto"}, {"betas", "auto"}, {"eps", "auto"}, {"weight_decay", "auto"}}));
  BOOST_TEST(!d.contains("scheduler"));
}

BOOST_AUTO_TEST_CASE(chosen_values_are_written_and_load_as_chosen) {
  ferry::test::TempDir dir("config_writer");
  ConfigChoices c;
  c.zero_stage = 3;
  c.offload_optimizer = "nvme";
  c.offload_param = "nvme";
  c.nvme_path = dir.path.string();
  c.micro_batch = 4;
  c.grad_accum = 16;
  c.clip = 0.3;
  c.lr = 3e-4;
  c.weight_decay = 0.1;
  c.warmup_steps = 10;
  c.fp16 = true;
  const WrittenConfig w = deepspeed_config(c);
  const json d = json::parse(w.doc.dump());
  BOOST_TEST(d["train_micro_batch_size_per_gpu"] == 4);
  BOOST_TEST(d["gradient_accumulation_steps"] == 16);
  BOOST_TEST(d["gradient_clipping"] == 0.3);
  BOOST_TEST(d["optimizer"]["params"]["lr"] == 3e-4);
  BOOST_TEST(d["optimizer"]["params"]["weight_decay"] == 0.1);
  BOOST_TEST(d["scheduler"]["type"] == "WarmupDecayLR");
  BOOST_TEST(d["scheduler"]["params"]["warmup_num_steps"] == 10);
  BOOST_TEST(d["scheduler"]["params"]["warmup_max_lr"] == 3e-4);
  BOOST_TEST(d["scheduler"]["params"]["total_num_steps"] == "auto");
  BOOST_TEST(d["fp16"]["enabled"] == true);
  BOOST_TEST(d["fp16"]["loss_scale"] == 0);
  BOOST_TEST(d["bf16"]["enabled"] == false);
  for (const char* part : {"offload_optimizer", "offload_param"}) {
    BOOST_TEST(d["zero_optimization"][part]["device"] == "nvme");
    BOOST_TEST(d["zero_optimization"][part]["nvme_path"] ==
               fs::absolute(dir.path).lexically_normal().string());
  }
  // Each choice is reported, the autos with what ferry makes of them.
  const auto reported = [&](const std::string& line) {
    return std::find(w.choices.begin(), w.choices.end(), line) != w.choices.end();
  };
  BOOST_TEST(reported("gradient_accumulation_steps = 16"));
  BOOST_TEST(reported(
      "train_batch_size = \"auto\"  (ferry resolves: micro batch x accumulation x ranks)"));

  // The file, beside the tiny ferry file, loads to what was chosen.
  const Config cfg = load_config(kTinyModel, {}, 1, write(dir.path / "ds.json", w.doc));
  BOOST_TEST(cfg.zero.stage == 3);
  BOOST_TEST(cfg.offload.optimizer_device == ferry::offload::Tier::nvme);
  BOOST_TEST(cfg.offload.param_device == ferry::offload::Tier::nvme);
  BOOST_TEST(cfg.micro_batch == 4);
  BOOST_TEST(cfg.grad_accum == 16);
  BOOST_TEST(cfg.grad_clip == 0.3);
  BOOST_TEST(cfg.optimizer.lr == 3e-4);
  BOOST_TEST(cfg.fp16);
  BOOST_TEST(cfg.scheduler.total_num_steps == cfg.train.steps);
}

BOOST_AUTO_TEST_CASE(schedulers_take_their_own_parameters) {
  ConfigChoices c;
  c.warmup_steps = 5;
  c.scheduler = "WarmupLR";
  json d = json::parse(deepspeed_config(c).doc.dump());
  BOOST_TEST(!d["scheduler"]["params"].contains("total_num_steps"));
  BOOST_TEST(d["scheduler"]["params"]["warmup_max_lr"] == "auto");
  c.scheduler = "WarmupCosineLR";
  d = json::parse(deepspeed_config(c).doc.dump());
  BOOST_TEST(d["scheduler"]["params"].contains("warmup_min_ratio"));
  BOOST_TEST(!d["scheduler"]["params"].contains("warmup_max_lr"));
}

BOOST_AUTO_TEST_CASE(shard_group_size_is_mics_shard_size) {
  ConfigChoices c;
  c.zero_stage = 3;
  c.shard_group_size = 4;
  const json d = json::parse(deepspeed_config(c).doc.dump());
  BOOST_TEST(d["zero_optimization"]["mics_shard_size"] == 4);
}

BOOST_AUTO_TEST_CASE(illegal_combinations_are_refused_naming_the_flag) {
  const auto check = [](ConfigChoices c, const std::string& expected) {
    const std::string e = refusal(c);
    BOOST_TEST(e.find(expected) != std::string::npos, e);
  };
  ConfigChoices c;
  c.zero_stage = 2;
  c.offload_param = "cpu";
  check(c, "--offload-param cpu needs --zero-stage 3");
  c = {};
  c.zero_stage = 0;
  c.offload_optimizer = "cpu";
  check(c, "needs --zero-stage 1, 2 or 3");
  c = {};
  c.zero_stage = 3;
  c.offload_optimizer = "nvme";
  check(c, "needs --nvme-path");
  c = {};
  c.nvme_path = "/tmp";
  check(c, "--nvme-path is used only with");
  c = {};
  c.bf16 = c.fp16 = true;
  check(c, "--bf16 and --fp16");
  for (int stage : {-1, 4}) {
    c = {};
    c.zero_stage = stage;
    check(c, "stages are 0, 1, 2 and 3");
  }
  c = {};
  c.zero_stage = 0;
  c.shard_group_size = 2;
  check(c, "stage 0 shards nothing");
  c = {};
  c.scheduler = "WarmupLR";
  check(c, "needs --warmup-steps");
}

BOOST_AUTO_TEST_CASE(ferry_file_holds_model_data_and_what_was_chosen) {
  ConfigChoices c;
  c.data = std::string(FERRY_SOURCE_DIR) + "/examples/data/kjv.txt";
  c.zero_stage = 1;
  c.offload_optimizer = "cpu";
  c.steps = 7;
  c.lr = 2e-3;
  const json d = json::parse(ferry_config(c).doc.dump());
  BOOST_TEST(d["model"]["n_embd"] == 128);
  BOOST_TEST(d["data"]["path"] == c.data);
  BOOST_TEST(d["train"]["steps"] == 7);
  BOOST_TEST(d["optimizer"]["params"] == (json{{"lr", 2e-3}}));
  BOOST_TEST(d["zero_optimization"]["stage"] == 1);
  // No "auto" in a ferry file: what no flag chose is ferry's default.
  BOOST_TEST(!d.contains("gradient_clipping"));
  BOOST_TEST(!d.contains("bf16"));
  BOOST_TEST(d.dump().find("auto") == std::string::npos);

  c.model = "llama-tiny";
  BOOST_TEST(json::parse(ferry_config(c).doc.dump())["model"] == (json{{"preset", "llama-tiny"}}));
  c.model = "no-such-model";
  BOOST_TEST(refusal(c, false).find("model.preset") != std::string::npos);
  c.model = "";
  c.data = "";
  BOOST_TEST(refusal(c, false).find("--data PATH is required") != std::string::npos);
}
