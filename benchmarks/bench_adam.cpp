// ferry bench adam: CPU AdamW params/s over fp32 shards at 1 thread and at all threads,
// with and without the fused bf16 copy, against a STREAM-style triad (a = b + s c, fp32,
// 12 bytes per element) over arrays of the same size, measured in the same run at the
// same thread count. AdamW moves 28 bytes per parameter (reads p, g, m, v; writes p, m, v;
// 30 with the bf16 copy); the fraction is Adam's bytes/s over the triad's.
// DeepSpeed's AVX-512 CPU Adam, measured on this machine class (MACHINE-NOTES.md, 100M
// params): 0.83 G params/s at 1 thread, 1.28 at 2; the goal is 1.3x that.
#include "benchmarks/bench_adam.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "offload/cpu_adam.h"

namespace ferry::bench {

namespace {

struct Buffer {
  std::unique_ptr<float, decltype(&std::free)> p{nullptr, &std::free};
  explicit Buffer(int64_t n) : p(static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(n) * 4)), &std::free) {}
  float* get() const { return p.get(); }
};

double seconds(const std::function<void()>& f, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

double deepspeed_reference(int threads) { return threads <= 1 ? 0.83e9 : 1.28e9; }

}  // namespace

int run_adam_bench(const AdamBenchOptions& opt, Report& report) {
  const int64_t n = opt.quick ? 4'000'000 : opt.params;
  const int reps = opt.quick ? 2 : 5;
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
  report.columns = {"threads", "bf16 copy", "G params/s", "GB/s moved", "triad GB/s", "of triad", "vs DeepSpeed"};
  std::vector<int> thread_counts = {1};
  if (all > 1) thread_counts.push_back(all);
  if (std::find(thread_counts.begin(), thread_counts.end(), headline_threads) == thread_counts.end()) {
    thread_counts.push_back(headline_threads);
  }
  for (int t : thread_counts) {
    omp_set_num_threads(t);
    const double triad_s = seconds(
        [&] {
          float* A = a.get();
          const float *B = b.get(), *C = c.get();
#pragma omp parallel for schedule(static)
          for (int64_t i = 0; i < n; ++i) A[i] = B[i] + 3.0f * C[i];
        },
        reps);
    const double triad_gbps = 12.0 * static_cast<double>(n) / triad_s / 1e9;
    for (bool fused : {false, true}) {
      int64_t step = 0;
      const double s = seconds(
          [&] { adam.update(p.get(), g.get(), m.get(), v.get(), n, ++step, 1e-3, 0.01, 0.5, fused ? bf16.data() : nullptr); },
          reps);
      const double pps = static_cast<double>(n) / s;
      const double bytes = (fused ? 30.0 : 28.0) * pps / 1e9;
      const double ds = deepspeed_reference(t);
      report.table.push_back({std::to_string(t), fused ? "yes" : "no", fixed(pps / 1e9, 3), fixed(bytes, 1),
                              fixed(triad_gbps, 1), fixed(bytes / triad_gbps, 2), fixed(pps / ds, 2)});
      report.rows.push_back({{"threads", t},
                             {"bf16_copy", fused},
                             {"params", n},
                             {"params_per_s", pps},
                             {"bytes_per_s", bytes * 1e9},
                             {"triad_bytes_per_s", triad_gbps * 1e9},
                             {"fraction_of_triad", bytes / triad_gbps},
                             {"deepspeed_reference_params_per_s", ds},
                             {"vs_deepspeed", pps / ds}});
      if (t == headline_threads && !fused) {
        report.headline = {"params_per_s (" + std::to_string(t) + " threads)", pps, "stream_triad_equiv_params_per_s",
                           triad_gbps * 1e9 / 28.0, 0.85};
      }
    }
  }
  return 0;
}

}  // namespace ferry::bench
