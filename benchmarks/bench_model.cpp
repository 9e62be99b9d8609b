// ferry bench model: forward+backward throughput of the GPT on a device, against the
// device's own GEMM on the model's matrix shapes measured in the same run: Eigen on the
// CPU device, cuBLAS through the cuda device's gemm (in the model's dtype: bf16 with fp32
// accumulation under --bf16) on a GPU. On a GPU the ratio is the MFU against the GEMM
// rate this GPU actually reaches at these shapes, not against a datasheet peak.
//
// Model FLOPs are GPT::flops_per_token (matmuls 6 per weight per token, attention
// 12 T C per layer per token). The reference runs, through Eigen directly, every GEMM
// one forward+backward of the model performs (the linear layers and the tied head, with
// their transposes), and reports their FLOPs over their time. The ratio therefore says
// how much of Eigen's GEMM speed survives everything else a step does (attention,
// LayerNorm, GELU, softmax, bias and residual adds, memory traffic between them).
#include "benchmarks/bench_model.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <iostream>

#include <Eigen/Core>

#include "nn/cpu_device.h"
#include "nn/cuda_device.h"
#include "nn/gpt.h"
#include "nn/rng.h"

namespace ferry::bench {

namespace {

using clock_type = std::chrono::steady_clock;
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct Case {
  std::string name;
  nn::GPTConfig cfg;
  int64_t B;
  int steps;
};

struct Gemm {
  int64_t M, N, K;
  bool ta, tb;
};

// Every GEMM of one forward+backward (see GPT::forward/backward), N = B*T rows.
std::vector<Gemm> model_gemms(const nn::GPTConfig& c, int64_t rows) {
  const int64_t C = c.n_embd, V = c.vocab_size;
  std::vector<Gemm> g;
  const std::pair<int64_t, int64_t> linears[] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}};  // (in, out)
  for (int64_t l = 0; l < c.n_layer; ++l) {
    for (auto [in, out] : linears) {
      g.push_back({rows, out, in, false, true});   // y = x W^T
      g.push_back({rows, in, out, false, false});  // dx = dy W
      g.push_back({out, in, rows, true, false});   // dW = dy^T x
    }
  }
  g.push_back({rows, V, C, false, true});   // logits
  g.push_back({rows, C, V, false, false});  // dlnf
  g.push_back({V, C, rows, true, false});   // dwte
  return g;
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// GFLOP/s of Eigen on `gemms`: the best of `reps` timed passes over all of them.
double eigen_gemm_gflops(const std::vector<Gemm>& gemms, int reps) {
  double flops = 0;
  std::vector<RowMat> a, b, c;
  for (const Gemm& x : gemms) {
    flops += 2.0 * static_cast<double>(x.M * x.N * x.K);
    a.push_back(RowMat::Random(x.ta ? x.K : x.M, x.ta ? x.M : x.K));
    b.push_back(RowMat::Random(x.tb ? x.N : x.K, x.tb ? x.K : x.N));
    c.push_back(RowMat::Zero(x.M, x.N));
  }
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {  // the first pass warms caches and page tables
    const auto t0 = clock_type::now();
    for (size_t i = 0; i < gemms.size(); ++i) {
      const Gemm& x = gemms[i];
      if (!x.ta && !x.tb) c[i].noalias() = a[i] * b[i];
      if (!x.ta && x.tb) c[i].noalias() = a[i] * b[i].transpose();
      if (x.ta && !x.tb) c[i].noalias() = a[i].transpose() * b[i];
    }
    if (r > 0) best = std::min(best, seconds_since(t0));
  }
  return flops / best / 1e9;
}

// GFLOP/s of `dev`'s own gemm on `gemms` in `dtype`: the best of `reps` timed passes.
double device_gemm_gflops(nn::Device& dev, nn::DType dtype, const std::vector<Gemm>& gemms, int reps) {
  double flops = 0;
  std::vector<nn::Tensor> a, b, c;
  for (const Gemm& x : gemms) {
    flops += 2.0 * static_cast<double>(x.M * x.N * x.K);
    a.push_back(nn::Tensor::empty(dev, dtype, {x.ta ? x.K : x.M, x.ta ? x.M : x.K}));
    b.push_back(nn::Tensor::empty(dev, dtype, {x.tb ? x.N : x.K, x.tb ? x.K : x.N}));
    c.push_back(nn::Tensor::empty(dev, dtype, {x.M, x.N}));
    dev.fill(a.back(), 0.01);
    dev.fill(b.back(), 0.02);
  }
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {
    dev.synchronize();
    const auto t0 = clock_type::now();
    for (size_t i = 0; i < gemms.size(); ++i) dev.gemm(c[i], a[i], gemms[i].ta, b[i], gemms[i].tb, 1.0, 0.0);
    dev.synchronize();
    if (r > 0) best = std::min(best, seconds_since(t0));
  }
  return flops / best / 1e9;
}

}  // namespace

