#include "benchmarks/bench_attention.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <vector>

#include "nn/cpu_device.h"
#include "nn/cuda_device.h"
#include "nn/rng.h"

namespace ferry::bench {

namespace {

using clock_type = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

constexpr int64_t kTokens = 8192, kHeads = 12, kHeadSize = 64;

// PyTorch's SDPA at the same shapes: {"T": {"fwd_ms":..., "bwd_ms":...}, ...} from a Python
// process (the script is written to a temporary file; nothing is downloaded).
nlohmann::json sdpa_reference(const std::string& python, const std::string& device, bool bf16,
                              const std::vector<int64_t>& contexts, int reps, int threads) {
  const std::string script =
      "import json,sys,time,statistics,torch\n"
      "import torch.nn.functional as F\n"
      "dev=sys.argv[1]; dt=torch.bfloat16 if sys.argv[2]=='1' else torch.float32\n"
      "reps=int(sys.argv[3]); ctx=[int(x) for x in sys.argv[4].split(',')]\n"
      "if int(sys.argv[5])>0: torch.set_num_threads(int(sys.argv[5]))\n"
      "def sync():\n"
      "  if dev=='cuda': torch.cuda.synchronize()\n"
      "out={}\n"
      "for T in ctx:\n"
      "  B=max(1,8192//T)\n"
      "  q,k,v=[torch.randn(B,12,T,64,device=dev,dtype=dt,requires_grad=True) for _ in range(3)]\n"
      "  g=torch.randn(B,12,T,64,device=dev,dtype=dt)\n"
      "  f=[];b=[]\n"
      "  for r in range(reps+1):\n"
      "    sync(); t0=time.perf_counter(); o=F.scaled_dot_product_attention(q,k,v,is_causal=True); sync(); t1=time.perf_counter()\n"
      "    o.backward(g); sync(); t2=time.perf_counter()\n"
      "    q.grad=k.grad=v.grad=None\n"
      "    if r>0: f.append(t1-t0); b.append(t2-t1)\n"
      "  out[str(T)]={'fwd_ms':1e3*statistics.median(f),'bwd_ms':1e3*statistics.median(b)}\n"
      "print(json.dumps(out))\n";
  const std::string path = "/tmp/ferry_bench_attention.py";
  std::ofstream(path) << script;
  std::string list;
  for (int64_t t : contexts) {
    if (!list.empty()) list += ',';
    list += std::to_string(t);
  }
  const std::string cmd = python + " " + path + " " + device + " " + (bf16 ? "1" : "0") + " " + std::to_string(reps) +
                          " " + list + " " + std::to_string(threads) + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("cannot run " + python);
  std::string out;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), p)) out += buf.data();
  if (pclose(p) != 0) throw std::runtime_error(python + " with torch failed (is torch installed, with " + device + "?)");
  return nlohmann::json::parse(out);
}

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
  nlohmann::json peer;
  if (!opt.python.empty()) peer = sdpa_reference(opt.python, opt.device, opt.bf16, contexts, reps, report.threads);
  report.bench = "attention";
  report.columns = {"T", "batch", "forward ms", "backward ms", "fwd+bwd GFLOP/s"};
  if (!peer.is_null()) report.columns.insert(report.columns.end(), {"SDPA fwd+bwd ms", "SDPA / ferry"});
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
    std::vector<double> fwd, bwd;
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
    }
    const double f = median(fwd), b = median(bwd);
    const double flops = 2.0 * static_cast<double>(B * kHeads * T * T * kHeadSize) * 3.5;  // fwd + 2.5x fwd
    const double gflops = flops / ((f + b) * 1e-3) / 1e9;
    std::vector<std::string> row = {std::to_string(T), std::to_string(B), fixed(f, 2), fixed(b, 2), fixed(gflops, 1)};
    nlohmann::json jrow = {{"T", T},           {"batch", B},         {"heads", kHeads},
                           {"head_size", kHeadSize}, {"dtype", std::string(nn::dtype_name(act))},
                           {"forward_ms", f},  {"backward_ms", b},   {"gflops", gflops},
                           {"device", dev.name()}};
    last_gflops = gflops;
    if (!peer.is_null()) {
      const nlohmann::json& pr = peer.at(std::to_string(T));
      const double ps = pr.at("fwd_ms").get<double>() + pr.at("bwd_ms").get<double>();
      last_ratio = ps / (f + b);
      row.push_back(fixed(ps, 2));
      row.push_back(fixed(last_ratio, 3));
      jrow["sdpa_forward_ms"] = pr.at("fwd_ms");
      jrow["sdpa_backward_ms"] = pr.at("bwd_ms");
      jrow["sdpa_over_ferry"] = last_ratio;
    }
    report.table.push_back(row);
    report.rows.push_back(jrow);
  }
  const std::string last = std::to_string(contexts.back());
  report.headline = peer.is_null()
                        ? Headline{"attention_fwd_bwd_gflops (T=" + last + ")", last_gflops, "none (give --python)", 0, 0}
                        : Headline{"sdpa_time_over_ferry_time (T=" + last + ")", last_ratio, "1 = as fast as SDPA", 1, 1};
  return 0;
}

}  // namespace ferry::bench
