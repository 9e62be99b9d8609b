// Checkpoints in one process (ranks are threads on the fake communicator):
// - N steps straight vs N/2, save, a fresh trainer resuming for N/2: bit-identical losses
//   and final weights (stage 3, optimizer state on NVMe; world sizes 1 and 2);
// - saved at 2 ranks, loaded at 1, 3 and 4 (and saved at 1 and 3, loaded at 2), under
//   other stages and placements: the losses continue the uninterrupted run within the
//   cross-world-size tolerance of the sharding tests;
// - export to safetensors and back, every tensor compared with the model's weights;
// - damaged checkpoints refused with a message naming the file, older ones kept;
// - a stop request ends the run after one step with a checkpoint.
#define BOOST_TEST_MODULE checkpoint
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <ostream>

#include "base/crc32c.h"
#include "base/io_faults.h"
#include "base/stop_signal.h"
#include "nn/dtype.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/ckpt/export.h"
#include "runtime/ckpt/safetensors.h"
#include "runtime/train/trainer.h"
#include "test_util.h"

using namespace ferry;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// 12 sequences per step at every world size: 1x(2x6), 2x(2x3), 3x(2x2), 4x(3x1); the
// sampler numbers sequences globally, so every layout sees the same batch.
json doc(int world, int64_t steps) {
  const int micro = world == 4 ? 3 : 2;
  const int accum = 12 / (micro * world);
  return {{"model", {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"block_size", 16}}},
          {"data", {{"path", std::string(FERRY_SOURCE_DIR) + "/tests/data/kjv-64k.txt"}}},
          {"device", {{"memory", "64MiB"}, {"threads", 1}}},
          {"train_micro_batch_size_per_gpu", micro},
          {"gradient_accumulation_steps", accum},
          {"gradient_clipping", 0.5},
          {"optimizer", {{"params", {{"lr", 0.003}, {"weight_decay", 0.1}}}}},
          {"scheduler", {{"type", "WarmupDecayLR"}, {"params", {{"warmup_num_steps", 2}, {"total_num_steps", 6}}}}},
          {"train", {{"steps", steps}, {"eval_every", 0}, {"eval_batches", 1}, {"sample_tokens", 0}}}};
}

void place(json& d, int stage, const std::string& opt, const std::string& par, const fs::path& nvme) {
  d["zero_optimization"] = {{"stage", stage},
                            {"offload_optimizer", {{"device", opt}, {"nvme_path", nvme.string()}}},
                            {"offload_param", {{"device", par}, {"nvme_path", nvme.string()}, {"buffer_size", 4096}}}};
}

struct Run {
  std::vector<double> losses;  // of the steps this run took
  std::vector<std::vector<float>> weights;
  runtime::TrainReport report;
};

// Trains `d` at world size `world` (threads); rank 0's results.
Run train(const json& d, int world, const std::vector<std::string>& sets = {}) {
  Run out;
  std::mutex mu;
  test::run_ranks(world, [&](int rank, comm::Communicator& c) {
    std::ostream discard(nullptr);
    runtime::Trainer t(runtime::config_from_json(d, "test", "", sets, world), c, discard);
    const runtime::TrainReport rep = t.run();
    std::vector<std::vector<float>> w;
    for (int u = 0; u < t.model().num_units(); ++u) w.push_back(t.units().full_weights(u));  // collective
    if (rank != 0) return;
    std::lock_guard<std::mutex> lock(mu);
    out.report = rep;
    for (const auto& s : rep.steps) out.losses.push_back(s.loss);
    out.weights = std::move(w);
  });
  return out;
}

void check_close(const Run& a, const std::vector<double>& expected_losses, const Run& expected) {
  BOOST_REQUIRE_EQUAL(a.losses.size(), expected_losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) BOOST_TEST(a.losses[i] == expected_losses[i], boost::test_tools::tolerance(1e-5));
  double worst = 0;
  for (size_t u = 0; u < a.weights.size(); ++u)
    for (size_t i = 0; i < a.weights[u].size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(a.weights[u][i]) - expected.weights[u][i]));
  BOOST_TEST(worst < 5e-5, "worst final weight difference " << worst);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

