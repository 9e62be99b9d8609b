// ferry bench tokenize: encoding MB/s of a tokenizer.json (runtime/text) over the bundled
// corpus, line by line, at 1 thread and at all threads; medians of 5 repetitions. With
// --python PY (a Python with Hugging Face `tokenizers`, e.g. the one
// scripts/hf_fixtures/requirements.txt makes), the library encodes the same lines in the same
// run (encode one by one, and encode_batch on all threads; benchmarks/peers/tokenize_peer.py)
// and the ratios are reported.
#include "benchmarks/bench_tokenize.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "benchmarks/peer_process.h"
#include "runtime/text/tokenizer.h"

namespace ferry::bench {

namespace {

// The library's MB/s (medians) for one-by-one and batch encoding and its id count, from
// benchmarks/peers/tokenize_peer.py under `python`.
nlohmann::json python_reference(const std::string& python, const std::string& tok, const std::string& corpus,
                                int64_t bytes, int reps, int threads) {
  PeerProcess peer("Hugging Face tokenizers", python, std::string(FERRY_SOURCE_DIR) + "/benchmarks/peers/tokenize_peer.py",
                   {"RAYON_NUM_THREADS=" + std::to_string(threads)}, "--python");
  const nlohmann::json a =
      peer.request({{"tokenizer", tok}, {"corpus", corpus}, {"bytes", bytes}, {"reps", reps}});
  return {{"one_mb_s", spread(a.at("one_mb_s").get<std::vector<double>>()).median},
          {"batch_mb_s", spread(a.at("batch_mb_s").get<std::vector<double>>()).median},
          {"ids", a.at("ids")},
          {"tokenizers", peer.hello().value("tokenizers", "")}};
}

}  // namespace

int run_tokenize_bench(const TokenizeBenchOptions& opt, Report& report) {
  const std::string tok_path =
      opt.tokenizer.empty() ? std::string(FERRY_SOURCE_DIR) + "/tests/data/tokenizers/llama3/tokenizer.json" : opt.tokenizer;
  const std::string corpus = opt.corpus.empty() ? std::string(FERRY_SOURCE_DIR) + "/examples/data/kjv.txt" : opt.corpus;
  const text::Tokenizer tok = text::Tokenizer::from_file(tok_path);
  std::ifstream in(corpus, std::ios::binary);
  if (!in) throw std::runtime_error(corpus + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string data = ss.str();
  if (opt.quick) data.resize(std::min<size_t>(data.size(), 200'000));
  // Whole lines only (a cut through a UTF-8 sequence would be invalid input).
  if (const size_t nl = data.rfind('\n'); nl != std::string::npos) data.resize(nl + 1);
  std::vector<std::string_view> lines;
  for (size_t at = 0; at < data.size();) {
    const size_t nl = data.find('\n', at);
    const size_t end = nl == std::string::npos ? data.size() : nl + 1;
    lines.emplace_back(data.data() + at, end - at);
    at = end;
  }
  const int reps = opt.quick ? 1 : 5;
  const int all = opt.threads > 0 ? opt.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const double mb = static_cast<double>(data.size()) / 1e6;
  int64_t ids = 0;
  auto encode_range = [&](size_t b, size_t e, int64_t* count) {
    int64_t n = 0;
    for (size_t i = b; i < e; ++i) n += static_cast<int64_t>(tok.encode(lines[i], false).size());
    *count = n;
  };
  auto measure = [&](int threads) {
    std::vector<double> times;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> pool;
      std::vector<int64_t> counts(static_cast<size_t>(threads));
      for (int t = 0; t < threads; ++t) {
        const size_t b = lines.size() * static_cast<size_t>(t) / static_cast<size_t>(threads);
        const size_t e = lines.size() * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
        pool.emplace_back(encode_range, b, e, &counts[static_cast<size_t>(t)]);
      }
      for (auto& th : pool) th.join();
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      ids = 0;
      for (int64_t c : counts) ids += c;
    }
    return mb / spread(times).median;
  };
  const double one = measure(1);
  const double many = all > 1 ? measure(all) : one;
  nlohmann::json ref;
  if (!opt.python.empty()) ref = python_reference(opt.python, tok_path, corpus, static_cast<int64_t>(data.size()), reps, all);
  report.bench = "tokenize";
  report.threads = all;
  report.columns = {"encoder", "threads", "MB/s", "vs tokenizers"};
  const double ref_one = ref.is_null() ? 0 : ref["one_mb_s"].get<double>();
  const double ref_batch = ref.is_null() ? 0 : ref["batch_mb_s"].get<double>();
  auto ratio = [](double a, double b) { return b > 0 ? fixed(a / b, 2) : std::string("-"); };
  report.table.push_back({"ferry", "1", fixed(one, 2), ratio(one, ref_one)});
  report.table.push_back({"ferry", std::to_string(all), fixed(many, 2), ratio(many, ref_batch)});
  if (!ref.is_null()) {
    report.table.push_back({"tokenizers encode", "1", fixed(ref_one, 2), "1.00"});
    report.table.push_back({"tokenizers encode_batch", "all", fixed(ref_batch, 2), "1.00"});
  }
  report.rows.push_back({{"tokenizer", tok_path},
                         {"corpus", corpus},
                         {"bytes", data.size()},
                         {"lines", lines.size()},
                         {"ids", ids},
                         {"one_thread_mb_s", one},
                         {"all_threads", all},
                         {"all_threads_mb_s", many},
                         {"reference", ref}});
  if (!ref.is_null() && ref["ids"].get<int64_t>() != ids) {
    throw std::runtime_error("ferry made " + std::to_string(ids) + " ids, tokenizers " + ref["ids"].dump() +
                             ": the encoders disagree on this corpus");
  }
  report.headline = {"encode_mb_per_s (" + std::to_string(all) + " threads)", many,
                     ref.is_null() ? "none (give --python)" : "tokenizers encode_batch MB/s", ref_batch, 0};
  return 0;
}

}  // namespace ferry::bench
