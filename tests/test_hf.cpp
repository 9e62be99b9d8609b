// Hugging Face model folders in and out (model.init_from, ferry export --hf), against the
// fixtures in tests/data/hf/ that transformers made (scripts/hf_fixtures/make_fixtures.py):
// - ferry's forward on the imported weights gives the logits and loss transformers computed,
//   for GPT-2, Llama 3 (llama3 rope scaling, sharded files), a tied bf16 Llama, Mistral,
//   Qwen2 tied (fp16 file) and untied, and Qwen3 (q/k norms, head_dim 16 beside hidden 60 / 5 heads);
// - import -> checkpoint of step 0 -> export reproduces every tensor bit for bit (fp32, and
//   bf16 from a bf16 folder), with the tokenizer files carried along;
// - loading at 1, 2 and 3 ranks, stages 0-3, parameters on the device, cpu or nvme, gives
//   the same weights, and a rank reads only its shard's bytes at stage 3;
// - what ferry cannot compute is refused before training, naming the file and the key;
// - a fine-tuning run starts at the loss of the imported weights and falls.
#define BOOST_TEST_MODULE hf
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/io_faults.h"
#include "nn/cpu_device.h"
#include "runtime/ckpt/safetensors.h"
#include "runtime/hf/hf_export.h"
#include "runtime/hf/hf_weights.h"
#include "runtime/train/trainer.h"
#include "error_of.h"
#include "test_util.h"

using namespace ferry;
using nlohmann::json;
namespace fs = std::filesystem;

using ferry::test::error_of;

namespace {

const std::string kData = std::string(FERRY_SOURCE_DIR) + "/tests/data/hf/";
const char* const kModels[] = {"gpt2", "llama3", "llama-tied-bf16", "mistral", "qwen2", "qwen2-untied", "qwen3"};

json doc(const std::string& folder, int64_t steps = 0) {
  return {{"model", {{"init_from", folder}, {"block_size", 16}}},
          {"data", {{"path", std::string(FERRY_SOURCE_DIR) + "/tests/data/kjv-64k.txt"}}},
          {"device", {{"memory", "256MiB"}, {"threads", 1}}},
          {"train_micro_batch_size_per_gpu", 2},
          {"optimizer", {{"params", {{"lr", 0.001}}}}},
          {"train", {{"steps", steps}, {"eval_every", 0}, {"eval_batches", 1}, {"sample_tokens", 0}}}};
}

runtime::Config config(const json& d, const std::vector<std::string>& sets = {}, int world = 1) {
  return runtime::config_from_json(d, "test.json", "", sets, world);
}

// Every tensor of a folder's weight files, by name, as raw bytes and dtype.
std::map<std::string, std::pair<std::string, std::vector<char>>> tensors_of(const std::string& dir) {
  std::map<std::string, std::pair<std::string, std::vector<char>>> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (!f.ends_with(".safetensors") || f == "expected.safetensors") continue;
    runtime::SafetensorsReader r(e.path().string());
    for (const auto& t : r.entries()) out[t.name] = {t.dtype, r.read(t)};
  }
  return out;
}