BOOST_AUTO_TEST_CASE(crc32c_known_values) {
  BOOST_TEST(crc32c("123456789", 9) == 0xE3069283u);  // the standard check value
  BOOST_TEST(crc32c("", 0) == 0u);
  std::vector<unsigned char> big(100003);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<unsigned char>(i * 131 + 7);
  const uint32_t whole = crc32c(big.data(), big.size());
  BOOST_TEST(crc32c(big.data() + 777, big.size() - 777, crc32c(big.data(), 777)) == whole);
  BOOST_TEST(crc32c_combine(crc32c(big.data(), 777), crc32c(big.data() + 777, big.size() - 777),
                                     big.size() - 777) == whole);
  BOOST_TEST(crc32c_combine(whole, crc32c("", 0), 0) == whole);
  big[5000] ^= 1;
  BOOST_TEST(crc32c(big.data(), big.size()) != whole);
}

BOOST_AUTO_TEST_CASE(resume_continues_bit_identically) {
  for (int world : {1, 2}) {
    BOOST_TEST_CONTEXT("world " << world) {
      test::TempDir dir("checkpoint");
      const fs::path nvme = dir.path / "nvme", ck = dir.path / "ckpt";
      fs::create_directories(nvme);
      json d = doc(world, 6);
      place(d, 3, "nvme", world == 1 ? "nvme" : "cpu", nvme);
      const Run straight = train(d, world);
      d["checkpoint"] = {{"dir", ck.string()}};
      const Run first = train(d, world, {"train.steps=3"});
      BOOST_TEST(first.report.last_checkpoint == (ck / "step-00000003").string());
      d["checkpoint"]["resume"] = "auto";
      const Run second = train(d, world);
      BOOST_TEST(second.report.resumed_from == 3);
      BOOST_REQUIRE_EQUAL(second.losses.size(), 3u);
      for (size_t i = 0; i < 3; ++i) {
        BOOST_TEST(first.losses[i] == straight.losses[i]);
        BOOST_TEST(second.losses[i] == straight.losses[3 + i]);  // bit for bit
      }
      BOOST_REQUIRE_EQUAL(second.weights.size(), straight.weights.size());
      for (size_t u = 0; u < straight.weights.size(); ++u)
        BOOST_TEST(std::memcmp(second.weights[u].data(), straight.weights[u].data(), straight.weights[u].size() * 4) == 0);
      BOOST_TEST(runtime::list_checkpoints(ck.string()) == (std::vector<std::string>{"step-00000003", "step-00000006"}));
    }
  }
}

BOOST_AUTO_TEST_CASE(loads_at_another_world_size_stage_and_placement) {
  test::TempDir dir("checkpoint");
  const fs::path nvme = dir.path / "nvme";
  fs::create_directories(nvme);
  struct Side {
    int world, stage;
    const char *opt, *par;
  };
  // (saved by, loaded by): every stage and tier appears on each side.
  const std::vector<std::pair<Side, Side>> cases = {
      {{2, 3, "nvme", "none"}, {1, 0, "none", "none"}},
      {{2, 3, "nvme", "none"}, {3, 2, "nvme", "none"}},
      {{2, 3, "nvme", "none"}, {4, 3, "nvme", "nvme"}},
      {{1, 0, "none", "none"}, {2, 3, "cpu", "cpu"}},
      {{3, 1, "cpu", "none"}, {2, 2, "none", "none"}},
      {{4, 3, "none", "nvme"}, {2, 1, "nvme", "none"}},
  };
  json base = doc(2, 6);
  place(base, 3, "nvme", "none", nvme);
  const Run reference = train(base, 2);  // uninterrupted, 2 ranks
  for (const auto& [save, load] : cases) {
    BOOST_TEST_CONTEXT("saved at " << save.world << " ranks stage " << save.stage << " " << save.opt << "/" << save.par
                                   << ", loaded at " << load.world << " ranks stage " << load.stage << " " << load.opt
                                   << "/" << load.par) {
      const fs::path ck = dir.path / ("ck" + std::to_string(save.world) + std::to_string(load.world) + std::to_string(load.stage));
      json a = doc(save.world, 6);
      place(a, save.stage, save.opt, save.par, nvme);
      a["checkpoint"] = {{"dir", ck.string()}};
      const Run first = train(a, save.world, {"train.steps=3"});
      json b = doc(load.world, 6);
      place(b, load.stage, load.opt, load.par, nvme);
      b["checkpoint"] = {{"dir", ck.string()}, {"resume", "auto"}};
      const Run second = train(b, load.world);
      BOOST_TEST(second.report.resumed_from == 3);
      check_close(second, {reference.losses.begin() + 3, reference.losses.end()}, reference);
    }
  }
}

