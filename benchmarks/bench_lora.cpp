// ferry bench lora: LoRA and QLoRA training steps against PEFT on PyTorch eager (issue 40).
#include "benchmarks/bench_lora.h"

#include <omp.h>

#include <functional>
#include <memory>
#include <ostream>

#include "benchmarks/peer_process.h"
#include "comm/communicator.h"
#include "runtime/train/trainer.h"

namespace ferry::bench {

namespace {

struct Shape {
  int64_t n_layer, n_head, n_kv_head, n_embd, intermediate, vocab, block, batch;
};

Shape shape_of(bool quick) {
  // A Llama of 4 x 512 (SwiGLU 1376) over a byte vocabulary: the projections, which carry
  // the adapters and the NF4 base, are most of the work, as in a real fine-tune.
  if (quick) return {2, 2, 2, 64, 172, 256, 32, 2};
  return {4, 8, 8, 512, 1376, 256, 128, 4};
}

constexpr int64_t kRank = 16;
constexpr double kAlpha = 32;

nlohmann::json bench_doc(const Shape& s, bool qlora, int threads) {
  nlohmann::json doc = {
      {"model",
       {{"arch", "llama"}, {"n_layer", s.n_layer}, {"n_head", s.n_head}, {"n_kv_head", s.n_kv_head}, {"n_embd", s.n_embd},
        {"intermediate_size", s.intermediate}, {"vocab_size", s.vocab}, {"block_size", s.block}}},
      {"data", {{"path", std::string(FERRY_SOURCE_DIR) + "/examples/data/kjv.txt"}, {"tokenizer", "bytes"}}},
      {"device", {{"memory", "8GiB"}}},
      {"train_micro_batch_size_per_gpu", s.batch},
      {"optimizer", {{"params", {{"lr", 1e-4}, {"weight_decay", 0.0}}}}},
      {"lora", {{"r", kRank}, {"lora_alpha", kAlpha}, {"target_modules", "all-linear"}}},
      {"train", {{"steps", 1000}, {"eval_every", 0}, {"eval_batches", 1}, {"sample_tokens", 0}}}};
  if (threads > 0) doc["device"]["threads"] = threads;
  if (qlora) {
    doc["bf16"] = {{"enabled", true}};
    doc["lora"]["base_dtype"] = "nf4";
  }
  return doc;
}

struct Timed {
  double step_s = 0;
  int64_t trained = 0;
};

Timed time_steps(const nlohmann::json& doc, int warmup, int timed) {
  comm::SingleProcessCommunicator one;
  std::ostream discard(nullptr);
  runtime::Trainer t(runtime::config_from_json(doc, "ferry bench lora", "", {}), one, discard);
  std::vector<double> times;
  for (int s = 0; s < warmup + timed; ++s) {
    const runtime::StepStats st = t.train_step(s);
    if (s >= warmup) times.push_back(st.time.wall_s);
  }
  Timed r;
  r.step_s = spread(times).median;
  for (const nn::UnitSpec& u : t.model().units())
    for (const nn::TensorSpec& x : u.tensors) r.trained += x.trainable ? x.numel() : 0;
  return r;
}

}  // namespace

int run_lora_bench(const LoraBenchOptions& opt, Report& report) {
  const Shape s = shape_of(opt.quick);
  const int threads = opt.threads > 0 ? opt.threads : omp_get_max_threads();
  const int warmup = 2, timed = opt.quick ? 2 : 5, rounds = opt.peers.empty() ? 1 : 5;
  std::unique_ptr<PeerProcess> peer;
  if (!opt.peers.empty()) {
    peer = std::make_unique<PeerProcess>("PEFT on PyTorch eager", opt.peers,
                                         std::string(FERRY_SOURCE_DIR) + "/benchmarks/peers/lora_peer.py",
                                         std::vector<std::string>{"OMP_NUM_THREADS=" + std::to_string(threads)});
  }
  const double tokens = static_cast<double>(s.batch * s.block);
  report.columns = {"case", "ferry tok/s", "PEFT tok/s", "ferry / PEFT", "what"};
  double headline = 0, headline_peer = 0;
  for (const bool qlora : {false, true}) {
    const std::string name = qlora ? "qlora" : "lora";
    std::vector<double> ferry_rounds, peer_rounds;
    Timed mine;
    alternate_sides(
        rounds,
        [&] {
          mine = time_steps(bench_doc(s, qlora, threads), warmup, timed);
          ferry_rounds.push_back(mine.step_s);
        },
        !peer ? nullptr : std::function<void()>([&] {
          const nlohmann::json a =
              peer->request({{"n_layer", s.n_layer}, {"n_head", s.n_head}, {"n_kv_head", s.n_kv_head}, {"n_embd", s.n_embd},
                             {"intermediate", s.intermediate}, {"vocab_size", s.vocab}, {"block_size", s.block},
                             {"batch", s.batch}, {"r", kRank}, {"alpha", kAlpha}, {"qlora", qlora}, {"steps", timed},
                             {"threads", threads}});
          if (a.at("trainable").get<int64_t>() != mine.trained && mine.trained > 0) {
            throw std::runtime_error("--peers " + opt.peers + ": PEFT trains " + a.at("trainable").dump() +
                                     " parameters and ferry " + std::to_string(mine.trained) +
                                     ": benchmarks/peers/lora_peer.py no longer builds ferry's adapters");
          }
          peer_rounds.push_back(spread(a.at("seconds").get<std::vector<double>>()).median);
        }));
    const Spread f = spread(ferry_rounds), p = spread(peer_rounds);
    const double ftok = tokens / f.median, ptok = peer_rounds.empty() ? 0.0 : tokens / p.median;
    const std::string what =
        std::string(qlora ? "bf16, base in NF4 (double quantized)" : "fp32") + ", " + std::to_string(s.n_layer) + " x " +
        std::to_string(s.n_embd) + ", r " + std::to_string(kRank) + " on all-linear (" + std::to_string(mine.trained) +
        " trained), " + std::to_string(s.batch) + " x " + std::to_string(s.block) + " tokens, " + std::to_string(threads) +
        " threads; step " + fixed(f.min, 3) + "-" + fixed(f.max, 3) + " s" +
        (peer_rounds.empty() ? std::string() : ", PEFT " + fixed(p.min, 3) + "-" + fixed(p.max, 3) + " s");
    report.table.push_back({name, fixed(ftok, 0), peer_rounds.empty() ? "-" : fixed(ptok, 0),
                            peer_rounds.empty() ? "-" : fixed(ftok / ptok, 3), what});
    nlohmann::json row = {{"case", name}, {"ferry_tokens_per_s", ftok}, {"ferry_step_s", f.median},
                          {"trained_parameters", mine.trained}, {"threads", threads}};
    if (!peer_rounds.empty()) {
      row["peft_tokens_per_s"] = ptok;
      row["peft_step_s"] = p.median;
      row["ferry_over_peft"] = ftok / ptok;
    }
    report.rows.push_back(row);
    if (!qlora) headline = ftok, headline_peer = ptok;
  }
  // ferry's own reference in the same run: the same model trained in full (fp32), which a
  // LoRA step must beat (no weight gradients for the base, Adam on the adapters only).
  nlohmann::json full = bench_doc(s, false, threads);
  full.erase("lora");
  std::vector<double> full_s;
  for (int r = 0; r < rounds; ++r) full_s.push_back(time_steps(full, warmup, timed).step_s);
  const double full_tok = tokens / spread(full_s).median;
  report.table.push_back({"full", fixed(full_tok, 0), "-", "-", "fp32, every weight trained (the in-run reference)"});
  report.rows.push_back({{"case", "full"}, {"ferry_tokens_per_s", full_tok}, {"ferry_step_s", spread(full_s).median}});
  if (peer) {
    report.headline = {"lora_tokens_per_s", headline, "peft_tokens_per_s", headline_peer, 1.2, {}};
    report.headline.extra["peer"] = peer->hello();
  } else {
    report.headline = {"lora_tokens_per_s", headline, "full_finetune_tokens_per_s", full_tok, 1.0, {}};
  }
  report.headline.extra["lora_over_full_finetune"] = headline / full_tok;
  return 0;
}

}  // namespace ferry::bench
