// The ledger's prediction of a forward+backward (benchmarks/bench_predict.h).
#include "benchmarks/bench_predict.h"

#include <algorithm>
#include <sstream>

#include "benchmarks/bench_report.h"
#include "nn/ledger_device.h"
#include "nn/unit.h"

namespace ferry::bench {

namespace {

constexpr double kBf16Peak = 989e12;  // H100/H200 dense bf16, FLOP/s

Prediction::Gpu on(nn::OpLedger& ledger, const nn::GpuRates& r, double model_flops) {
  Prediction::Gpu g;
  g.name = r.gpu;
  g.seconds = ledger.predict(r);
  g.mfu = model_flops / g.seconds / kBf16Peak;
  g.lines = ledger.lines();
  return g;
}

}  // namespace

Prediction predict_forward_backward(const ModelMaker& make, nn::DType dtype, int64_t B, int64_t T, int64_t head_dim,
                                    nn::AttentionKernel attention) {
  nn::LedgerDevice dev("ledger", size_t{1} << 44);  // counted, never allocated
  const std::unique_ptr<nn::Model> model = make(dev, dtype);
  nn::ResidentUnits units(dev, dtype, model->units(), nn::DType::f32);
  const int64_t N = B * T;
  const nn::Tensor tokens = nn::Tensor::empty(dev, nn::DType::i32, {N});
  const nn::Tensor targets = nn::Tensor::empty(dev, nn::DType::i32, {N});
  dev.ledger().clear();  // the set-up is not the step
  units.zero_grads();
  model->forward(units, tokens, targets, B, T);
  model->backward(units);
  Prediction p;
  p.launches = dev.ledger().launches();
  p.widened = dev.ledger().widened();
  p.ledger_flops = dev.ledger().flops();
  p.model_flops = model->flops_per_token(T) * static_cast<double>(N);
  const nn::GpuRates h100 = nn::h100_rates(attention), h200 = nn::h200_rates(attention);
  p.h100 = on(dev.ledger(), h100, p.model_flops);
  p.h200 = on(dev.ledger(), h200, p.model_flops);
  for (const nn::GpuRates* r : {&h100, &h200}) {
    p.sources.push_back(r->gpu + " GEMM bf16 " + fixed(r->gemm_bf16.value / 1e12, 0) + " TFLOP/s: " + r->gemm_bf16.source);
    p.sources.push_back(r->gpu + " GEMM f32 " + fixed(r->gemm_f32.value / 1e12, 0) + " TFLOP/s: " + r->gemm_f32.source);
    p.sources.push_back(r->gpu + " memory-bound " + fixed(r->memory.value / 1e12, 2) + " TB/s: " + r->memory.source);
    p.sources.push_back(r->gpu + " per launch " + fixed(r->launch.value * 1e6, 1) + " us: " + r->launch.source);
    for (const bool backward : {false, true}) {
      const nn::Rate a = r->attention_rate(backward, head_dim, T);
      p.sources.push_back(r->gpu + " attention " + (backward ? "backward " : "forward ") + fixed(a.value / 1e12, 1) +
                          " TFLOP/s (" + std::string(nn::attention_kernel_name(r->attention)) + "): " + a.source);
    }
  }
  return p;
}

std::string describe_top_ops(const Prediction& p, size_t top) {
  std::vector<nn::OpLedger::Line> lines = p.h100.lines;
  std::sort(lines.begin(), lines.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
  std::ostringstream out;
  for (size_t i = 0; i < std::min(top, lines.size()); ++i) {
    const auto& l = lines[i];
    out << "    " << l.op << ": " << fixed(l.seconds * 1e3, 2) << " ms (" << fixed(100 * l.seconds / p.h100.seconds, 1)
        << "%), " << l.calls << " calls, " << l.launches << " launches, " << fixed(l.flops / 1e9, 1) << " GFLOP, "
        << fixed(l.bytes / 1e9, 2) << " GB (floor " << fixed(l.min_bytes / 1e9, 2) << ")\n";
  }
  return out.str();
}

nlohmann::json Prediction::to_json() const {
  auto gpu = [](const Gpu& g) {
    nlohmann::json ops = nlohmann::json::array();
    for (const auto& l : g.lines) {
      ops.push_back({{"op", l.op}, {"calls", l.calls}, {"launches", l.launches}, {"flops", l.flops},
                     {"bytes", l.bytes}, {"min_bytes", l.min_bytes}, {"seconds", l.seconds}, {"widened", l.widened}});
    }
    return nlohmann::json{{"gpu", g.name}, {"seconds", g.seconds}, {"mfu_of_989_tflops", g.mfu}, {"ops", ops}};
  };
  return {{"launches", launches}, {"widened_ops", widened}, {"ledger_flops", ledger_flops},
          {"model_flops", model_flops}, {"h100", gpu(h100)}, {"h200", gpu(h200)}, {"rate_sources", sources}};
}

}  // namespace ferry::bench