int run_model_bench(const ModelBenchOptions& opt, Report& report) {
  const bool gpu = opt.device == "cuda";
  if (!gpu && opt.device != "cpu") throw std::invalid_argument("--device must be cpu or cuda, got " + opt.device);
  std::unique_ptr<nn::Device> owned;
  nn::CpuDevice* cpu = nullptr;
  if (gpu) {
    // The GPT-2 shapes below need more than the CPU's 8 GiB: the GPU's free memory is the cap.
    owned = nn::make_cuda_device(opt.device_memory != 0 ? opt.device_memory : nn::cuda_budget_that_fits());
  } else {
    auto c = std::make_unique<nn::CpuDevice>(opt.device_memory, opt.threads);
    cpu = c.get();
    owned = std::move(c);
  }
  nn::Device& dev = *owned;
  const nn::DType dtype = opt.bf16 ? nn::DType::bf16 : nn::DType::f32;
  report.bench = "model";
  report.threads = cpu ? cpu->threads() : 0;
  const std::string ref_name = gpu ? std::string("cuBLAS ") + (opt.bf16 ? "bf16" : "fp32") + " GEMM GFLOP/s"
                                   : std::string("Eigen GEMM GFLOP/s");
  report.columns = {"config", "params", "tokens/step", "tokens/s", "GFLOP/s", ref_name, gpu ? "MFU" : "ratio"};
  std::vector<Case> cases = {
      {"tiny", {4, 4, 128, 256, 128}, 16, opt.quick ? 2 : 10},
      {"gpt-50m", {7, 12, 768, 256, 256}, 4, opt.quick ? 1 : 3},
  };
  if (gpu) {  // a GPU needs real sizes to be busy: GPT-2 small and medium shapes at T = 1024
    cases = {{"tiny", {4, 4, 128, 256, 128}, 16, opt.quick ? 2 : 10},
             {"gpt2-124m", {12, 12, 768, 256, 1024}, 8, opt.quick ? 2 : 10},
             {"gpt2-350m", {24, 16, 1024, 256, 1024}, 8, opt.quick ? 1 : 5}};
  }
  if (!opt.contexts.empty()) {
    const Case base = cases.size() > 1 ? cases[1] : cases[0];
    const int64_t tokens = base.B * base.cfg.block_size;
    std::vector<Case> sweep;
    for (const int64_t T : opt.contexts) {
      if (T < 1) throw std::invalid_argument("--contexts: a context must be at least 1, got " + std::to_string(T));
      Case k = base;
      k.name = base.name + " T=" + std::to_string(T);
      k.cfg.block_size = T;
      k.B = std::max<int64_t>(1, tokens / T);
      k.steps = opt.quick ? 1 : 2;
      sweep.push_back(k);
    }
    cases = sweep;
  }
  for (const Case& k : cases) {
    if (!opt.only.empty() && opt.only != k.name) continue;
    nn::GPT model(k.cfg, dev, dtype);
    nn::ResidentUnits units(dev, dtype, model.units());
    for (int u = 0; u < model.num_units(); ++u) model.init_unit(u, units.weights[static_cast<size_t>(u)], 1);
    const int64_t T = k.cfg.block_size, N = k.B * T;
    nn::Tensor tokens = nn::Tensor::empty(dev, nn::DType::i32, {N});
    nn::Tensor targets = nn::Tensor::empty(dev, nn::DType::i32, {N});
    nn::Rng rng(5);
    std::vector<int32_t> ids(static_cast<size_t>(2 * N));
    for (auto& x : ids) x = static_cast<int32_t>(rng.below(256));
    dev.copy_from_host(tokens, ids.data());
    dev.copy_from_host(targets, ids.data() + N);
    auto step = [&] {
      units.zero_grads();
      model.forward(units, tokens, targets, k.B, T);
      model.backward(units);
    };
    step();  // warm-up: first-touch of activation memory
    dev.synchronize();
    const auto t0 = clock_type::now();
    for (int s = 0; s < k.steps; ++s) step();
    dev.synchronize();
    const double secs = seconds_since(t0) / k.steps;
    const double tokens_per_s = static_cast<double>(N) / secs;
    const double gflops = model.flops_per_token(T) * static_cast<double>(N) / secs / 1e9;
    model.free_activations();
    const double ref = gpu ? device_gemm_gflops(dev, dtype, model_gemms(k.cfg, N), opt.quick ? 1 : 3)
                           : eigen_gemm_gflops(model_gemms(k.cfg, N), opt.quick ? 1 : 3);
    report.table.push_back({k.name, std::to_string(model.num_parameters()), std::to_string(N), fixed(tokens_per_s, 0),
                            fixed(gflops, 1), fixed(ref, 1), fixed(gflops / ref, 3)});
    report.rows.push_back({{"config", k.name},
                           {"params", model.num_parameters()},
                           {"n_layer", k.cfg.n_layer},
                           {"n_embd", k.cfg.n_embd},
                           {"block_size", T},
                           {"micro_batch", k.B},
                           {"tokens_per_step", N},
                           {"seconds_per_step", secs},
                           {"tokens_per_s", tokens_per_s},
                           {"model_gflops", gflops},
                           {"device", dev.name()},
                           {"dtype", std::string(nn::dtype_name(dtype))},
                           {gpu ? "cublas_gemm_gflops_at_model_shapes" : "eigen_gemm_gflops_at_model_shapes", ref},
                           {"ratio", gflops / ref}});
    report.headline = {"model_gflops (" + k.name + ")", gflops,
                       gpu ? "cublas_gemm_gflops_at_model_shapes" : "eigen_gemm_gflops_at_model_shapes", ref, 0.5};
  }
  return 0;
}

}  // namespace ferry::bench