BOOST_AUTO_TEST_CASE(export_round_trips_every_tensor) {
  test::TempDir dir("checkpoint");
  const fs::path ck = dir.path / "ckpt";
  json d = doc(2, 2);
  place(d, 3, "none", "none", dir.path);
  d["checkpoint"] = {{"dir", ck.string()}};
  const Run run = train(d, 2);
  comm::SingleProcessCommunicator alone;
  std::ostream discard(nullptr);
  runtime::Trainer model_only(runtime::config_from_json(doc(1, 2), "test", "", {}), alone, discard);
  const auto layout = model_only.model().units();
  for (const std::string dtype : {"fp32", "bf16"}) {
    BOOST_TEST_CONTEXT(dtype) {
      const fs::path out = dir.path / ("model-" + dtype + ".safetensors");
      const runtime::ExportReport rep = runtime::export_safetensors(ck.string(), out.string(), dtype);
      BOOST_TEST(rep.step == 2);
      BOOST_TEST(rep.parameters == model_only.model().num_parameters());
      runtime::SafetensorsReader reader(out.string());  // checks offsets: contiguous, sized by shape x dtype
      BOOST_TEST(reader.metadata().at("format") == "pt");
      BOOST_REQUIRE_EQUAL(reader.entries().size(), 4u + 12u * 2u);
      std::map<std::string, runtime::SafetensorsEntry> by_name;
      for (const auto& e : reader.entries()) by_name[e.name] = e;
      for (size_t u = 0; u < layout.size(); ++u) {
        for (const nn::TensorSpec& t : layout[u].tensors) {
          const std::string name = t.name + (t.name == "wte" || t.name == "wpe" ? ".weight" : "");
          BOOST_REQUIRE_MESSAGE(by_name.count(name), "missing " << name);
          const runtime::SafetensorsEntry& e = by_name[name];
          const bool conv = runtime::gpt2_conv1d_weight(t.name);
          std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
          if (conv) std::swap(shape[0], shape[1]);
          BOOST_TEST(e.shape == shape);
          BOOST_TEST(e.dtype == (dtype == "fp32" ? "F32" : "BF16"));
          const std::vector<char> bytes = reader.read(e);
          const int64_t rows = t.shape[0], cols = t.shape.size() > 1 ? t.shape[1] : 1;
          int64_t bad = 0;
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t c = 0; c < cols; ++c) {
              const float want = run.weights[u][static_cast<size_t>(t.offset + r * cols + c)];
              const int64_t at = conv ? c * rows + r : r * cols + c;  // HF keeps Conv1D as [in, out]
              if (dtype == "fp32") {
                float got;
                std::memcpy(&got, bytes.data() + at * 4, 4);
                bad += std::memcmp(&got, &want, 4) != 0;
              } else {
                uint16_t got;
                std::memcpy(&got, bytes.data() + at * 2, 2);
                bad += got != nn::f32_to_bf16(want);
              }
            }
          }
          BOOST_TEST(bad == 0, name << ": " << bad << " elements differ");
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(damaged_checkpoints_are_refused_by_name) {
  test::TempDir dir("checkpoint");
  const fs::path ck = dir.path / "ckpt";
  json d = doc(2, 4);
  place(d, 2, "none", "none", dir.path);
  d["checkpoint"] = {{"dir", ck.string()}, {"every_steps", 2}, {"keep_last", 0}};
  train(d, 2);
  const fs::path good = ck / "step-00000004";
  struct Case {
    std::string what;
    std::function<void(const fs::path&)> damage;
    std::string message;  // expected in the error
    std::vector<std::string> sets = {};
  };
  const std::vector<Case> cases = {
      {"truncated", [](const fs::path& p) { fs::resize_file(p / "rank-00001.bin", fs::file_size(p / "rank-00001.bin") - 100); },
       "rank-00001.bin is "},
      {"bad checksum",
       [](const fs::path& p) {
         std::fstream f(p / "rank-00000.bin", std::ios::in | std::ios::out | std::ios::binary);
         f.seekp(4000);
         f.put('\x5a');
       },
       "rank-00000.bin: unit 0 (embedding) master, elements [0, "},
      {"missing rank file", [](const fs::path& p) { fs::remove(p / "rank-00001.bin"); }, "rank-00001.bin is missing (saved by 2 ranks)"},
      {"missing manifest", [](const fs::path& p) { fs::remove(p / "manifest.json"); }, "manifest.json is missing (an incomplete checkpoint"},
      {"unknown version",
       [](const fs::path& p) {
         json m = json::parse(std::ifstream(p / "manifest.json"));
         m["format_version"] = 99;
         std::ofstream(p / "manifest.json") << m.dump();
       },
       "checkpoint format version 99"},
      {"other model shape", [](const fs::path&) {}, "model.n_embd is 32 in the checkpoint but 48 in the config",
       {"model.n_embd=48"}},
  };
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      const fs::path copy = dir.path / ("bad-" + std::to_string(&c - cases.data()));
      fs::copy(good, copy);
      c.damage(copy);
      json r = doc(2, 6);
      place(r, 2, "none", "none", dir.path);
      r["checkpoint"] = {{"dir", (dir.path / "other").string()}, {"resume", copy.string()}};
      const std::string err = error_of([&] { train(r, 2, c.sets); });
      BOOST_TEST(err.find(c.message) != std::string::npos, "got: " << err);
      if (c.what == "truncated") BOOST_TEST(err.find("(truncated)") != std::string::npos, err);
      BOOST_TEST(err.find(copy.string()) != std::string::npos, "the message names the checkpoint: " << err);
    }
  }
  // Nothing was deleted or moved: the good checkpoints are still there and still load.
  BOOST_TEST(runtime::list_checkpoints(ck.string()) == (std::vector<std::string>{"step-00000002", "step-00000004"}));
  std::ofstream(ck / "latest") << "step-00000009\n";
  json r = doc(1, 6);
  r["checkpoint"] = {{"dir", ck.string()}, {"resume", "auto"}};
  const std::string err = error_of([&] { train(r, 1); });
  BOOST_TEST(err.find("names 'step-00000009', which is not a checkpoint directory") != std::string::npos, err);
  r["checkpoint"]["resume"] = good.string();
  BOOST_TEST(train(r, 1).report.resumed_from == 4);
}

namespace {

// A checkpoint folder as checkpoint.cpp writes one, small enough to edit by hand: one unit
// "u" of 6 elements (tensor "w" [2, 3]) saved by 2 ranks, 3 elements each; every array
// holds element i of rank r's slice as r * 3 + i (+ 10 for m, + 20 for v).
void write_small_checkpoint(const fs::path& dir, const std::function<void(json& manifest, json& index0)>& damage) {
  fs::create_directories(dir);
  json manifest = {{"format", "ferry-checkpoint"}, {"format_version", 1}, {"ferry_version", "0"}, {"step", 3},
                   {"world_size", 2}, {"stage", 3}, {"model", json::object()}, {"trainer", json::object()},
                   {"units", {{{"name", "u"}, {"numel", 6},
                               {"tensors", {{{"name", "w"}, {"shape", {2, 3}}, {"offset", 0}, {"decay", true}}}}}}}};
  std::vector<json> index(2);
  for (int r = 0; r < 2; ++r) {
    std::string bytes;
    json segments = json::array();
    for (int a = 0; a < 3; ++a) {
      float v[3];
      for (int i = 0; i < 3; ++i) v[i] = static_cast<float>(r * 3 + i + 10 * a);
      segments.push_back({{"unit", 0}, {"array", a}, {"begin", r * 3}, {"count", 3}, {"offset", bytes.size()},
                          {"crc32c", crc32c(v, sizeof v)}});
      bytes.append(reinterpret_cast<const char*>(v), sizeof v);
    }
    index[static_cast<size_t>(r)] = {{"rank", r}, {"world_size", 2}, {"bytes", bytes.size()}, {"segments", segments}};
    std::ofstream(dir / runtime::rank_file(r, "bin"), std::ios::binary) << bytes;
  }
  damage(manifest, index[0]);
  std::ofstream(dir / "manifest.json") << manifest.dump();
  for (int r = 0; r < 2; ++r) std::ofstream(dir / runtime::rank_file(r, "json")) << index[static_cast<size_t>(r)].dump();
}

}  // namespace

// `latest` names a checkpoint folder inside the checkpoint directory: a name with a '/'
// (which made it any path: "/x" replaced the directory), "..", or one too long for the file
// system (is_directory threw its own error, naming neither file) is refused naming `latest`
// (found by tests/fuzz/fuzz_checkpoint.cpp).
BOOST_AUTO_TEST_CASE(latest_names_a_folder_in_the_checkpoint_directory) {
  test::TempDir dir("checkpoint_latest");
  fs::create_directories(dir.path / "step-00000001");
  fs::create_directories(dir.path / "elsewhere" / "step-00000001");
  const std::string latest = (dir.path / "latest").string();
  std::ofstream(latest) << "step-00000001\n";
  BOOST_TEST(runtime::resolve_resume("auto", dir.path.string()) == (dir.path / "step-00000001").string());
  for (const std::string& name : {(dir.path / "elsewhere" / "step-00000001").string(), std::string("elsewhere/step-00000001"),
                                 std::string(".."), std::string(5000, 'x')}) {
    std::ofstream(latest) << name << "\n";
    std::string err;
    try {
      runtime::resolve_resume("auto", dir.path.string());
    } catch (const runtime::CheckpointError& e) {
      err = e.what();
    }
    BOOST_TEST(err.starts_with(latest + " names '" + name + "', which is not a checkpoint directory there"),
               "for " << name.substr(0, 40) << ": " << err.substr(0, 200));
  }
}

// What the fuzz target (tests/fuzz/fuzz_checkpoint.cpp) found or showed, each now refused
// when the reader opens the checkpoint, naming the file: fields of another JSON type, floats
// where integers belong (converting them was undefined behaviour), a world size that sized
// an allocation before any rank file was read (3 x world_size x units segments: 100 GB for
// 2^30), segments outside their unit or their data file (the tiling sum overflowed), and
// tensors of the manifest outside their unit.
BOOST_AUTO_TEST_CASE(damaged_indexes_and_manifests_are_refused_when_opened) {
  test::TempDir dir("checkpoint_fields");
  {
    const fs::path good = dir.path / "good";
    write_small_checkpoint(good, [](json&, json&) {});
    runtime::CheckpointReader reader(good.string());
    std::vector<float> m(6);
    reader.read(0, 1, 0, 6, m.data());
    BOOST_TEST(m == (std::vector<float>{10, 11, 12, 13, 14, 15}), boost::test_tools::per_element());
  }
  struct Case {
    std::string what;
    std::function<void(json&, json&)> damage;
    std::string file, message;  // the file named, and the problem
  };
  const std::vector<Case> cases = {
      {"negative world size", [](json& m, json&) { m["world_size"] = -1; }, "manifest.json", "world_size -1"},
      {"float world size", [](json& m, json&) { m["world_size"] = 1e300; }, "manifest.json", "world_size is 1e+300"},
      {"huge world size", [](json& m, json&) { m["world_size"] = 1 << 30; }, "rank-00002.json",
       "is missing (saved by 1073741824 ranks"},
      {"string numel", [](json& m, json&) { m["units"][0]["numel"] = "6"; }, "manifest.json", "numel is \"6\""},
      {"count overflowing the unit", [](json&, json& i) { i["segments"][0]["count"] = INT64_MAX; }, "rank-00000.json",
       "lies outside the unit's 6 elements"},
      {"offset past the data", [](json&, json& i) { i["segments"][2]["offset"] = 30; }, "rank-00000.json",
       "or the data file's 36 bytes"},
      {"float checksum", [](json&, json& i) { i["segments"][1]["crc32c"] = 4.2e135; }, "rank-00000.json",
       "crc32c is 4.2e+135"},
      {"tensor outside its unit", [](json& m, json&) { m["units"][0]["tensors"][0]["shape"] = {2, 4}; }, "manifest.json",
       "tensor w [2,4] at offset 0 does not fit the unit's 6 elements"},
      {"tensor without offset", [](json& m, json&) { m["units"][0]["tensors"][0].erase("offset"); }, "manifest.json",
       "missing or malformed field"},
  };
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      const fs::path p = dir.path / (std::string("case-") + std::to_string(&c - cases.data()));
      write_small_checkpoint(p, c.damage);
      std::string err;
      try {
        runtime::CheckpointReader reader(p.string());
      } catch (const runtime::CheckpointError& e) {
        err = e.what();
      }
      BOOST_TEST(err.find((p / c.file).string()) != std::string::npos, "names " << c.file << ": " << err);
      BOOST_TEST(err.find(c.message) != std::string::npos, "says '" << c.message << "': " << err);
    }
  }
}

