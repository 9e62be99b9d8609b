#include "benchmarks/bench_attention.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <vector>

#include "benchmarks/peer_process.h"
#include "nn/cpu_device.h"
#include "nn/cuda_device.h"
#include "nn/rng.h"

namespace ferry::bench {

namespace {

using clock_type = std::chrono::steady_clock;

constexpr int64_t kTokens = 8192, kHeads = 12, kHeadSize = 64;

}  // namespace

int run_attention_bench(const AttentionBenchOptions& opt, Report& report) {
  const bool gpu = opt.device == "cuda";
  if (!gpu && opt.device != "cpu") throw std::invalid_argument("--device must be cpu or cuda, got " + opt.device);
  std::unique_ptr<nn::Device> owned;
  if (gpu) {
    owned = nn::make_cuda_device(size_t{8} << 30);
  } else {
    auto c = std::make_unique<nn::CpuDevice>(size_t{8} << 30, opt.threads);
    report.threads = c->threads();
    owned = std::move(c);
  }
  nn::Device& dev = *owned;
  const nn::DType act = opt.bf16 ? nn::DType::bf16 : nn::DType::f32;
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
  report.columns = {"T", "batch", "forward ms", "backward ms", "fwd+bwd GFLOP/s"};
  if (peer) report.columns.insert(report.columns.end(), {"SDPA fwd+bwd ms", "SDPA / ferry"});
  double last_ratio = 0, last_gflops = 0;
  for (const int64_t T : contexts) {
    const int64_t B = std::max<int64_t>(1, kTokens / T), C = kHeads * kHeadSize, W = 3 * C;
    const nn::Tensor qkv = nn::Tensor::empty(dev, act, {B, T, W}), dqkv = nn::Tensor::empty(dev, act, {B, T, W});
    const nn::Tensor out = nn::Tensor::empty(dev, act, {B, T, C}), dout = nn::Tensor::empty(dev, act, {B, T, C});
    const nn::Tensor lse = nn::Tensor::empty(dev, nn::DType::f32, {B, kHeads, T});
    {
      std::vector<float> host(static_cast<size_t>(B * T * W));
      nn::Rng rng(7);
      for (float& x : host) x = static_cast<float>(rng.normal());
      const nn::Tensor f = nn::Tensor::empty(dev, nn::DType::f32, {B, T, W});
      dev.copy_from_host(f, host.data());
      dev.cast(qkv, f);
      const nn::Tensor g = nn::Tensor::empty(dev, nn::DType::f32, {B, T, C});
      dev.copy_from_host(g, host.data());
      dev.cast(dout, g);
    }
    std::vector<double> fwd, bwd, peer_fwd, peer_bwd;
    for (int r = 0; r < reps + 1; ++r) {
      dev.fill(dqkv, 0.0);
      dev.synchronize();
      const auto t0 = clock_type::now();
      dev.attention_forward(out, lse, qkv, kHeads);
      dev.synchronize();
      const auto t1 = clock_type::now();
      dev.attention_backward(dqkv, dout, qkv, out, lse, kHeads);
      dev.synchronize();
      const auto t2 = clock_type::now();
      if (r == 0) continue;  // warm-up: first touch, kernel loading
      fwd.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      bwd.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
      if (peer) {
        const nlohmann::json a = peer->request(
            {{"T", T}, {"device", opt.device}, {"bf16", opt.bf16}, {"threads", report.threads}, {"reps", 1}});
        for (double x : a.at("fwd_ms").get<std::vector<double>>()) peer_fwd.push_back(x);
        for (double x : a.at("bwd_ms").get<std::vector<double>>()) peer_bwd.push_back(x);
      }
    }
    const double f = spread(fwd).median, b = spread(bwd).median;
    const double flops = 2.0 * static_cast<double>(B * kHeads * T * T * kHeadSize) * 3.5;  // fwd + 2.5x fwd
    const double gflops = flops / ((f + b) * 1e-3) / 1e9;
    std::vector<std::string> row = {std::to_string(T), std::to_string(B), fixed(f, 2), fixed(b, 2), fixed(gflops, 1)};
    nlohmann::json jrow = {{"T", T},           {"batch", B},         {"heads", kHeads},
                           {"head_size", kHeadSize}, {"dtype", std::string(nn::dtype_name(act))},
                           {"forward_ms", f},  {"backward_ms", b},   {"gflops", gflops},
                           {"device", dev.name()}};
    last_gflops = gflops;
    if (peer) {
      const double pf = spread(peer_fwd).median, pb = spread(peer_bwd).median;
      last_ratio = (pf + pb) / (f + b);
      row.push_back(fixed(pf + pb, 2));
      row.push_back(fixed(last_ratio, 3));
      jrow["sdpa_forward_ms"] = pf;
      jrow["sdpa_backward_ms"] = pb;
      jrow["sdpa_over_ferry"] = last_ratio;
    }
    report.table.push_back(row);
    report.rows.push_back(jrow);
  }
  const std::string last = std::to_string(contexts.back());
  report.headline = !peer
                        ? Headline{"attention_fwd_bwd_gflops (T=" + last + ")", last_gflops, "none (give --python)", 0, 0}
                        : Headline{"sdpa_time_over_ferry_time (T=" + last + ")", last_ratio, "1 = as fast as SDPA", 1, 1};
  return 0;
}

}  // namespace ferry::bench
