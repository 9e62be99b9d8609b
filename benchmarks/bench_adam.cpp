// ferry bench adam: CPU AdamW params/s over fp32 shards at 1 thread and at all threads,
// with and without the fused bf16 copy, against a STREAM-style triad (a = b + s c, fp32,
// 12 bytes per element) over arrays of the same size, measured in the same run at the
// same thread count. AdamW moves 28 bytes per parameter (reads p, g, m, v; writes p, m, v;
// 30 with the bf16 copy); the fraction is Adam's bytes/s over the triad's.
// With --peers PYTHON (a Python with torch and deepspeed, scripts/make_peers_env.sh),
// DeepSpeed's CPU Adam (DeepSpeedCPUAdam, benchmarks/peers/adam_peer.py) runs on the same
// size, hyperparameters and thread count in the same run: rounds alternate ferry's
// repetitions and the peer doing as many (one long-running peer per thread count,
// benchmarks/peer_process.h: its OpenMP runtime reads OMP_NUM_THREADS once); every figure is the median of its
// samples with min and max, and the ratio is ferry's median over the peer's. Without
// --peers the peer columns are absent.
#include "benchmarks/bench_adam.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/peer_process.h"
#include "offload/cpu_adam.h"

namespace ferry::bench {

namespace {

struct Buffer {
  std::unique_ptr<float, decltype(&std::free)> p{nullptr, &std::free};
  explicit Buffer(int64_t n)
      : p(static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(n) * 4)), &std::free) {}
  float* get() const { return p.get(); }
};

// Appends the wall time of each of `reps` calls of f to `out`.
void time_reps(const std::function<void()>& f, int reps, std::vector<double>& out) {
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    out.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}

std::string range(const Spread& r) {
  return fixed(r.min / 1e9, 3) + "-" + fixed(r.max / 1e9, 3);
}

}  // namespace