namespace {

// The same event in another copy of the checkpoint folder.
IoEvent moved(IoEvent e, const fs::path& from, const fs::path& to) {
  const fs::path rel = fs::path(e.path).lexically_relative(from);
  e.path = rel == "." ? to.string() : (to / rel).string();
  return e;
}

std::string describe(const IoEvent& e, IoFaultKind k) {
  return std::string(io_fault_name(k)) + " on " + io_op_name(e.op) + " " + e.path + " @" + std::to_string(e.offset);
}

// What `latest` in `dir` names, "" when it is missing.
std::string latest_in(const fs::path& dir) {
  std::ifstream in(dir / "latest");
  std::string name;
  in >> name;
  return name;
}

}  // namespace

// Every I/O operation a checkpoint save makes (the rank files' writes and syncs, the
// indexes, the manifest, the renames and directory syncs, `latest`), failed in turn with
// each fault base/io_faults.h injects: a failed save says which file, `latest` always names
// a complete checkpoint, and resuming from it ends with the uninterrupted run's weights, bit
// for bit. Short transfers and delays must not fail the save at all. Then the same for a
// step saved a second time (a resume from an older one), where the new step replaces the
// one `latest` names.
BOOST_AUTO_TEST_CASE(every_operation_of_a_checkpoint_save_fails_safely) {
  test::TempDir dir("ckfault");
  const fs::path base = dir.path / "base";
  json d = doc(2, 4);
  place(d, 3, "none", "none", dir.path);
  const Run straight = train(d, 2);
  d["checkpoint"] = {{"dir", base.string()}, {"keep_last", 0}};
  train(d, 2, {"train.steps=2"});
  BOOST_REQUIRE_EQUAL(latest_in(base), "step-00000002");
  d["checkpoint"]["resume"] = "auto";

  // Which operations a save of step 3 makes, recorded on a copy.
  const fs::path rec = dir.path / "recorded";
  fs::copy(base, rec, fs::copy_options::recursive);
  std::vector<IoEvent> events;
  {
    json r = d;
    r["checkpoint"]["dir"] = rec.string();
    auto plan = std::make_shared<RecordingIoPlan>(rec.string());
    ScopedIoFaults faults(plan);
    train(r, 2, {"train.steps=3"});
    events = plan->events();
  }
  int writes = 0, syncs = 0, renames = 0;
  for (const IoEvent& e : events) {
    writes += e.op == IoOp::write, syncs += e.op == IoOp::sync, renames += e.op == IoOp::rename;
  }
  BOOST_TEST_MESSAGE(events.size() << " operations: " << writes << " writes, " << syncs << " syncs, " << renames << " renames");
  BOOST_REQUIRE(writes >= 6);   // 2 rank files and 2 indexes, the manifest, latest
  BOOST_REQUIRE(syncs >= 8);    // each of those, and the directories
  BOOST_REQUIRE(renames >= 3);  // the manifest, the step folder, latest

  // One sweep: each recorded event failed with each fault, on a fresh copy of `from`.
  // resave: resume from the copy's step 2 while its `latest` names a step 3, and fail only
  // the renames and syncs (the writes are those of the first sweep).
  auto sweep = [&](const fs::path& from, bool resave) {
    int cases = 0;
    for (size_t i = 0; i < events.size(); ++i) {
      const IoEvent& recorded = events[i];
      int nth = 1;  // the same (op, path, offset) seen before: a folder synced twice
      for (size_t j = 0; j < i; ++j)
        nth += events[j].op == recorded.op && events[j].path == recorded.path && events[j].offset == recorded.offset;
      if (resave && recorded.op == IoOp::write) continue;
      for (IoFaultKind kind : {IoFaultKind::eio, IoFaultKind::enospc, IoFaultKind::torn, IoFaultKind::short_io, IoFaultKind::delay}) {
        const bool transfer = recorded.op == IoOp::write;
        if (!transfer && (kind == IoFaultKind::torn || kind == IoFaultKind::short_io)) continue;  // eio or nothing there
        const fs::path w = dir.path / ("case-" + std::to_string(cases++));
        fs::copy(from, w, fs::copy_options::recursive);
        const IoEvent target = moved(recorded, rec, w);
        BOOST_TEST_CONTEXT(describe(target, kind) << " #" << nth) {
          json r = d;
          r["checkpoint"]["dir"] = w.string();
          if (resave) r["checkpoint"]["resume"] = (w / "step-00000002").string();
          std::string err;
          bool fired;
          {
            auto plan = std::make_shared<TargetedIoPlan>(target, IoFault{kind, 5}, nth);
            ScopedIoFaults faults(plan);
            err = error_of([&] { train(r, 2, {"train.steps=3"}); });
            fired = plan->fired();
          }
          BOOST_TEST(fired);
          const bool harmless = kind == IoFaultKind::delay || kind == IoFaultKind::short_io;
          if (harmless) {
            BOOST_TEST(err.empty(), err);
            BOOST_TEST(latest_in(w) == "step-00000003");
          } else {
            BOOST_TEST(!err.empty());
            // The failing file, or for a directory sync or a rename, the folder or target.
            BOOST_TEST(err.find(target.path) != std::string::npos, "the error names " << target.path << ": " << err);
          }
          const std::string latest = latest_in(w);
          BOOST_TEST((latest == "step-00000002" || latest == "step-00000003"), "latest: '" << latest << "'");
          // Whatever `latest` names resumes to the uninterrupted run's end, bit for bit.
          r["checkpoint"]["resume"] = "auto";
          Run resumed;
          const std::string err2 = error_of([&] { resumed = train(r, 2); });
          BOOST_REQUIRE_MESSAGE(err2.empty(), "resuming after the fault: " << err2);
          BOOST_TEST(resumed.report.resumed_from == (latest == "step-00000003" ? 3 : 2));
          BOOST_REQUIRE_EQUAL(resumed.weights.size(), straight.weights.size());
          for (size_t u = 0; u < straight.weights.size(); ++u)
            BOOST_TEST(std::memcmp(resumed.weights[u].data(), straight.weights[u].data(), straight.weights[u].size() * 4) == 0,
                       "unit " << u);
        }
        fs::remove_all(w);
      }
    }
    return cases;
  };
  const int first = sweep(base, false);

  // Step 3 saved again from step 2 while `latest` names the first step 3: the new one
  // takes its place (the rename and sync events are the ones that differ).
  const fs::path twice = dir.path / "twice";
  fs::copy(base, twice, fs::copy_options::recursive);
  {
    json r = d;
    r["checkpoint"]["dir"] = twice.string();
    train(r, 2, {"train.steps=3"});
  }
  BOOST_REQUIRE_EQUAL(latest_in(twice), "step-00000003");
  const int second = sweep(twice, true);
  BOOST_TEST_MESSAGE(first << " + " << second << " faulted saves");
}

