// QLoRA end to end (lora.base_dtype "nf4", docs/guide/adapters.md): the frozen block
// projections stored in NF4, quantized at start, dequantized in the GEMMs.
// - Training equals LoRA on a Hugging Face folder that holds the dequantized base (each
//   module quantized on its own from its bf16 values, as transformers loads a bf16 model
//   with load_in_4bit), with and without double quantization;
// - every stage and placement gives the same losses bit for bit (stage 3 with everything
//   on the device too: bf16 shards beside the optimizer's fp32 master), the base streaming
//   as bytes from the device, host memory or nvme; under fp16 too (f16 shards at stage 3);
// - a resume continues bit for bit (the base quantized again from the folder);
// - the configuration keys, Axolotl's spellings, and what is refused by name.
#define BOOST_TEST_MODULE qlora
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>

#include "comm/communicator.h"
#include "nn/nf4.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/ckpt/safetensors.h"
#include "runtime/hf/hf_export.h"
#include "runtime/config/config.h"
#include "runtime/hf/hf_tensors.h"
#include "runtime/hf/hf_weights.h"
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

json doc(const std::string& folder, int64_t steps) {
  return {{"model", {{"init_from", folder}, {"block_size", 16}}},
          {"data", {{"path", kRoot + "kjv-64k.txt"}}},
          {"device", {{"memory", "256MiB"}, {"threads", 1}}},
          {"bf16", {{"enabled", true}}},
          {"train_micro_batch_size_per_gpu", 2},
          {"gradient_accumulation_steps", 2},
          {"optimizer", {{"params", {{"lr", 0.01}, {"weight_decay", 0.0}}}}},
          {"lora", {{"r", 4}, {"lora_alpha", 8}, {"target_modules", "all-linear"}}},
          {"train", {{"steps", steps}, {"eval_every", 0}, {"eval_batches", 1}, {"sample_tokens", 0}}}};
}

runtime::Config config(const json& d, const std::vector<std::string>& sets = {}) {
  return runtime::config_from_json(d, "test.json", "", sets, 1);
}

std::vector<double> losses(const runtime::Config& c) {
  comm::SingleProcessCommunicator one;
  std::ostream discard(nullptr);
  runtime::Trainer t(c, one, discard);
  std::vector<double> out;
  for (const auto& s : t.run().steps) out.push_back(s.loss);
  return out;
}

// A copy of Hugging Face folder `from` in `to` whose block projections hold what NF4
// keeps of them: each module's values rounded to bf16 (unless round_first is false),
// quantized, dequantized (fp32, one model.safetensors).
void write_dequantized_folder(const std::string& from, const fs::path& to, bool double_quant, bool round_first = true) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) {
    const std::string name = e.path().filename().string();
    if (!name.ends_with(".safetensors") && !name.ends_with(".index.json")) fs::copy_file(e.path(), to / name);
  }
  json d = doc(from, 1);
  d["lora"]["base_dtype"] = "nf4";
  d["lora"]["double_quant"] = double_quant;
  const runtime::Config c = config(d);
  const std::vector<nn::UnitSpec> layout = runtime::model_layout(c);
  const runtime::HfLayout hf = runtime::hf_layout(c.resolved.at("model"), layout);
  std::map<std::string, std::vector<float>> values;  // every tensor of the folder, fp32
  for (const auto& e : fs::directory_iterator(from)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("model") || !name.ends_with(".safetensors")) continue;
    runtime::SafetensorsReader r(e.path().string());
    for (const auto& t : r.entries()) {
      BOOST_REQUIRE(t.dtype == "F32");
      const std::vector<char> b = r.read(t);
      values[t.name].resize(b.size() / 4);
      std::memcpy(values[t.name].data(), b.data(), b.size());
    }
  }
  int quantized = 0;
  for (const runtime::HfTensorMap& m : hf.tensors) {
    const nn::TensorSpec& t = layout.at(static_cast<size_t>(m.unit)).tensors.at(m.tensor);
    for (const nn::Nf4Piece& p : t.nf4) {
      const runtime::HfPiece* piece = nullptr;
      for (const runtime::HfPiece& hp : m.pieces) piece = hp.row_begin == p.row0 ? &hp : piece;
      BOOST_REQUIRE(piece != nullptr);
      BOOST_REQUIRE(!piece->transposed);
      std::vector<float>& v = values.at(piece->name);
      BOOST_REQUIRE(static_cast<int64_t>(v.size()) == p.layout.numel());
      if (round_first)
        for (float& x : v) x = nn::bf16_to_f32(nn::f32_to_bf16(x));
      const nn::Nf4Tensor q = nn::nf4_quantize(v.data(), p.layout.numel(), double_quant, nullptr, nullptr);
      nn::nf4_dequantize(q, v.data());
      ++quantized;
    }
  }
  BOOST_TEST(quantized == 3 * 7);  // q, k, v, o, gate, up, down in each of the 3 layers
  std::vector<runtime::SafetensorsEntry> entries;
  uint64_t at = 0;
  for (const auto& [name, v] : values) {
    entries.push_back({name, "F32", {}, at, at + v.size() * 4});
    at += v.size() * 4;
  }
  // Shapes from the original files.
  for (const auto& e : fs::directory_iterator(from)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("model") || !name.ends_with(".safetensors")) continue;
    runtime::SafetensorsReader r(e.path().string());
    for (const auto& t : r.entries())
      for (auto& out : entries)
        if (out.name == t.name) out.shape = t.shape;
  }
  runtime::SafetensorsWriter w((to / "model.safetensors").string(), entries, {{"format", "pt"}});
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::vector<float>& v = values.at(entries[i].name);
    w.write(i, v.data(), v.size() * 4);
  }
  w.finish();
}

