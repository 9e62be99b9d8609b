#include "benchmarks/bench_attention.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "benchmarks/peer_process.h"
#include "nn/cpu_device.h"
#include "nn/cuda_device.h"
#include "nn/rng.h"

namespace ferry::bench {

namespace {

using clock_type = std::chrono::steady_clock;

constexpr int64_t kTokens = 8192, kHeads = 12, kHeadSize = 64;

// One kernel under test: a device (a cuda device per attention kernel, or the cpu device)
// and the tensors of the current context on it.
struct Side {
  Side(std::string k, std::unique_ptr<nn::Device> d) : kernel(std::move(k)), dev(std::move(d)) {}
  std::string kernel;
  std::unique_ptr<nn::Device> dev;
  nn::Tensor qkv, dqkv, out, dout, lse;
  std::vector<double> fwd, bwd;
};

void make_inputs(Side& s, nn::DType act, int64_t B, int64_t T) {
  nn::Device& dev = *s.dev;
  const int64_t C = kHeads * kHeadSize, W = 3 * C;
  s.qkv = nn::Tensor::empty(dev, act, {B, T, W});
  s.dqkv = nn::Tensor::empty(dev, act, {B, T, W});
  s.out = nn::Tensor::empty(dev, act, {B, T, C});
  s.dout = nn::Tensor::empty(dev, act, {B, T, C});
  s.lse = nn::Tensor::empty(dev, nn::DType::f32, {B, kHeads, T});
  std::vector<float> host(static_cast<size_t>(B * T * W));
  nn::Rng rng(7);
  for (float& x : host) x = static_cast<float>(rng.normal());
  const nn::Tensor f = nn::Tensor::empty(dev, nn::DType::f32, {B, T, W});
  dev.copy_from_host(f, host.data());
  dev.cast(s.qkv, f);
  const nn::Tensor g = nn::Tensor::empty(dev, nn::DType::f32, {B, T, C});
  dev.copy_from_host(g, host.data());
  dev.cast(s.dout, g);
  s.fwd.clear();
  s.bwd.clear();
}

// One forward and one backward, each timed to its end; `keep` false: a warm-up.
void time_once(Side& s, bool keep) {
  nn::Device& dev = *s.dev;
  dev.fill(s.dqkv, 0.0);
  dev.synchronize();
  const auto t0 = clock_type::now();
  dev.attention_forward(s.out, s.lse, s.qkv, kHeads);
  dev.synchronize();
  const auto t1 = clock_type::now();
  dev.attention_backward(s.dqkv, s.dout, s.qkv, s.out, s.lse, kHeads);
  dev.synchronize();
  const auto t2 = clock_type::now();
  if (!keep) return;
  s.fwd.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  s.bwd.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
}

}  // namespace

int run_attention_bench(const AttentionBenchOptions& opt, Report& report) {
  const bool gpu = opt.device == "cuda";
  if (!gpu && opt.device != "cpu") throw std::invalid_argument("--device must be cpu or cuda, got " + opt.device);
  const nn::DType act = opt.bf16 ? nn::DType::bf16 : nn::DType::f32;
  std::vector<Side> sides;
  if (gpu) {
    sides.emplace_back("simt", nn::make_cuda_device(size_t{2} << 30, 0, nn::AttentionKernel::simt));
    std::string why;
    nn::cuda_attention_kernel(*sides[0].dev, act, kHeadSize, &why);
    if (why.empty()) {
      sides.emplace_back("tensor_cores", nn::make_cuda_device(size_t{2} << 30, 0, nn::AttentionKernel::tensor_cores));
    }
    auto mma = nn::make_cuda_device(size_t{2} << 30, 0, nn::AttentionKernel::mma);
    if (nn::cuda_attention_kernel(*mma, act, kHeadSize) == "mma") sides.emplace_back("mma", std::move(mma));
  } else {
    auto c = std::make_unique<nn::CpuDevice>(size_t{8} << 30, opt.threads);
    report.threads = c->threads();
    sides.emplace_back("cpu", std::move(c));
  }
  const std::vector<int64_t> contexts =
      opt.quick ? std::vector<int64_t>{256, 1024} : std::vector<int64_t>{256, 1024, 4096, 8192};
  const int reps = opt.quick ? 1 : (gpu ? 10 : 3);
  // PyTorch's SDPA at the same shapes (benchmarks/peers/attention_peer.py), one repetition
  // of it after each of ferry's.
  std::unique_ptr<PeerProcess> peer;
  if (!opt.python.empty()) {
    peer = std::make_unique<PeerProcess>("PyTorch's SDPA", opt.python,
                                         std::string(FERRY_SOURCE_DIR) + "/benchmarks/peers/attention_peer.py",
                                         std::vector<std::string>{}, "--python");
  }
  report.bench = "attention";
  report.columns = {"T", "batch", "kernel", "forward ms", "backward ms", "fwd+bwd GFLOP/s"};
  if (peer) report.columns.insert(report.columns.end(), {"SDPA fwd+bwd ms", "SDPA / ferry"});
  double last_ratio = 0, last_gflops = 0, last_speedup = 0;
  for (const int64_t T : contexts) {
    const int64_t B = std::max<int64_t>(1, kTokens / T);
    for (Side& s : sides) make_inputs(s, act, B, T);
    std::vector<double> peer_fwd, peer_bwd;
    for (int r = 0; r < reps + 1; ++r) {
      for (Side& s : sides) time_once(s, r > 0);  // alternated: the GPU's clocks and the cores' load shared
      if (r == 0 || !peer) continue;  // the first round warms up: first touch, kernel loading
      const nlohmann::json a = peer->request(
          {{"T", T}, {"device", opt.device}, {"bf16", opt.bf16}, {"threads", report.threads}, {"reps", 1}});
      for (double x : a.at("fwd_ms").get<std::vector<double>>()) peer_fwd.push_back(x);
      for (double x : a.at("bwd_ms").get<std::vector<double>>()) peer_bwd.push_back(x);
    }
    const double flops = 2.0 * static_cast<double>(B * kHeads * T * T * kHeadSize) * 3.5;  // fwd + 2.5x fwd
    double best = 0;
    for (const Side& s : sides) {
      const double f = spread(s.fwd).median, b = spread(s.bwd).median;
      const double gflops = flops / ((f + b) * 1e-3) / 1e9;
      best = std::max(best, gflops);
      std::vector<std::string> row = {std::to_string(T), std::to_string(B), s.kernel,
                                      fixed(f, 2),       fixed(b, 2),       fixed(gflops, 1)};
      nlohmann::json jrow = {{"T", T},
                             {"batch", B},
                             {"heads", kHeads},
                             {"head_size", kHeadSize},
                             {"dtype", std::string(nn::dtype_name(act))},
                             {"kernel", s.kernel},
                             {"forward_ms", f},
                             {"backward_ms", b},
                             {"gflops", gflops},
                             {"device", s.dev->name()}};
      if (peer) {
        const double pf = spread(peer_fwd).median, pb = spread(peer_bwd).median;
        row.push_back(fixed(pf + pb, 2));
        row.push_back(fixed((pf + pb) / (f + b), 3));
        jrow["sdpa_forward_ms"] = pf;
        jrow["sdpa_backward_ms"] = pb;
        jrow["sdpa_over_ferry"] = (pf + pb) / (f + b);
      }
      report.table.push_back(row);
      report.rows.push_back(jrow);
    }
    last_gflops = best;
    if (peer) last_ratio = (spread(peer_fwd).median + spread(peer_bwd).median) / (flops / (best * 1e9) * 1e3);
    if (sides.size() >= 2) {  // SIMT against the fastest tensor-core kernel (wmma or mma)
      double fastest = 0;
      for (size_t k = 1; k < sides.size(); ++k) {
        const double ms = spread(sides[k].fwd).median + spread(sides[k].bwd).median;
        fastest = k == 1 ? ms : std::min(fastest, ms);
      }
      last_speedup = (spread(sides[0].fwd).median + spread(sides[0].bwd).median) / fastest;
    }
  }
  const std::string last = std::to_string(contexts.back());
  if (peer) {
    report.headline = Headline{"sdpa_time_over_ferry_time (T=" + last + ", ferry's fastest kernel)", last_ratio,
                               "1 = as fast as SDPA", 1, 1};
  } else if (sides.size() >= 2) {
    report.headline = Headline{"simt_time_over_tensor_core_time (T=" + last + ", the fastest of wmma and mma)", last_speedup,
                               "1 = the tensor cores gain nothing", 1, 1};
  } else {
    report.headline =
        Headline{"attention_fwd_bwd_gflops (T=" + last + ")", last_gflops, "none (give --python)", 0, 0};
  }
  return 0;
}

}  // namespace ferry::bench