int run_adam_bench(const AdamBenchOptions& opt, Report& report) {
  const int64_t n = opt.quick ? 4'000'000 : opt.params;
  // Each round times `per_round` repetitions of the triad and of ferry's Adam (without and
  // with the bf16 copy), then one peer process doing `per_round` steps.
  const int rounds = opt.quick ? 2 : 5;
  const int per_round = opt.quick ? 1 : 3;
  const bool peers = !opt.peers.empty();
  const int all = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int headline_threads = opt.threads > 0 ? opt.threads : all;
  Buffer p(n), g(n), m(n), v(n), a(n), b(n), c(n);
  std::vector<uint16_t> bf16(static_cast<size_t>(n));
  // First touch in parallel: pages land where the threads that use them run.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    p.get()[i] = 0.01f * static_cast<float>(i % 1000);
    g.get()[i] = 1e-3f * static_cast<float>(i % 77) - 0.03f;
    m.get()[i] = v.get()[i] = 0;
    a.get()[i] = 0, b.get()[i] = 1, c.get()[i] = 2;
  }
  offload::CpuAdam adam({1e-3, 0.9, 0.999, 1e-8, 0.01});
  report.bench = "adam";
  report.threads = headline_threads;
  report.columns = {"threads",    "bf16 copy",  "G params/s", "min-max",
                    "GB/s moved", "triad GB/s", "of triad"};
  if (peers)
    report.columns.insert(report.columns.end(),
                          {"DeepSpeed G params/s", "min-max", "ferry / DeepSpeed"});
  std::vector<int> thread_counts = {1};
  if (all > 1) thread_counts.push_back(all);
  if (std::find(thread_counts.begin(), thread_counts.end(), headline_threads) ==
      thread_counts.end()) {
    thread_counts.push_back(headline_threads);
  }
  const double work = static_cast<double>(n);
  int64_t step = 0;
  nlohmann::json peer_hello;
  for (int t : thread_counts) {
    omp_set_num_threads(t);
    std::unique_ptr<PeerProcess> peer_process;
    if (peers) {
      peer_process = std::make_unique<PeerProcess>(
          "DeepSpeed's CPU Adam", opt.peers, std::string(FERRY_SOURCE_DIR) + "/benchmarks/peers/adam_peer.py",
          std::vector<std::string>{"OMP_NUM_THREADS=" + std::to_string(t), "DS_ACCELERATOR=cpu"});
      peer_hello = peer_process->hello();
    }
    std::vector<double> triad_s, plain_s, fused_s, peer_s;
    for (int round = 0; round < rounds; ++round) {
      time_reps(
          [&] {
            float* A = a.get();
            const float *B = b.get(), *C = c.get();
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < n; ++i) A[i] = B[i] + 3.0f * C[i];
          },
          per_round, triad_s);
      for (bool fused : {false, true}) {
        time_reps(
            [&] {
              adam.update(p.get(), g.get(), m.get(), v.get(), n, ++step, 1e-3, 0.01, 0.5,
                          fused ? bf16.data() : nullptr);
            },
            per_round, fused ? fused_s : plain_s);
      }
      if (peer_process) {
        const auto got = peer_process->request({{"params", n}, {"reps", per_round}}).at("seconds").get<std::vector<double>>();
        if (got.size() != static_cast<size_t>(per_round))
          throw std::runtime_error("--peers " + opt.peers + ": DeepSpeed's CPU Adam answered " +
                                   std::to_string(got.size()) + " samples for " + std::to_string(per_round));
        peer_s.insert(peer_s.end(), got.begin(), got.end());
      }
    }
    const double triad_gbps = rate(triad_s, 12.0 * work).median / 1e9;
    const Spread peer = peers ? rate(peer_s, work) : Spread{};
    for (bool fused : {false, true}) {
      const Spread ferry = rate(fused ? fused_s : plain_s, work);
      const double bytes = (fused ? 30.0 : 28.0) * ferry.median / 1e9;
      std::vector<std::string> row = {
          std::to_string(t), fused ? "yes" : "no", fixed(ferry.median / 1e9, 3), range(ferry),
          fixed(bytes, 1),   fixed(triad_gbps, 1), fixed(bytes / triad_gbps, 2)};
      nlohmann::json jrow = {{"threads", t},
                             {"bf16_copy", fused},
                             {"params", n},
                             {"samples", rounds * per_round},
                             {"params_per_s", ferry.median},
                             {"params_per_s_min", ferry.min},
                             {"params_per_s_max", ferry.max},
                             {"bytes_per_s", bytes * 1e9},
                             {"triad_bytes_per_s", triad_gbps * 1e9},
                             {"fraction_of_triad", bytes / triad_gbps}};
      // DeepSpeed's CPU Adam has no bf16 copy-out: its figures stand on the plain rows.
      if (peers && !fused) {
        row.insert(row.end(), {fixed(peer.median / 1e9, 3), range(peer),
                               fixed(ferry.median / peer.median, 2)});
        jrow["deepspeed_params_per_s"] = peer.median;
        jrow["deepspeed_params_per_s_min"] = peer.min;
        jrow["deepspeed_params_per_s_max"] = peer.max;
        jrow["ferry_over_deepspeed"] = ferry.median / peer.median;
      } else if (peers) {
        row.insert(row.end(), {"-", "-", "-"});
      }
      report.table.push_back(row);
      report.rows.push_back(jrow);
      if (t == headline_threads && !fused) {
        report.headline =
            peers ? Headline{"params_per_s (" + std::to_string(t) + " threads)", ferry.median,
                             "deepspeed_cpu_adam_params_per_s", peer.median, 1.3}
                  : Headline{"params_per_s (" + std::to_string(t) + " threads)", ferry.median,
                             "stream_triad_equiv_params_per_s", triad_gbps * 1e9 / 28.0, 0.85};
      }
    }
  }
  if (peers) {
    report.headline.extra["peer"] = {{"python", opt.peers},
                                     {"torch", peer_hello.value("torch", "")},
                                     {"deepspeed", peer_hello.value("deepspeed", "")},
                                     {"samples", rounds * per_round}};
  }
  return 0;
}

}  // namespace ferry::bench