// `ferry export --hf --merge` of DIR/ckpt-q and of DIR/ckpt-l (fp32) hold the same tensors,
// byte for byte.
bool merged_exports_equal(const fs::path& dir) {
  runtime::export_hf((dir / "ckpt-q").string(), (dir / "merged-q").string(), "fp32", uint64_t{1} << 30, true);
  runtime::export_hf((dir / "ckpt-l").string(), (dir / "merged-l").string(), "fp32", uint64_t{1} << 30, true);
  runtime::SafetensorsReader a((dir / "merged-q" / "model.safetensors").string());
  runtime::SafetensorsReader b((dir / "merged-l" / "model.safetensors").string());
  if (a.entries().size() != b.entries().size()) return false;
  for (size_t i = 0; i < a.entries().size(); ++i) {
    if (a.entries()[i].name != b.entries()[i].name || a.read(a.entries()[i]) != b.read(b.entries()[i])) return false;
  }
  return true;
}

double worst_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) w = std::max(w, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return w;
}

}  // namespace

BOOST_AUTO_TEST_CASE(qlora_trains_as_lora_on_the_dequantized_base) {
  test::TempDir dir("qlora_deq");
  for (const bool double_quant : {true, false}) {
    BOOST_TEST_CONTEXT("double_quant " << double_quant) {
      const fs::path folder = dir.path / (double_quant ? "dq" : "plain");
      write_dequantized_folder(kRoot + "hf/llama3", folder, double_quant);
      json q = doc(kRoot + "hf/llama3", 4);
      q["lora"]["base_dtype"] = "nf4";
      q["lora"]["double_quant"] = double_quant;
      q["checkpoint"] = {{"dir", (dir.path / "ckpt-q").string()}};
      json l = doc(folder.string(), 4);
      l["checkpoint"] = {{"dir", (dir.path / "ckpt-l").string()}};
      const std::vector<double> qlora = losses(config(q));
      const std::vector<double> lora = losses(config(l));
      const std::vector<double> original = losses(config(doc(kRoot + "hf/llama3", 4)));
      BOOST_REQUIRE(qlora.size() == 4u);
      const double rel = worst_rel(qlora, lora), off = worst_rel(qlora, original);
      BOOST_TEST_MESSAGE("QLoRA losses within " << rel << " of LoRA on the dequantized base; " << off
                                                << " from LoRA on the unquantized base");
      BOOST_TEST(rel <= 1e-6);
      BOOST_TEST(off > 1e-4);  // quantization changes the model: the comparison can fail
      // Merged, the QLoRA checkpoint is the dequantized base plus the adapters: byte for byte
      // the merge of the LoRA run on the dequantized folder.
      BOOST_TEST(merged_exports_equal(dir.path));
      fs::remove_all(dir.path / "ckpt-q");
      fs::remove_all(dir.path / "ckpt-l");
      fs::remove_all(dir.path / "merged-q");
      fs::remove_all(dir.path / "merged-l");
    }
  }
}

