// ferry-bench model: forward+backward throughput of the GPT on the CPU device, against
// Eigen's own GEMM on the model's matrix shapes measured in the same run.
//
// Model FLOPs are GPT::flops_per_token (matmuls 6 per weight per token, attention
// 12 T C per layer per token). The reference runs, through Eigen directly, every GEMM
// one forward+backward of the model performs (the linear layers and the tied head, with
// their transposes), and reports their FLOPs over their time. The ratio therefore says
// how much of Eigen's GEMM speed survives everything else a step does (attention,
// LayerNorm, GELU, softmax, bias and residual adds, memory traffic between them).
#include "benchmarks/bench_model.h"

#include <chrono>
#include <iostream>

#include <Eigen/Core>

#include "nn/cpu_device.h"
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

}  // namespace

int run_model_bench(const ModelBenchOptions& opt, Report& report) {
  nn::CpuDevice dev(opt.device_memory, opt.threads);
  report.bench = "model";
  report.threads = dev.threads();
  report.columns = {"config", "params", "tokens/step", "tokens/s", "GFLOP/s", "Eigen GEMM GFLOP/s", "ratio"};
  const std::vector<Case> cases = {
      {"tiny", {4, 4, 128, 256, 128}, 16, opt.quick ? 2 : 10},
      {"gpt-50m", {7, 12, 768, 256, 256}, 4, opt.quick ? 1 : 3},
  };
  for (const Case& k : cases) {
    if (!opt.only.empty() && opt.only != k.name) continue;
    nn::GPT model(k.cfg, dev, nn::DType::f32);
    nn::ResidentUnits units(dev, nn::DType::f32, model.units());
    for (int u = 0; u < model.num_units(); ++u) model.init_unit(u, units.weights[static_cast<size_t>(u)], 1);
    const int64_t T = k.cfg.block_size, N = k.B * T;
    nn::Tensor tokens = nn::Tensor::empty(dev, nn::DType::i32, {N});
    nn::Tensor targets = nn::Tensor::empty(dev, nn::DType::i32, {N});
    nn::Rng rng(5);
    for (int64_t i = 0; i < N; ++i) {
      tokens.data_as<int32_t>()[i] = static_cast<int32_t>(rng.below(256));
      targets.data_as<int32_t>()[i] = static_cast<int32_t>(rng.below(256));
    }
    auto step = [&] {
      units.zero_grads();
      model.forward(units, tokens, targets, k.B, T);
      model.backward(units);
    };
    step();  // warm-up: first-touch of activation memory
    const auto t0 = clock_type::now();
    for (int s = 0; s < k.steps; ++s) step();
    const double secs = seconds_since(t0) / k.steps;
    const double tokens_per_s = static_cast<double>(N) / secs;
    const double gflops = model.flops_per_token(T) * static_cast<double>(N) / secs / 1e9;
    const double ref = eigen_gemm_gflops(model_gemms(k.cfg, N), opt.quick ? 1 : 3);
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
                           {"eigen_gemm_gflops_at_model_shapes", ref},
                           {"ratio", gflops / ref}});
    report.headline = {"model_gflops (" + k.name + ")", gflops, "eigen_gemm_gflops_at_model_shapes", ref, 0.5};
  }
  return 0;
}

}  // namespace ferry::bench
