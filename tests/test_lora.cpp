// LoRA adapters end to end (docs/guide/adapters.md), against the PEFT fixtures in
// tests/data/peft/ (peft 0.21.2, scripts/peft_fixtures/make_fixtures.py):
// - a PEFT adapter read through model.adapter_from gives PEFT's logits and loss, on Llama
//   (every projection, q/k/v and gate/up pieces of ferry's packed weights), Qwen2 (rsLoRA,
//   biases), GPT-2 (Conv1D) and with the head saved in full (modules_to_save);
// - five AdamW steps from it give PEFT's losses and trained adapters;
// - every stage and placement (optimizer and parameters on the device, cpu, nvme), fp32 and
//   bf16, gives the same losses bit for bit, and the frozen base never changes;
// - a checkpoint holds the adapters only, resumes bit for bit, exports as a PEFT folder
//   byte for byte what was loaded, and as a merged Hugging Face folder;
// - what ferry cannot do with adapters is refused by name.
#define BOOST_TEST_MODULE lora
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>

#include "comm/communicator.h"
#include "nn/cpu_device.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/ckpt/export.h"
#include "runtime/ckpt/safetensors.h"
#include "runtime/hf/hf_export.h"
#include "runtime/hf/hf_weights.h"
#include "runtime/hf/peft.h"
#include "runtime/train/trainer.h"
#include "error_of.h"
#include "test_util.h"
#include "zero_placements.h"

using namespace ferry;
using nlohmann::json;
namespace fs = std::filesystem;
using ferry::test::error_of;

namespace {

const std::string kRoot = std::string(FERRY_SOURCE_DIR) + "/tests/data/";

struct Case {
  const char* adapter;
  const char* base;
};
const Case kCases[] = {{"llama3-all", "llama3"}, {"qwen2-qv", "qwen2"}, {"gpt2-all", "gpt2"}, {"llama3-save-head", "llama3"}};

json doc(const std::string& base, int64_t steps = 0) {
  return {{"model", {{"init_from", kRoot + "hf/" + base}, {"block_size", 16}}},
          {"data", {{"path", kRoot + "kjv-64k.txt"}}},
          {"device", {{"memory", "256MiB"}, {"threads", 1}}},
          {"train_micro_batch_size_per_gpu", 2},
          {"optimizer", {{"params", {{"lr", 0.01}, {"weight_decay", 0.0}}}}},
          {"train", {{"steps", steps}, {"eval_every", 0}, {"eval_batches", 1}, {"sample_tokens", 0}}}};
}

runtime::Config config(const json& d, const std::vector<std::string>& sets = {}) {
  return runtime::config_from_json(d, "test.json", "", sets, 1);
}

std::map<std::string, std::vector<float>> f32_tensors(const std::string& path) {
  runtime::SafetensorsReader r(path);
  std::map<std::string, std::vector<float>> out;
  for (const auto& e : r.entries()) {
    const std::vector<char> b = r.read(e);
    std::vector<float> v(b.size() / 4);
    if (e.dtype == "F32") std::memcpy(v.data(), b.data(), b.size());
    if (e.dtype == "I32") {
      for (size_t i = 0; i < v.size(); ++i) {
        int32_t x = 0;
        std::memcpy(&x, b.data() + 4 * i, 4);
        v[i] = static_cast<float>(x);
      }
    }
    out[e.name] = v;
  }
  return out;
}

// A model of `c` resident on `dev`, filled as the trainer fills it: the base folder, then
// the adapter folder.
struct Loaded {
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<nn::ResidentUnits> units;
};
Loaded load(const runtime::Config& c, nn::Device& dev) {
  Loaded m;
  m.model = runtime::make_model(c, dev);
  m.units = std::make_unique<nn::ResidentUnits>(dev, nn::DType::f32, m.model->units());
  runtime::HfWeights base(c.init_from, c.resolved.at("model"), m.model->units());
  runtime::PeftWeights adapters(c.adapter_from, c.resolved.at("model"), m.model->units(), m.model->lora());
  for (int u = 0; u < m.model->num_units(); ++u) {
    const nn::Tensor& t = m.units->weights[static_cast<size_t>(u)];
    base.fill(u, 0, t.numel(), t.data_as<float>());
    adapters.fill(u, 0, t.numel(), t.data_as<float>());
  }
  return m;
}

struct Batch {
  nn::Tensor tokens, targets;
};
Batch batch(nn::Device& dev, const std::map<std::string, std::vector<float>>& e) {
  Batch b{nn::Tensor::empty(dev, nn::DType::i32, {32}), nn::Tensor::empty(dev, nn::DType::i32, {32})};
  for (int i = 0; i < 32; ++i) {
    b.tokens.data_as<int32_t>()[i] = static_cast<int32_t>(e.at("input_ids")[static_cast<size_t>(i)]);
    b.targets.data_as<int32_t>()[i] = static_cast<int32_t>(e.at("targets")[static_cast<size_t>(i)]);
  }
  return b;
}

double worst_rel(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0, scale = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(got.at(i)) - want[i]));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return worst / scale;
}