// tests/data/nf4/llama3-nf4 is tests/data/hf/llama3 saved by transformers with
// BitsAndBytesConfig(load_in_4bit, nf4, double quantization) from float32 values
// (tests/test_nf4.cpp: every state is ferry's quantization of the float32 base). Read as it
// is: each state equals ferry's quantization of the float32 base, field for field; training
// equals LoRA on the float32 base's dequantized folder, loss for loss; the merged export of
// that run equals the LoRA run's, byte for byte (the merge dequantizes the folder's states).
BOOST_AUTO_TEST_CASE(a_folder_bitsandbytes_saved_in_nf4_is_read_as_it_is) {
  test::TempDir dir("qlora_bnb");
  const fs::path folder = dir.path / "llama3-nf4";  // the saved folder, with the base's tokenizer
  fs::create_directories(folder);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
    fs::copy_file(kRoot + "nf4/llama3-nf4/" + f, folder / f);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
    fs::copy_file(kRoot + "hf/llama3/" + f, folder / f);
  json q = doc(folder.string(), 4);
  q["lora"]["base_dtype"] = "nf4";
  const runtime::Config c = config(q);
  {
    const std::vector<nn::UnitSpec> layout = runtime::model_layout(c);
    runtime::HfWeights saved(folder.string(), c.resolved.at("model"), layout);
    runtime::HfWeights base(kRoot + "hf/llama3", config(doc(kRoot + "hf/llama3", 1)).resolved.at("model"), layout);
    int states = 0;
    for (size_t u = 0; u < layout.size(); ++u) {
      for (size_t i = 0; i < layout[u].tensors.size(); ++i) {
        for (const nn::Nf4Piece& p : layout[u].tensors[i].nf4) {
          nn::Nf4Tensor s;
          BOOST_REQUIRE(saved.read_nf4(static_cast<int>(u), i, p.row0, &s));
          std::vector<float> v(static_cast<size_t>(p.layout.numel()));
          base.read_rows(static_cast<int>(u), i, p.row0, p.layout.rows, v.data());
          const nn::Nf4Tensor mine = nn::nf4_quantize(v.data(), p.layout.numel(), true, nullptr, nullptr);
          BOOST_TEST((s.packed == mine.packed && s.absmax_code == mine.absmax_code &&
                      s.nested_absmax == mine.nested_absmax && s.code == mine.code && s.offset == mine.offset),
                     layout[u].tensors[i].name << " rows " << p.row0);
          ++states;
        }
      }
    }
    BOOST_TEST(states == 21);
    nn::Nf4Tensor none;
    BOOST_TEST(!base.read_nf4(1, 1, 0, &none));  // an unquantized folder holds values
  }
  write_dequantized_folder(kRoot + "hf/llama3", dir.path / "deq", true, /*round_first=*/false);
  q["checkpoint"] = {{"dir", (dir.path / "ckpt-q").string()}};
  json l = doc((dir.path / "deq").string(), 4);
  l["checkpoint"] = {{"dir", (dir.path / "ckpt-l").string()}};
  const std::vector<double> from_saved = losses(config(q)), lora = losses(config(l));
  BOOST_TEST(from_saved == lora, boost::test_tools::per_element());
  BOOST_TEST(merged_exports_equal(dir.path));
  // Read without lora.base_dtype nf4, or with another double quantization: refused by name.
  const std::string e1 = error_of([&] { (void)config(doc(folder.string(), 1)); });
  BOOST_TEST(e1.find("holds a base bitsandbytes quantized to NF4") != std::string::npos, e1);
  const std::string e2 = error_of([&] { (void)config(q, {"lora.double_quant=false"}); });
  BOOST_TEST(e2.find("bnb_4bit_use_double_quant is true") != std::string::npos, e2);
}

BOOST_AUTO_TEST_CASE(every_stage_and_placement_gives_identical_losses) {
  test::TempDir dir("qlora");
  const std::string nvme = dir.path.string();
  json d = doc(kRoot + "hf/llama3", 3);
  d["lora"]["base_dtype"] = "nf4";
  // fp16 (QLoRA on GPUs without bf16): stage 3 keeps f16 shards, every placement of it
  // against stage 0 (stages 1-2 run fp16 in the next case).
  for (const char* precision : {"bf16", "fp16"}) {
    const bool half = std::string(precision) == "fp16";
    d["zero_optimization"] = {{"stage", 0}};
    d["bf16"] = {{"enabled", !half}};
    d["fp16"] = {{"enabled", half}};
    const std::vector<double> reference = losses(config(d));
    for (int stage = half ? 3 : 0; stage <= 3; ++stage) {
      for (const auto& [where, zero] : test::zero_placements(stage, nvme)) {
        BOOST_TEST_CONTEXT(precision << ", stage " << stage << ", " << where) {
          d["zero_optimization"] = zero;
          BOOST_TEST(losses(config(d)) == reference, boost::test_tools::per_element());
        }
      }
    }
  }
}