std::vector<float> as_f32(const std::vector<char>& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

struct Expected {
  std::vector<int32_t> inputs, targets;
  std::vector<float> logits;
  double loss = 0;
};

Expected expected(const std::string& name) {
  runtime::SafetensorsReader r(kData + name + "/expected.safetensors");
  Expected e;
  for (const auto& t : r.entries()) {
    const std::vector<char> b = r.read(t);
    if (t.name == "logits") e.logits = as_f32(b);
    if (t.name == "loss") e.loss = as_f32(b).at(0);
    if (t.name == "input_ids" || t.name == "targets") {
      std::vector<int32_t> v(b.size() / 4);
      std::memcpy(v.data(), b.data(), b.size());
      (t.name == "input_ids" ? e.inputs : e.targets) = v;
    }
  }
  return e;
}

// The model of `c` with every unit filled from the folder, resident on `dev`.
struct Imported {
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<nn::ResidentUnits> units;
};

Imported import(const runtime::Config& c, nn::Device& dev) {
  Imported m;
  m.model = runtime::make_model(c, dev);
  m.units = std::make_unique<nn::ResidentUnits>(dev, nn::DType::f32, m.model->units());
  runtime::HfWeights w(c.init_from, c.resolved.at("model"), m.model->units());
  for (int u = 0; u < m.model->num_units(); ++u) {
    const nn::Tensor& t = m.units->weights[static_cast<size_t>(u)];
    w.fill(u, 0, t.numel(), t.data_as<float>());
  }
  return m;
}

// No targets (tg empty): the model keeps its logits() instead of a loss.
double forward(nn::Device& dev, Imported& m, const std::vector<int32_t>& in, const std::vector<int32_t>& tg, int64_t B,
               int64_t T) {
  const nn::Tensor tokens = nn::Tensor::empty(dev, nn::DType::i32, {B * T});
  std::memcpy(tokens.data(), in.data(), in.size() * 4);
  nn::Tensor targets;
  if (!tg.empty()) {
    targets = nn::Tensor::empty(dev, nn::DType::i32, {B * T});
    std::memcpy(targets.data(), tg.data(), tg.size() * 4);
  }
  return m.model->forward(*m.units, tokens, targets, B, T);
}

// Copies a fixture folder to `to` for a test to break.
void copy_folder(const std::string& from, const fs::path& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) fs::copy_file(e.path(), to / e.path().filename());
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

void write_json(const fs::path& p, const json& j) { std::ofstream(p) << j.dump(2); }

}  // namespace

BOOST_AUTO_TEST_CASE(ferry_forward_matches_transformers_for_every_architecture) {
  nn::CpuDevice dev(size_t{256} << 20, 1);
  for (const char* name : kModels) {
    BOOST_TEST_CONTEXT(name) {
      const runtime::Config c = config(doc(kData + name));
      Imported m = import(c, dev);
      const Expected e = expected(name);
      const double loss = forward(dev, m, e.inputs, e.targets, 2, 16);
      forward(dev, m, e.inputs, {}, 2, 16);  // with targets the head is fused: no logits kept
      const nn::Tensor& logits = m.model->logits();
      BOOST_REQUIRE_EQUAL(static_cast<size_t>(logits.numel()), e.logits.size());
      const float* got = logits.data_as<float>();
      double worst = 0, scale = 0;
      for (size_t i = 0; i < e.logits.size(); ++i) {
        worst = std::max(worst, std::abs(static_cast<double>(got[i]) - e.logits[i]));
        scale = std::max(scale, std::abs(static_cast<double>(e.logits[i])));
      }
      BOOST_TEST_MESSAGE(name << ": max |logit - transformers'| " << worst << " (largest logit " << scale << "), loss "
                              << loss << " vs " << e.loss);
      BOOST_TEST(worst <= 1e-4 * scale);
      BOOST_TEST(std::abs(loss - e.loss) <= 1e-4 * e.loss);
    }
  }
}