std::vector<double> losses(const runtime::Config& c, runtime::TrainReport* report = nullptr) {
  comm::SingleProcessCommunicator one;
  std::ostream discard(nullptr);
  runtime::Trainer t(c, one, discard);
  const runtime::TrainReport r = t.run();
  if (report) *report = r;
  std::vector<double> out;
  for (const auto& s : r.steps) out.push_back(s.loss);
  return out;
}

std::map<std::string, std::string> file_bytes(const std::string& path) {
  runtime::SafetensorsReader r(path);
  std::map<std::string, std::string> out;
  for (const auto& e : r.entries()) {
    const std::vector<char> b = r.read(e);
    out[e.name] = e.dtype + nn::shape_str(e.shape) + std::string(b.begin(), b.end());
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_peft_adapter_gives_peft_logits_and_loss) {
  nn::CpuDevice dev(size_t{256} << 20, 1);
  for (const Case& k : kCases) {
    BOOST_TEST_CONTEXT(k.adapter) {
      const runtime::Config c = config(doc(k.base), {"model.adapter_from=" + kRoot + "peft/" + k.adapter});
      BOOST_TEST(c.lora.r > 0);
      Loaded m = load(c, dev);
      const auto e = f32_tensors(kRoot + "peft/" + k.adapter + "/expected.safetensors");
      const auto in = f32_tensors(kRoot + "hf/" + k.base + "/expected.safetensors");
      const Batch b = batch(dev, in);
      const double loss = m.model->forward(*m.units, b.tokens, b.targets, 2, 16);
      m.model->forward(*m.units, b.tokens, nn::Tensor{}, 2, 16);
      const nn::Tensor& logits = m.model->logits();
      const std::vector<float> got(logits.data_as<float>(), logits.data_as<float>() + logits.numel());
      const double rel = worst_rel(got, e.at("logits"));
      BOOST_TEST_MESSAGE(k.adapter << ": logits within " << rel << " of PEFT's (relative to the largest), loss " << loss
                                   << " vs " << e.at("loss")[0]);
      BOOST_TEST(rel <= 1e-5);
      BOOST_TEST(std::abs(loss - e.at("loss")[0]) <= 1e-5 * e.at("loss")[0]);
      // The adapter changes the model: the base alone is far from these logits.
      const auto base = f32_tensors(kRoot + "hf/" + k.base + "/expected.safetensors");
      BOOST_TEST(worst_rel(base.at("logits"), e.at("logits")) > 1e-3);
    }
  }
}

// What a stage-3 rank fills, a range of a unit, reads only that range's bytes (pread) and
// gives what the whole read gives, in chunks that cut tensors anywhere (the saved head too).
BOOST_AUTO_TEST_CASE(an_adapter_read_by_ranges_equals_the_whole_read) {
  nn::CpuDevice dev(size_t{256} << 20, 1);
  for (const Case& k : kCases) {
    BOOST_TEST_CONTEXT(k.adapter) {
      const runtime::Config c = config(doc(k.base), {"model.adapter_from=" + kRoot + "peft/" + k.adapter});
      const auto model = runtime::make_model(c, dev);
      runtime::PeftWeights adapters(c.adapter_from, c.resolved.at("model"), model->units(), model->lora());
      for (int u = 0; u < model->num_units(); ++u) {
        const int64_t n = model->units()[static_cast<size_t>(u)].numel;
        std::vector<float> whole(static_cast<size_t>(n), -7.0f), pieces = whole;
        adapters.fill(u, 0, n, whole.data());
        for (int64_t at = 0; at < n; at += 37) adapters.fill(u, at, std::min<int64_t>(37, n - at), pieces.data() + at);
        BOOST_TEST(pieces == whole, "unit " << u);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(five_adamw_steps_give_peft_losses_and_adapters) {
  nn::CpuDevice dev(size_t{256} << 20, 1);
  for (const Case& k : kCases) {
    BOOST_TEST_CONTEXT(k.adapter) {
      const runtime::Config c = config(doc(k.base), {"model.adapter_from=" + kRoot + "peft/" + k.adapter});
      Loaded m = load(c, dev);
      const auto e = f32_tensors(kRoot + "peft/" + k.adapter + "/expected.safetensors");
      const Batch b = batch(dev, f32_tensors(kRoot + "hf/" + k.base + "/expected.safetensors"));
      const std::vector<nn::UnitSpec>& units = m.model->units();
      std::vector<nn::Tensor> mom, vel;
      for (size_t u = 0; u < units.size(); ++u) {
        const int64_t n = units[u].trainable_numel;
        mom.push_back(n > 0 ? nn::Tensor::empty(dev, nn::DType::f32, {n}) : nn::Tensor{});
        vel.push_back(n > 0 ? nn::Tensor::empty(dev, nn::DType::f32, {n}) : nn::Tensor{});
        if (n > 0) dev.fill(mom.back(), 0.0), dev.fill(vel.back(), 0.0);
      }
      for (int step = 1; step <= 5; ++step) {
        m.units->zero_grads();
        const double loss = m.model->forward(*m.units, b.tokens, b.targets, 2, 16);
        BOOST_TEST(std::abs(loss - e.at("train_losses")[static_cast<size_t>(step - 1)]) <= 1e-4 * loss,
                   "step " << step << ": " << loss << " vs PEFT's " << e.at("train_losses")[static_cast<size_t>(step - 1)]);
        m.model->backward(*m.units);
        for (size_t u = 0; u < units.size(); ++u) {
          if (!m.units->grads[u].defined()) continue;
          nn::AdamWStep s;
          s.step = step;
          s.lr = 1e-2;
          dev.adamw(m.units->weights[u].view(0, {units[u].trainable_numel}), m.units->grads[u], mom[u], vel[u], s);
        }
      }
      // The trained adapters (and saved modules) against PEFT's after its five steps.
      int compared = 0;
      double worst = 0;
      for (const nn::LoraAdapter& a : m.model->lora()) {
        for (bool is_b : {false, true}) {
          const nn::TensorSpec& t = units[static_cast<size_t>(a.unit)].tensors[is_b ? a.b : a.a];
          const nn::Tensor w = units[static_cast<size_t>(a.unit)].view(m.units->weights[static_cast<size_t>(a.unit)], is_b ? a.b : a.a);
          const std::vector<float> got(w.data_as<float>(), w.data_as<float>() + t.numel());
          worst = std::max(worst, worst_rel(got, e.at("trained." + runtime::peft_adapter_name(a.module, is_b))));
          ++compared;
        }
      }
      BOOST_TEST_MESSAGE(k.adapter << ": " << compared << " trained adapter tensors within " << worst << " of PEFT's");
      BOOST_TEST(compared == static_cast<int>(2 * m.model->lora().size()));
      BOOST_TEST(worst <= 1e-3);
    }
  }
}

BOOST_AUTO_TEST_CASE(every_stage_and_placement_gives_identical_losses_and_a_frozen_base) {
  test::TempDir dir("lora");
  const std::string nvme = dir.path.string();
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    for (int stage = 0; stage <= 3; ++stage) {
      json d = doc("llama3", 3);
      d["gradient_accumulation_steps"] = 2;
      d["lora"] = {{"r", 4}, {"target_modules", "all-linear"}};
      if (std::string(precision) == "bf16") d["bf16"] = {{"enabled", true}};
      if (std::string(precision) == "fp16") d["fp16"] = {{"enabled", true}};  // f16 shards at stage 3
      d["zero_optimization"] = {{"stage", stage}};
      const std::vector<double> reference = losses(config(d));
      for (const auto& [where, zero] : test::zero_placements(stage, nvme)) {
        BOOST_TEST_CONTEXT(precision << ", stage " << stage << ", " << where) {
          d["zero_optimization"] = zero;
          BOOST_TEST(losses(config(d)) == reference, boost::test_tools::per_element());
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(only_the_adapters_are_trained_stored_and_updated) {
  json d = doc("llama3", 3);
  d["lora"] = {{"r", 4}, {"target_modules", json::array({"q_proj", "v_proj"})}};
  d["zero_optimization"] = {{"stage", 3}};
  comm::SingleProcessCommunicator one;
  std::ostream discard(nullptr);
  runtime::Trainer t(config(d), one, discard);
  std::vector<std::vector<float>> before;
  for (int u = 0; u < t.model().num_units(); ++u) before.push_back(t.units().full_weights(u));
  t.run();
  int64_t trained = 0, frozen_checked = 0, adapters_moved = 0;
  for (int u = 0; u < t.model().num_units(); ++u) {
    const nn::UnitSpec& spec = t.model().units()[static_cast<size_t>(u)];
    trained += spec.trainable_numel;
    const std::vector<float> after = t.units().full_weights(u);
    for (const nn::TensorSpec& ts : spec.tensors) {
      bool same = true;
      for (int64_t i = ts.offset; i < ts.offset + ts.numel(); ++i) same = same && after[static_cast<size_t>(i)] == before[static_cast<size_t>(u)][static_cast<size_t>(i)];
      if (!ts.trainable) {
        BOOST_TEST(same, ts.name << " is frozen but changed");
        ++frozen_checked;
      } else if (!same) {
        ++adapters_moved;
      }
    }
  }
  // 3 layers x (q, v) x (A [4, 60] + B [rows, 4]): q has 60 rows, v 12 (one key/value head).
  BOOST_TEST(trained <= 3 * (4 * 60 + 60 * 4 + 16 + 4 * 60 + 12 * 4 + 16));
  BOOST_TEST(frozen_checked > 10);
  BOOST_TEST(adapters_moved == 3 * 4);
  // The optimizer keeps master, m and v of the adapters only.
  BOOST_TEST(t.optimizer().bytes() <= static_cast<size_t>(3 * 4 * trained + 3 * 4 * 16 * 5));
}

BOOST_AUTO_TEST_CASE(a_checkpoint_holds_the_adapters_resumes_bit_for_bit_and_exports_peft) {
  test::TempDir dir("lora_ckpt");
  const std::string adapter = kRoot + "peft/llama3-all";
  json d = doc("llama3", 4);
  d["model"]["adapter_from"] = adapter;
  d["lora"] = {{"lora_dropout", 0.1}};  // masks keyed by step and position: a resume draws the same
  d["checkpoint"] = {{"dir", (dir.path / "a").string()}, {"every_steps", 2}, {"keep_last", 0}};
  const std::vector<double> straight = losses(config(d));
  // Two steps, then a resume for the last two.
  d["checkpoint"]["dir"] = (dir.path / "b").string();
  d["train"]["steps"] = 2;
  losses(config(d));
  d["train"]["steps"] = 4;
  d["checkpoint"]["resume"] = "auto";
  const std::vector<double> resumed = losses(config(d));
  BOOST_REQUIRE(resumed.size() == 2);
  BOOST_TEST(resumed[0] == straight[2]);
  BOOST_TEST(resumed[1] == straight[3]);
  const std::string a4 = (dir.path / "a" / "step-00000004").string(), b4 = (dir.path / "b" / "step-00000004").string();
  const json manifest = json::parse(std::ifstream(a4 + "/manifest.json"));
  BOOST_TEST(manifest.at("format_version").get<int>() == 2);
  BOOST_TEST(manifest.at("lora").at("adapters").size() == 3u * 7u);
  runtime::export_peft(a4, (dir.path / "pa").string(), "fp32");
  runtime::export_peft(b4, (dir.path / "pb").string(), "fp32");
  BOOST_TEST((file_bytes((dir.path / "pa/adapter_model.safetensors").string()) ==
              file_bytes((dir.path / "pb/adapter_model.safetensors").string())));
  // Step 0's export is the adapter the run started from, byte for byte, under PEFT's names.
  d["train"]["steps"] = 0;
  d["checkpoint"] = {{"dir", (dir.path / "c").string()}};
  losses(config(d));
  runtime::export_peft((dir.path / "c").string(), (dir.path / "pc").string(), "fp32");
  BOOST_TEST((file_bytes((dir.path / "pc/adapter_model.safetensors").string()) ==
              file_bytes(adapter + "/adapter_model.safetensors")));
  const json written = json::parse(std::ifstream(dir.path / "pc/adapter_config.json"));
  BOOST_TEST(written.at("r") == 4);
  BOOST_TEST(written.at("target_modules").size() == 7u);
  // The merged model: the fixture's merged logits, through ferry's own import.
  runtime::export_hf((dir.path / "c").string(), (dir.path / "merged").string(), "fp32", uint64_t{5} << 30, true);
  {
    nn::CpuDevice dev(size_t{256} << 20, 1);
    const runtime::Config mc = config(doc("llama3"), {"model.init_from=" + (dir.path / "merged").string()});
    std::unique_ptr<nn::Model> model = runtime::make_model(mc, dev);
    nn::ResidentUnits units(dev, nn::DType::f32, model->units());
    runtime::HfWeights w(mc.init_from, mc.resolved.at("model"), model->units());
    for (int u = 0; u < model->num_units(); ++u) w.fill(u, 0, units.weights[static_cast<size_t>(u)].numel(), units.weights[static_cast<size_t>(u)].data_as<float>());
    const auto merged = f32_tensors(adapter + "/merged.safetensors");
    const Batch b = batch(dev, f32_tensors(kRoot + "hf/llama3/expected.safetensors"));
    model->forward(units, b.tokens, nn::Tensor{}, 2, 16);
    const nn::Tensor& logits = model->logits();
    BOOST_TEST(worst_rel(std::vector<float>(logits.data_as<float>(), logits.data_as<float>() + logits.numel()),
                         merged.at("logits")) <= 1e-5);
  }
  // What an adapters' checkpoint is not: a whole model, or a full fine-tune's start.
  BOOST_TEST(error_of([&] { runtime::export_hf(a4, (dir.path / "x").string(), "fp32", uint64_t{5} << 30); })
                 .find("--peft DIR, or the merged model with --hf DIR --merge") != std::string::npos);
  BOOST_TEST(error_of([&] { runtime::export_safetensors(a4, (dir.path / "x.safetensors").string(), "fp32"); })
                 .find("holds LoRA adapters") != std::string::npos);
  // A resume on another base is refused, naming the file that changed.
  {
    const fs::path other = dir.path / "other-base";
    fs::create_directories(other);
    for (const auto& e : fs::directory_iterator(kRoot + "hf/llama3")) fs::copy_file(e.path(), other / e.path().filename());
    fs::copy_file(kRoot + "hf/qwen2-untied/model.safetensors", other / "model-00003-of-00005.safetensors",
                  fs::copy_options::overwrite_existing);
    json moved = doc("llama3", 5);
    moved["model"]["init_from"] = other.string();
    moved["model"]["adapter_from"] = adapter;
    moved["checkpoint"] = {{"dir", (dir.path / "a").string()}, {"resume", "auto"}};
    const std::string e = error_of([&] { losses(config(moved)); });
    BOOST_TEST_MESSAGE("a resume on another base: " << e);
    BOOST_TEST(e.find("model-00003-of-00005.safetensors") != std::string::npos);
  }
  json full = doc("llama3", 5);
  full["checkpoint"] = {{"dir", (dir.path / "a").string()}, {"resume", "auto"}};
  const std::string into_full = error_of([&] { losses(config(full)); });
  BOOST_TEST_MESSAGE("a LoRA checkpoint resumed by a full fine-tune: " << into_full);
  BOOST_TEST(into_full.find("frozen in the checkpoint but trained in this run (another lora.* setting)") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(what_ferry_cannot_do_with_adapters_is_refused_by_name) {
  test::TempDir dir("lora_bad");
  auto refusal = [&](json d, const std::vector<std::string>& sets = {}) {
    std::string all;
    for (const std::string& x : sets) all += x + " ";
    BOOST_TEST_MESSAGE("refusal of " << all);
    return error_of([&] { (void)config(d, sets); });
  };
  const json base = doc("llama3");
  BOOST_TEST(refusal(base, {"lora.r=4", "lora.target_modules=qproj"}).find("matches 'qproj'") != std::string::npos);
  BOOST_TEST(refusal(base, {"lora.r=4", "lora.target_modules=lm_head"}).find("lm_head") != std::string::npos);
  BOOST_TEST(refusal(base, {"lora.r=4", "lora.target_modules=embed_tokens"}).find("takes no adapter") != std::string::npos);
  BOOST_TEST(refusal(base, {"lora.r=4", "lora.modules_to_save=k_proj"}).find("one piece of") != std::string::npos);
  BOOST_TEST(refusal(base, {"lora.r=4", "lora.lora_dropout=0.99"}).find("lora.lora_dropout") != std::string::npos);
  BOOST_TEST(refusal(base, {"lora.target_modules=q_proj"}).find("need lora.r > 0") != std::string::npos);
  BOOST_TEST(refusal(base, {"lora.r=4", "lora.bias=all"}).find("lora.bias") != std::string::npos);
  // Tied embeddings: peft would untie what ferry keeps as one matrix.
  BOOST_TEST(refusal(doc("qwen2"), {"lora.r=4", "lora.modules_to_save=lm_head"}).find("ties to its output layer") !=
             std::string::npos);
  BOOST_TEST(refusal(doc("gpt2"), {"lora.r=4", "lora.modules_to_save=wte"}).find("ties to its output layer") !=
             std::string::npos);
  // A module saved in full gets no adapter (peft's rule), and saving matches name endings.
  {
    const runtime::Config c = config(base, {"lora.r=4", "lora.target_modules=all-linear", "lora.modules_to_save=o_proj"});
    nn::CpuDevice dev(size_t{64} << 20, 1);
    const std::unique_ptr<nn::Model> m = runtime::make_model(c, dev);
    int o_adapters = 0, o_trained = 0;
    for (const nn::LoraAdapter& a : m->lora()) o_adapters += a.module.ends_with(".o_proj");
    for (const nn::UnitSpec& u : m->units())
      for (const nn::TensorSpec& t : u.tensors) o_trained += t.name.ends_with("attention.wo.weight") && t.trainable;
    BOOST_TEST(o_adapters == 0);
    BOOST_TEST(o_trained == 3);
    BOOST_TEST(m->lora().size() == 3u * 6u);
  }
  // Axolotl: `adapter: lora` needs its rank; nulls are absent.
  auto plus = [&](json extra) {
    json d = base;
    d.update(extra);
    return d;
  };
  BOOST_TEST(refusal(plus({{"adapter", "lora"}})).find("no rank is given") != std::string::npos);
  BOOST_TEST(config(plus({{"adapter", "lora"}, {"lora_r", 8}, {"lora_target_linear", true}})).lora.r == 8);
  BOOST_TEST(config(plus({{"adapter", nullptr}, {"lora_r", nullptr}})).lora.r == 0);
  // Axolotl's qlora is lora.base_dtype nf4 (tests/test_qlora.cpp), which needs bf16 or fp16.
  BOOST_TEST(refusal(plus({{"adapter", "qlora"}, {"lora_r", 8}})).find("computes in bf16 or fp16") != std::string::npos);
  BOOST_TEST(config(plus({{"adapter", "qlora"}, {"lora_r", 8}, {"bf16", true}})).lora.nf4);
  BOOST_TEST(refusal(base, {"peft.r=8"}).find("the lora section") != std::string::npos);
  // adapter_config.json: each variant ferry does not compute, by file and key.
  const std::string adapter = kRoot + "peft/llama3-all";
  auto with = [&](const std::string& name, const std::function<void(json&)>& change) {
    const fs::path to = dir.path / name;
    fs::create_directories(to);
    for (const auto& e : fs::directory_iterator(adapter)) fs::copy_file(e.path(), to / e.path().filename());
    json c = json::parse(std::ifstream(to / "adapter_config.json"));
    change(c);
    std::ofstream(to / "adapter_config.json") << c.dump(2);
    return to.string();
  };
  auto from = [&](const std::string& folder, const std::vector<std::string>& sets = {}) {
    std::vector<std::string> all = {"model.adapter_from=" + folder};
    all.insert(all.end(), sets.begin(), sets.end());
    return refusal(base, all);
  };
  BOOST_TEST(from(with("dora", [](json& c) { c["use_dora"] = true; })).find("'use_dora'") != std::string::npos);
  BOOST_TEST(from(with("regex", [](json& c) { c["target_modules"] = ".*proj"; })).find("regular expression") != std::string::npos);
  BOOST_TEST(from(with("ranks", [](json& c) { c["rank_pattern"] = {{"q_proj", 8}}; })).find("'rank_pattern'") != std::string::npos);
  BOOST_TEST(from(with("ia3", [](json& c) { c["peft_type"] = "IA3"; })).find("LORA adapters only") != std::string::npos);
  // Dropout is the file's unless the run sets its own.
  const std::string dropped = with("dropout", [](json& c) { c["lora_dropout"] = 0.05; });
  BOOST_TEST(config(base, {"model.adapter_from=" + dropped}).lora.dropout == 0.05);
  BOOST_TEST(config(base, {"model.adapter_from=" + dropped, "lora.lora_dropout=0"}).lora.dropout == 0.0);
  BOOST_TEST(from(adapter, {"lora.r=8"}).find("key 'lora.r' is 8 but") != std::string::npos);
  BOOST_TEST(from(with("pissa", [](json& c) { c["init_lora_weights"] = "pissa"; })).find("'init_lora_weights'") != std::string::npos);
  BOOST_TEST(from(with("notype", [](json& c) { c.erase("peft_type"); })).find("LORA adapters only") != std::string::npos);
  BOOST_TEST(from(with("typed", [](json& c) { c["peft_type"] = 7; })).find("LORA adapters only") != std::string::npos);
  // No target_modules: the family's default, as peft; a name matching nothing beside one
  // that does is ignored, as peft.
  BOOST_TEST(config(base, {"model.adapter_from=" + with("default", [](json& c) { c.erase("target_modules"); })})
                 .lora.target_modules.empty());
  BOOST_TEST(config(base, {"model.adapter_from=" + with("extra-name", [](json& c) { c["target_modules"].push_back("nothing"); })})
                 .lora.r == 4);
  BOOST_CHECK_NO_THROW((void)config(doc("llama3"), {"model.adapter_from=" + adapter, "lora.lora_dropout=0"}));
  json no_base = base;
  no_base["model"].erase("init_from");
  no_base["model"]["arch"] = "llama";
  BOOST_TEST(refusal(no_base, {"model.adapter_from=" + adapter}).find("needs model.init_from") != std::string::npos);
  // The adapter file must hold what the run's adapters are, and nothing else.
  auto trainer_error = [&](const std::string& folder) {
    return error_of([&] {
      comm::SingleProcessCommunicator one;
      std::ostream discard(nullptr);
      runtime::Trainer t(config(doc("llama3"), {"model.adapter_from=" + folder}), one, discard);
    });
  };
  const std::string missing = with("missing", [](json&) {});
  fs::copy_file(kRoot + "peft/llama3-save-head/adapter_model.safetensors", fs::path(missing) / "adapter_model.safetensors",
                fs::copy_options::overwrite_existing);
  BOOST_TEST(trainer_error(missing).find("no tensor base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight") !=
             std::string::npos);
  const std::string extra = with("extra", [](json& c) { c["target_modules"] = {"q_proj", "v_proj"}; });
  BOOST_TEST(trainer_error(extra).find("which this run has no place for") != std::string::npos);
  BOOST_CHECK_NO_THROW({
    comm::SingleProcessCommunicator one;
    std::ostream discard(nullptr);
    runtime::Trainer t(config(doc("llama3"), {"model.adapter_from=" + adapter}), one, discard);
  });
}