// With what already works beside adapters: packed prompt/completion records (masks and
// per-document attention), activation checkpointing (recomputes the NF4 products: the same
// losses bit for bit), gradient clipping, fp16 with loss scaling at stage 2 (within fp16's
// margin of bf16), and the overlapped step.
BOOST_AUTO_TEST_CASE(with_packing_checkpointing_clipping_fp16_and_the_overlapped_step) {
  json d = doc(kRoot + "hf/llama3", 4);
  d["lora"]["base_dtype"] = "nf4";
  d["data"] = {{"path", std::string(FERRY_SOURCE_DIR) + "/examples/data/verses.jsonl"},
               {"format", "jsonl"},
               {"mask_prompt", true},
               {"packing", "packed"}};
  d["model"]["block_size"] = 32;
  d["gradient_clipping"] = 0.5;
  d["zero_optimization"] = {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}};
  const std::vector<double> plain = losses(config(d));
  const std::vector<double> recomputed = losses(config(d, {"activation_checkpointing.enabled=true"}));
  BOOST_TEST(recomputed == plain, boost::test_tools::per_element());
  const std::vector<double> sequential = losses(config(d, {"schedule.overlap_offload=false"}));
  BOOST_TEST(sequential == plain, boost::test_tools::per_element());  // plain overlaps Adam (the default)
  const std::vector<double> half = losses(config(d, {"bf16.enabled=false", "fp16.enabled=true"}));
  BOOST_REQUIRE(half.size() == plain.size());
  for (size_t i = 0; i < half.size(); ++i) BOOST_TEST(std::abs(half[i] - plain[i]) <= 2e-2 * plain[i]);
  BOOST_TEST_MESSAGE("packed QLoRA: bf16 " << plain.back() << ", fp16 " << half.back());
}

BOOST_AUTO_TEST_CASE(a_resume_continues_bit_for_bit) {
  test::TempDir dir("qlora_resume");
  json d = doc(kRoot + "hf/llama3", 4);
  d["lora"]["base_dtype"] = "nf4";
  d["zero_optimization"] = {{"stage", 3}, {"offload_optimizer", {{"device", "cpu"}}}, {"offload_param", {{"device", "cpu"}}}};
  d["checkpoint"] = {{"dir", (dir.path / "a").string()}, {"every_steps", 2}};
  const std::vector<double> whole = losses(config(d));
  d["checkpoint"]["dir"] = (dir.path / "b").string();
  d["train"]["steps"] = 2;
  (void)losses(config(d));
  d["train"]["steps"] = 4;
  const std::vector<double> resumed = losses(config(d, {"checkpoint.resume=auto"}));
  BOOST_REQUIRE(resumed.size() == 2u);
  BOOST_TEST(resumed[0] == whole[2]);
  BOOST_TEST(resumed[1] == whole[3]);
  // Resumed with the base kept as values, or quantized without double quantization: refused
  // naming the tensor and the keys.
  for (const char* set : {"lora.base_dtype=compute", "lora.double_quant=false"}) {
    const std::string e = error_of([&] { (void)losses(config(d, {"checkpoint.resume=auto", set})); });
    BOOST_TEST(e.find("in the checkpoint but as") != std::string::npos, e);
    BOOST_TEST(e.find("lora.base_dtype or lora.double_quant changed") != std::string::npos, e);
  }
  // A manifest whose nf4 entry is damaged is refused naming the tensor.
  const fs::path step = dir.path / "b" / "step-00000004" / "manifest.json";
  json m;
  std::ifstream(step) >> m;
  const json good = m;
  auto damaged = [&](const std::function<void(json&)>& edit) {
    json x = good;
    edit(x["units"][1]["tensors"][1]);
    std::ofstream(step) << x.dump();
    const std::string e = error_of([&] { (void)runtime::CheckpointReader(step.parent_path().string()).layout(); });
    BOOST_TEST_MESSAGE(e);
    return e;
  };
  BOOST_REQUIRE(good["units"][1]["tensors"][1].contains("nf4"));
  BOOST_TEST(damaged([](json& t) { t["nf4"]["pieces"] = json::array({json::array({1, 4})}); }).find("do not cover") != std::string::npos);
  BOOST_TEST(damaged([](json& t) { t["nf4"]["pieces"] = json::array({json::array({0, 1000000})}); }).find("nf4") != std::string::npos);
  BOOST_TEST(damaged([](json& t) { t["shape"] = json::array({int64_t{1} << 40, 60}); }).find("nf4 shape") != std::string::npos);
  BOOST_TEST(damaged([](json& t) { t["nf4"].erase("double_quant"); }).find("malformed") != std::string::npos);
  BOOST_TEST(damaged([](json& t) { t["trainable"] = true; }).find("frozen matrix") != std::string::npos);
  std::ofstream(step) << good.dump();
}