BOOST_AUTO_TEST_CASE(import_checkpoint_export_is_bit_exact_and_carries_the_tokenizer) {
  for (const char* name : kModels) {
    BOOST_TEST_CONTEXT(name) {
      test::TempDir dir(std::string("hf_rt_") + name);
      json d = doc(kData + name);
      d["checkpoint"] = {{"dir", (dir.path / "ck").string()}};
      std::ostringstream log;
      test::run_ranks(1, [&](int, comm::Communicator& comm) { runtime::Trainer(config(d), comm, log).run(); });
      const auto original = tensors_of(kData + name);
      const std::string dtype = original.begin()->second.first == "BF16" ? "bf16" : "fp32";
      if (original.begin()->second.first == "F16") continue;  // checked in fp16_folders_export_bit_exact
      const fs::path out = dir.path / "out";
      const runtime::HfExportReport r = runtime::export_hf((dir.path / "ck").string(), out.string(), dtype, 100000);
      const auto exported = tensors_of(out.string());
      BOOST_TEST(exported.size() == original.size());
      for (const auto& [tensor, value] : original) {
        BOOST_TEST_CONTEXT(tensor) {
          BOOST_REQUIRE(exported.count(tensor));
          BOOST_TEST(exported.at(tensor).first == value.first);
          BOOST_TEST((exported.at(tensor).second == value.second));
        }
      }
      BOOST_TEST(r.files > 1);  // 100 kB shards
      BOOST_TEST(fs::exists(out / "model.safetensors.index.json"));
      for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"}) {
        std::ifstream a(kData + name + "/" + f), b(out / f);
        std::stringstream sa, sb;
        sa << a.rdbuf();
        sb << b.rdbuf();
        BOOST_TEST((sa.str() == sb.str()), f);
      }
      const json cfg = read_json(out / "config.json");
      const json src = read_json(kData + name + "/config.json");
      BOOST_TEST(cfg.at("architectures") == src.at("architectures"));
      BOOST_TEST(cfg.at("bos_token_id") == src.at("bos_token_id"));  // the source's other keys kept
      // The exported folder imports again to the same model.
      json again = config(doc(out.string())).resolved.at("model"), first = config(doc(kData + name)).resolved.at("model");
      again.erase("init_from");
      first.erase("init_from");
      BOOST_TEST(again == first);
    }
  }
}