// The real handler, through raise(): one request delivered twice at once (Slurm signals
// the ranks and mpiexec forwards its copy) is one request; a later one exits at once.
BOOST_AUTO_TEST_CASE(a_duplicate_stop_signal_is_one_request_and_a_later_one_exits) {
  int pipefd[2];
  BOOST_REQUIRE(pipe(pipefd) == 0);
  const pid_t child = fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) {  // the handler _exits the process, so it runs in a child
    close(pipefd[0]);
    install_stop_handlers();
    raise(SIGTERM);
    raise(SIGTERM);  // the same request's second copy: no exit
    const char survived = stop_signal() == SIGTERM ? 'y' : 'n';
    if (write(pipefd[1], &survived, 1) != 1) _exit(3);
    usleep(useconds_t(kDuplicateWindowNs / 1000 + 200000));
    raise(SIGTERM);  // on purpose, later: exits with 128 + SIGTERM
    _exit(4);
  }
  close(pipefd[1]);
  char survived = 0;
  BOOST_TEST(read(pipefd[0], &survived, 1) == 1);
  close(pipefd[0]);
  BOOST_TEST(survived == 'y');
  int status = 0;
  BOOST_REQUIRE(waitpid(child, &status, 0) == child);
  BOOST_REQUIRE(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 128 + SIGTERM);
}

BOOST_AUTO_TEST_CASE(a_stop_request_saves_and_ends_after_the_step) {
  test::TempDir dir("checkpoint");
  const fs::path ck = dir.path / "ckpt";
  json d = doc(2, 6);
  place(d, 3, "none", "none", dir.path);
  d["checkpoint"] = {{"dir", ck.string()}};
  request_stop(SIGTERM);  // as the handler does on the first signal
  const Run run = train(d, 2);
  request_stop(0);
  BOOST_TEST(run.report.stopped);
  BOOST_TEST(run.losses.size() == 1u);
  std::string latest;
  std::ifstream(ck / "latest") >> latest;
  BOOST_TEST(latest == "step-00000001");
}