BOOST_AUTO_TEST_CASE(the_keys_and_what_is_refused_by_name) {
  json d = doc(kRoot + "hf/llama3", 1);
  d["lora"]["base_dtype"] = "nf4";
  BOOST_TEST(config(d).lora.nf4);
  BOOST_TEST(config(d).lora.double_quant);
  BOOST_TEST(!config(doc(kRoot + "hf/llama3", 1)).lora.nf4);
  // The layout: every block projection quantized, piece by piece; the rest kept.
  const std::vector<nn::UnitSpec> layout = runtime::model_layout(config(d));
  int pieces = 0, quantized = 0;
  for (const nn::UnitSpec& u : layout) {
    for (const nn::TensorSpec& t : u.tensors) {
      quantized += t.quantized();
      pieces += static_cast<int>(t.nf4.size());
      if (t.quantized()) BOOST_TEST(!t.trainable);
      if (t.name.find("norm") != std::string::npos || t.name.find("lora") != std::string::npos) BOOST_TEST(!t.quantized());
    }
  }
  BOOST_TEST(quantized == 3 * 4);  // wqkv, wo, w_gate_up, w_down in each layer
  BOOST_TEST(pieces == 3 * 7);     // q, k, v, o, gate, up, down: a state each
  // Axolotl's spellings.
  json ax = doc(kRoot + "hf/llama3", 1);
  ax.erase("lora");
  ax["adapter"] = "qlora";
  ax["lora_r"] = 8;
  ax["load_in_4bit"] = true;
  ax["bnb_4bit_use_double_quant"] = false;
  ax["bnb_4bit_quant_type"] = "nf4";
  const runtime::Config c = config(ax);
  BOOST_TEST(c.lora.nf4);
  BOOST_TEST(!c.lora.double_quant);
  BOOST_TEST(c.lora.r == 8);
  auto refused = [&](json x, const std::vector<std::string>& sets, const std::string& words) {
    const std::string e = error_of([&] { (void)config(x, sets); });
    BOOST_TEST_MESSAGE(e);
    BOOST_TEST(e.find(words) != std::string::npos, e);
  };
  refused(d, {"bf16.enabled=false"}, "computes in bf16 or fp16");
  json no_rank = d;
  no_rank["lora"] = {{"base_dtype", "nf4"}};
  refused(no_rank, {}, "needs lora.r > 0");
  refused(d, {"lora.base_dtype=int8"}, "lora.base_dtype");
  json eight = ax;
  eight["load_in_8bit"] = true;
  refused(eight, {}, "load_in_8bit");
  json fp4 = ax;
  fp4["bnb_4bit_quant_type"] = "fp4";
  refused(fp4, {}, "NF4 only");
  // A folder quantized another way is refused by name (an 8-bit bitsandbytes config here).
  test::TempDir dir("qlora_int8");
  for (const auto& e : fs::directory_iterator(kRoot + "hf/llama3")) fs::copy_file(e.path(), dir.path / e.path().filename());
  json hf;
  std::ifstream(dir.path / "config.json") >> hf;
  hf["quantization_config"] = {{"quant_method", "bitsandbytes"}, {"load_in_8bit", true}};
  std::ofstream(dir.path / "config.json") << hf.dump();
  refused(doc(dir.path.string(), 1), {}, "quantization_config");
}