// An export under every fault base/io_faults.h injects: each write, sync and rename of a
// sharded export with its side files failed in turn. A failed export names the file and
// leaves neither model.safetensors.index.json nor a .tmp file (so transformers never takes
// the folder for a whole model), and a retry into the same folder writes the same bytes as
// an export that never failed. A short transfer changes nothing.
BOOST_AUTO_TEST_CASE(an_export_under_io_faults_never_leaves_a_partial_model) {
  test::TempDir dir("hf_faults");
  json d = doc(kData + "llama3");
  d["checkpoint"] = {{"dir", (dir.path / "ck").string()}};
  std::ostringstream log;
  test::run_ranks(1, [&](int, comm::Communicator& comm) { runtime::Trainer(config(d), comm, log).run(); });
  const std::string ck = (dir.path / "ck").string();
  const fs::path ref = dir.path / "ref";
  std::vector<IoEvent> events;
  {
    auto plan = std::make_shared<RecordingIoPlan>(ref.string());
    ScopedIoFaults faults(plan);
    BOOST_REQUIRE(runtime::export_hf(ck, ref.string(), "fp32", 100000).files > 1);
    events = plan->events();
  }
  auto attempt = [&](const fs::path& out) -> std::string {  // "" when it succeeds
    try {
      runtime::export_hf(ck, out.string(), "fp32", 100000);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  auto bytes_of = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  int cases = 0, renames = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    const IoEvent& e = events[i];
    renames += e.op == IoOp::rename;
    int nth = 1;
    for (size_t j = 0; j < i; ++j) nth += events[j].op == e.op && events[j].path == e.path && events[j].offset == e.offset;
    for (IoFaultKind kind : {IoFaultKind::eio, IoFaultKind::torn, IoFaultKind::short_io}) {
      if (e.op != IoOp::write && kind != IoFaultKind::eio) continue;
      const fs::path out = dir.path / ("case-" + std::to_string(cases++));
      IoEvent target = e;
      const fs::path rel = fs::path(e.path).lexically_relative(ref);
      target.path = rel == "." ? out.string() : (out / rel).string();
      BOOST_TEST_CONTEXT(io_fault_name(kind) << " on " << io_op_name(e.op) << " " << target.path << " @" << e.offset << " #" << nth) {
        std::string err;
        {
          auto plan = std::make_shared<TargetedIoPlan>(target, IoFault{kind, 0}, nth);
          ScopedIoFaults faults(plan);
          err = attempt(out);
          BOOST_TEST(plan->fired());
        }
        if (kind == IoFaultKind::short_io) {
          BOOST_TEST(err.empty(), err);
        } else {
          BOOST_TEST(!err.empty());
          BOOST_TEST(err.find(target.path) != std::string::npos, "the error names " << target.path << ": " << err);
          BOOST_TEST(!fs::exists(out / "model.safetensors.index.json"));
          for (const auto& f : fs::directory_iterator(out))
            BOOST_TEST(f.path().extension() != ".tmp", "left behind: " << f.path());
          const std::string retry = attempt(out);
          BOOST_REQUIRE_MESSAGE(retry.empty(), "the retry: " << retry);
        }
        int files = 0;
        for (const auto& f : fs::directory_iterator(ref)) {
          ++files;
          BOOST_TEST((bytes_of(f.path()) == bytes_of(out / f.path().filename())), f.path().filename());
        }
        BOOST_TEST(std::distance(fs::directory_iterator(out), fs::directory_iterator{}) == files);
      }
      fs::remove_all(out);
    }
  }
  BOOST_TEST(renames >= 4);  // the shards, config.json, the side files, the index
  BOOST_TEST_MESSAGE(events.size() << " operations, " << cases << " faulted exports");
}

BOOST_AUTO_TEST_CASE(fp16_folders_export_bit_exact) {
  test::TempDir dir("hf_fp16");
  json d = doc(kData + "qwen2");
  d["checkpoint"] = {{"dir", (dir.path / "ck").string()}};
  std::ostringstream log;
  test::run_ranks(1, [&](int, comm::Communicator& comm) { runtime::Trainer(config(d), comm, log).run(); });
  runtime::export_hf((dir.path / "ck").string(), (dir.path / "out").string(), "fp16", uint64_t{5} << 30);
  BOOST_TEST(fs::exists(dir.path / "out" / "model.safetensors"));
  BOOST_TEST(!fs::exists(dir.path / "out" / "model.safetensors.index.json"));
  const auto original = tensors_of(kData + "qwen2"), exported = tensors_of((dir.path / "out").string());
  BOOST_TEST(exported.size() == original.size());
  for (const auto& [tensor, value] : original) BOOST_TEST((exported.at(tensor) == value), tensor);
}

BOOST_AUTO_TEST_CASE(loading_gives_the_same_weights_at_every_world_size_stage_and_placement) {
  test::TempDir dir("hf_shards");
  for (const char* name : {"llama3", "gpt2"}) {
    std::vector<std::vector<float>> reference;
    test::run_ranks(1, [&](int, comm::Communicator& comm) {
      std::ostringstream log;
      runtime::Trainer t(config(doc(kData + name)), comm, log);
      for (int u = 0; u < t.model().num_units(); ++u) reference.push_back(t.units().full_weights(u));
    });
    struct Case {
      int world, stage;
      std::string params;
    };
    std::vector<Case> cases;
    for (int world = 1; world <= 3; ++world) {
      for (int stage = 0; stage <= 3; ++stage) cases.push_back({world, stage, "none"});
      cases.push_back({world, 3, "cpu"});
      cases.push_back({world, 3, "nvme"});
    }
    for (const Case& k : cases) {
      BOOST_TEST_CONTEXT(name << " at " << k.world << " ranks, stage " << k.stage << ", params " << k.params) {
        std::vector<std::string> sets = {"zero_optimization.stage=" + std::to_string(k.stage)};
        if (k.params != "none") {
          sets.push_back("zero_optimization.offload_param.device=" + k.params);
          sets.push_back("zero_optimization.offload_param.nvme_path=" + dir.path.string());
        }
        std::vector<std::string> logs(static_cast<size_t>(k.world));
        test::run_ranks(k.world, [&](int rank, comm::Communicator& comm) {
          std::ostringstream log;
          runtime::Trainer t(config(doc(kData + name), sets, k.world), comm, log);
          for (int u = 0; u < t.model().num_units(); ++u) {
            const std::vector<float> w = t.units().full_weights(u);
            if (rank == 0) BOOST_TEST((w == reference[static_cast<size_t>(u)]), "unit " << u);
          }
          logs[static_cast<size_t>(rank)] = log.str();
        });
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_rank_reads_only_its_shard_at_stage_3) {
  const runtime::Config c = config(doc(kData + "llama3"), {"zero_optimization.stage=3"}, 3);
  nn::CpuDevice dev(size_t{64} << 20, 1);
  const std::unique_ptr<nn::Model> model = runtime::make_model(c, dev);
  uint64_t total = 0, whole = 0;
  for (int rank = 0; rank < 3; ++rank) {
    runtime::HfWeights w(c.init_from, c.resolved.at("model"), model->units());
    for (int u = 0; u < model->num_units(); ++u) {
      const runtime::Partition p = runtime::partition(model->units()[static_cast<size_t>(u)].numel, 3, rank);
      std::vector<float> buf(static_cast<size_t>(p.owned_real()));
      w.fill(u, std::min(p.begin(), p.numel), p.owned_real(), buf.data());
    }
    BOOST_TEST_MESSAGE("rank " << rank << " of 3 read " << w.bytes_read() << " bytes");
    total += w.bytes_read();
  }
  for (const auto& [n, t] : tensors_of(kData + "llama3")) whole += t.second.size();
  BOOST_TEST(total == whole);  // the three shards' bytes, each read once
}

BOOST_AUTO_TEST_CASE(what_ferry_cannot_compute_is_refused_by_name) {
  test::TempDir dir("hf_refuse");
  auto broken = [&](const std::string& tag, const std::string& from, const std::function<void(const fs::path&)>& edit) {
    const fs::path p = dir.path / tag;
    copy_folder(kData + from, p);
    edit(p);
    return p.string();
  };
  auto edit_config = [&](const json& patch) {
    return [patch](const fs::path& p) {
      json c = read_json(p / "config.json");
      c.merge_patch(patch);
      write_json(p / "config.json", c);
    };
  };
  auto refused_config = [&](const std::string& folder) { return error_of([&] { config(doc(folder)); }); };
  auto refused_weights = [&](const std::string& folder) {
    const runtime::Config c = config(doc(folder));
    nn::CpuDevice dev(size_t{64} << 20, 1);
    return error_of([&] { import(c, dev); });
  };
  auto names = [](const std::string& msg, std::initializer_list<const char*> parts) {
    for (const char* p : parts) BOOST_TEST((msg.find(p) != std::string::npos), "'" << p << "' in: " << msg);
  };
  names(refused_config(broken("arch", "llama3", edit_config({{"architectures", {"GemmaForCausalLM"}}}))),
        {"arch/config.json", "GemmaForCausalLM", "not supported"});
  names(refused_config(broken("rope", "llama3", edit_config({{"rope_scaling", {{"rope_type", "yarn"}}}}))),
        {"rope/config.json", "rope_scaling", "yarn"});
  names(refused_config(broken("window", "mistral", edit_config({{"sliding_window", 8}}))),
        {"window/config.json", "sliding_window 8", "model.block_size 16"});
  names(refused_config(broken("headdim", "llama3", edit_config({{"head_dim", 16}}))), {"headdim/config.json", "head_dim"});
  names(refused_config(broken("act", "mistral", edit_config({{"hidden_act", "gelu"}}))), {"act/config.json", "hidden_act"});
  // The model.* knobs' ranges hold for the folder's values too (a vocab_size of 2^40 reached
  // the layout, whose products overflowed; tests/fuzz/fuzz_hf_folder.cpp).
  names(refused_config(broken("vocab", "llama3", edit_config({{"vocab_size", int64_t{1} << 40}}))),
        {"vocab/config.json", "key 'model.vocab_size' must be in [1, "});
  names(refused_config(broken("orig", "llama3", edit_config({{"rope_scaling", {{"original_max_position_embeddings", 1e300}}}}))),
        {"orig/config.json", "original_max_position_embeddings' must be a positive integer"});
  names(error_of([&] {
          json d = doc(kData + "llama3");
          d["model"]["n_layer"] = 4;
          config(d);
        }),
        {"test.json", "model.n_layer is 4", "3", "llama3/config.json"});
  // transformers 5's spelling of the same llama3 rope scaling gives the same model keys.
  {
    const std::string v5 = broken("v5", "llama3", [](const fs::path& p) {
      json c = read_json(p / "config.json");
      json rp = c["rope_scaling"];
      rp["rope_theta"] = c["rope_theta"];
      c.erase("rope_scaling");
      c.erase("rope_theta");
      c["rope_parameters"] = rp;
      c["dtype"] = c["torch_dtype"];
      c.erase("torch_dtype");
      write_json(p / "config.json", c);
    });
    json a = config(doc(v5)).resolved.at("model"), b = config(doc(kData + "llama3")).resolved.at("model");
    a.erase("init_from");
    b.erase("init_from");
    BOOST_TEST(a == b);
    BOOST_TEST(a.at("rope_scaling").at("factor") == 8.0);
  }
  // Qwen3: its head_dim is read (16 where hidden / heads is 12); q/k/v biases are not Qwen3's
  // computation; a window it uses is refused as Qwen2's.
  BOOST_TEST(config(doc(kData + "qwen3")).resolved.at("model").at("head_dim") == 16);
  BOOST_TEST(config(doc(kData + "qwen3")).llama.qk_norm);
  names(refused_config(broken("qwen3_bias", "qwen3", edit_config({{"attention_bias", true}}))),
        {"qwen3_bias/config.json", "attention_bias"});
  names(refused_config(broken("qwen3_window", "qwen3", edit_config({{"sliding_window", 8}, {"use_sliding_window", true}}))),
        {"qwen3_window/config.json", "sliding_window 8"});
  names(refused_config(broken("qwen3_odd", "qwen3", edit_config({{"head_dim", 7}}))), {"even head size"});
  // A Qwen2 window the config does not use is no refusal.
  BOOST_CHECK_NO_THROW(config(doc(broken("qwen_window", "qwen2", edit_config({{"sliding_window", 8}, {"use_sliding_window", false}})))));
  // Weights: a missing tensor, an extra one, a wrong shape (rewritten files).
  auto rewrite = [](const fs::path& file, const std::function<void(std::vector<runtime::SafetensorsEntry>&)>& change) {
    runtime::SafetensorsReader r(file.string());
    std::vector<runtime::SafetensorsEntry> entries = r.entries();
    std::vector<std::vector<char>> data;
    for (const auto& e : entries) data.push_back(r.read(e));
    std::vector<runtime::SafetensorsEntry> changed = entries;
    change(changed);
    const fs::path tmp = file.string() + ".new";
    runtime::SafetensorsWriter w(tmp.string(), changed, {});
    for (size_t i = 0; i < changed.size(); ++i) {
      std::vector<char> bytes = i < data.size() ? data[i] : std::vector<char>();
      bytes.resize(w.entries()[i].end - w.entries()[i].begin);
      w.write(i, bytes.data(), bytes.size());
    }
    w.finish();
    fs::rename(tmp, file);
  };
  names(refused_weights(broken("missing", "mistral", [&](const fs::path& p) {
          rewrite(p / "model.safetensors", [](auto& e) {
            std::erase_if(e, [](const auto& t) { return t.name == "model.layers.1.mlp.up_proj.weight"; });
          });
        })),
        {"missing", "model.layers.1.mlp.up_proj.weight", "is missing"});
  names(refused_weights(broken("extra", "mistral", [&](const fs::path& p) {
          rewrite(p / "model.safetensors", [](auto& e) { e.push_back({"model.layers.0.self_attn.o_proj.bias", "F32", {60}}); });
        })),
        {"extra/model.safetensors", "model.layers.0.self_attn.o_proj.bias", "no place"});
  names(refused_weights(broken("shape", "mistral", [&](const fs::path& p) {
          rewrite(p / "model.safetensors", [](auto& e) {
            for (auto& t : e)
              if (t.name == "model.norm.weight") t.shape = {59};
          });
        })),
        {"shape/model.safetensors", "model.norm.weight", "[59]", "[60]"});
  names(refused_config((dir.path / "nowhere").string()), {"nowhere/config.json", "cannot open"});
  // Damaged files: named, never a crash.
  names(refused_weights(broken("truncated", "mistral", [&](const fs::path& p) {
          fs::resize_file(p / "model.safetensors", fs::file_size(p / "model.safetensors") - 100);
        })),
        {"truncated/model.safetensors"});
  names(refused_weights(broken("header", "mistral", [&](const fs::path& p) {
          std::fstream f(p / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
          f.seekp(12);
          f.write("\x01\x02garbage", 9);
        })),
        {"header/model.safetensors", "bad safetensors header"});
  names(refused_weights(broken("hugelen", "mistral", [&](const fs::path& p) {
          std::fstream f(p / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
          const unsigned char len[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
          f.write(reinterpret_cast<const char*>(len), 8);
        })),
        {"hugelen/model.safetensors", "past the end"});
  names(refused_weights(broken("noweights", "mistral", [&](const fs::path& p) { fs::remove(p / "model.safetensors"); })),
        {"noweights: no model.safetensors"});
}

// An empty tensor where the next one starts (the safetensors library writes such files):
// both read whatever their names, so their order, in the header. The check that tensors
// follow each other sorted them by start alone and refused the file when the empty one
// came second (found by tests/fuzz/fuzz_safetensors.cpp).
BOOST_AUTO_TEST_CASE(an_empty_tensor_beside_another_is_read_in_any_order) {
  test::TempDir dir("hf_empty_tensor");
  for (const std::string empty : {"0_empty", "z_empty"}) {
    std::string header = R"({"a":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"F16","shape":[1],)"
                         R"("data_offsets":[12,14]},")";
    header += empty;
    header += R"(":{"dtype":"F16","shape":[0,5],"data_offsets":[12,12]}})";
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i) file[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    file += header;
    file.append(14, '\x3c');
    const fs::path p = dir.path / (empty + ".safetensors");
    std::ofstream(p, std::ios::binary) << file;
    runtime::SafetensorsReader r(p.string());
    BOOST_TEST_REQUIRE(r.entries().size() == 3u);
    for (const runtime::SafetensorsEntry& e : r.entries()) BOOST_TEST(r.read(e).size() == (e.name == "b" ? 2u : e.name == "a" ? 12u : 0u));
  }
}

// Header numbers that are not integers of their field's range are refused naming the file
// (converting a float such as 1.92e210 was undefined behaviour; tests/fuzz/fuzz_safetensors.cpp).
BOOST_AUTO_TEST_CASE(safetensors_header_numbers_must_be_integers_in_range) {
  test::TempDir dir("hf_header_numbers");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,1.92e210]}})", "tensor x's data_offsets is 1.92e+210"},
      {R"({"x":{"dtype":"F32","shape":[2.5],"data_offsets":[0,4]}})", "tensor x's shape is 2.5"},
      {R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", "tensor x's data_offsets is -4"},
      {R"({"x":{"dtype":"F32","shape":7,"data_offsets":[0,4]}})", "tensor x's shape is not a list"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string& header = cases[i].first;
    std::string file(8, '\0');
    for (int b = 0; b < 8; ++b) file[static_cast<size_t>(b)] = static_cast<char>((header.size() >> (8 * b)) & 0xff);
    file += header;
    file.append(4, '\0');
    const fs::path p = dir.path / (std::to_string(i) + ".safetensors");
    std::ofstream(p, std::ios::binary) << file;
    const std::string err = error_of([&] { runtime::SafetensorsReader r(p.string()); });
    BOOST_TEST(err.find(p.string() + ": bad safetensors header: " + cases[i].second) != std::string::npos, err);
  }
}

BOOST_AUTO_TEST_CASE(fine_tuning_starts_at_the_imported_loss_and_falls) {
  for (const char* name : {"llama3", "gpt2", "qwen2"}) {
    BOOST_TEST_CONTEXT(name) {
      const runtime::Config c = config(doc(kData + name, 40), {"zero_optimization.stage=3"}, 2);
      // The first step's batch, scored by the imported weights outside the trainer.
      nn::CpuDevice dev(size_t{64} << 20, 1);
      Imported m = import(c, dev);
      const runtime::TokenData data = runtime::TokenData::load(runtime::data_options(c));
      const runtime::BatchSampler sampler(data, c.data.seed, c.micro_batch, c.model.block_size);
      double first = 0;
      for (int rank = 0; rank < 2; ++rank) {
        const runtime::Batch b = sampler.train_batch(0, 0, rank, 2);
        first += forward(dev, m, b.inputs, b.targets, b.B, b.T) / 2;
      }
      std::vector<runtime::StepStats> steps;
      std::string log0;
      test::run_ranks(2, [&](int rank, comm::Communicator& comm) {
        std::ostringstream log;
        runtime::TrainReport r = runtime::Trainer(c, comm, log).run();
        if (rank == 0) {
          steps = r.steps;
          log0 = log.str();
        }
      });
      BOOST_TEST_MESSAGE(name << ": step 1 loss " << steps.front().loss << " (imported weights: " << first << "), step 40 "
                              << steps.back().loss);
      BOOST_TEST(std::abs(steps.front().loss - first) < 1e-5);
      double last10 = 0;
      for (size_t i = steps.size() - 10; i < steps.size(); ++i) last10 += steps[i].loss / 10;
      BOOST_TEST(last10 < first - 0.5);
      BOOST_TEST(log0.find("weights: from " + kData + name) != std::string::npos);
    }
  }
}

// The files a run carries from its source folder into checkpoints and back out through
// export --hf: config.json and every tokenizer, chat-template and generation file (those
// transformers 5 writes included: chat_template.jinja, additional_chat_templates/*.jinja),
// never the weights.
BOOST_AUTO_TEST_CASE(side_files_are_every_tokenizer_chat_and_generation_file) {
  const std::string folder = std::string(FERRY_SOURCE_DIR) + "/tests/data/user_files/models/llama3-instruct";
  const std::vector<std::string> want = {"additional_chat_templates/tool_use.jinja", "chat_template.jinja", "config.json",
                                         "generation_config.json", "tokenizer.json", "tokenizer_config.json"};
  BOOST_TEST(runtime::hf_side_files(folder) == want, boost::test_tools::per_element());
  test::TempDir dir("hf_side_files");
  for (const char* f : {"vocab.json", "merges.txt", "tokenizer.model", "qwen.tiktoken", "added_tokens.json",
                        "special_tokens_map.json", "chat_template.json", "model.safetensors", "pytorch_model.bin",
                        "README.md"}) {
    std::ofstream(dir.path / f) << "x";
  }
  const std::vector<std::string> carried = {"added_tokens.json", "chat_template.json", "merges.txt", "qwen.tiktoken",
                                            "special_tokens_map.json", "tokenizer.model", "vocab.json"};
  BOOST_TEST(runtime::hf_side_files(dir.path.string()) == carried, boost::test_tools::per_element());
  BOOST_TEST(runtime::hf_side_files((dir.path / "missing").string()).empty());
}
