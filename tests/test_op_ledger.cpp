// The roofline ledger (nn/op_ledger.h, nn/ledger_device.h): its arithmetic, its rates, and
// that what it declares is what the cuda device does, checked on the CPU emulation of CUDA,
// which records every launch: a GPT's and a Llama's forward and backward issue exactly the
// ledger's launches, a GPT block stays within its launch budget, no op of a bf16 step takes
// a widening path, and every op moves at least its floor of bytes.
#define BOOST_TEST_MODULE op_ledger
#include <boost/test/unit_test.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nn/cuda_device.h"
#include "nn/arch.h"
#include "nn/gpt.h"
#include "nn/ledger_device.h"
#include "nn/llama.h"
#include "nn/op_ledger.h"
#include "nn/unit.h"

#ifdef FERRY_CUDA_EMULATION
#include <cuda_runtime.h>  // the emulation's (testing/cuda_shim): its record of each launch
#endif

using namespace ferry;
using nn::DType;
using nn::Tensor;

namespace {

nn::GPTConfig small_gpt(int64_t layers) {
  return {layers, 2, 64, 96, 32};
}

nn::LlamaConfig small_llama(int64_t layers) {
  nn::LlamaConfig c;
  c.n_layer = layers;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 64;
  c.intermediate = 96;
  c.vocab_size = 96;
  c.block_size = 32;
  c.qkv_bias = true;
  c.qk_norm = true;
  c.tie_embeddings = true;
  return c;
}

using Maker = std::function<std::unique_ptr<nn::Model>(nn::Device&)>;

Maker gpt_maker(int64_t layers) {
  return [=](nn::Device& d) { return std::make_unique<nn::GPT>(small_gpt(layers), d, DType::bf16); };
}
Maker llama_maker(int64_t layers) {
  return [=](nn::Device& d) { return std::make_unique<nn::Llama>(small_llama(layers), d, DType::bf16); };
}
// QLoRA: every projection in NF4 with an adapter (each base GEMM a dequantization and a
// cuBLAS call per panel and piece).
Maker qlora_maker(int64_t layers) {
  return [=](nn::Device& d) {
    auto m = std::make_unique<nn::Llama>(small_llama(layers), d, DType::bf16);
    nn::LoraOptions o;
    o.r = 4;
    o.target_modules = {"all-linear"};
    o.nf4 = true;
    m->add_lora(*nn::find_arch("llama"), small_llama(layers), o);
    return m;
  };
}

// Launches of one forward, then of one backward, that `count` reports around each.
struct Launches {
  int64_t forward = 0, backward = 0;
};

constexpr int64_t kB = 2, kT = 32;

// Today's launches per GPT block (see a_gpt_block_stays_within_its_launch_budget).
constexpr int64_t kForwardBudget = 10, kBackwardBudget = 31;

// Runs zero_grads + forward, then backward, of make(dev)'s model (bf16 weights, f32
// gradients, as the trainer keeps them) on `dev`; `count()` returns the launches since its
// last call.
template <class Count>
Launches run_model(nn::Device& dev, const Maker& make, Count&& count) {
  const std::unique_ptr<nn::Model> model = make(dev);
  nn::ResidentUnits units(dev, DType::bf16, model->units(), DType::f32);
  std::vector<int32_t> ids(static_cast<size_t>(kB * kT));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7) % 96);
  const Tensor tokens = Tensor::empty(dev, DType::i32, {kB * kT});
  const Tensor targets = Tensor::empty(dev, DType::i32, {kB * kT});
  dev.copy_from_host(tokens, ids.data());
  dev.copy_from_host(targets, ids.data());
  dev.synchronize();
  count();
  Launches l;
  units.zero_grads();
  model->forward(units, tokens, targets, kB, kT);
  dev.synchronize();
  l.forward = count();
  model->backward(units);
  dev.synchronize();
  l.backward = count();
  return l;
}

Launches ledger_launches(const Maker& make, nn::OpLedger* keep = nullptr) {
  nn::LedgerDevice dev("ledger", size_t{1} << 32);
  int64_t seen = 0;
  const Launches l = run_model(dev, make, [&] {
    const int64_t now = dev.ledger().launches();
    return now - std::exchange(seen, now);
  });
  if (keep) *keep = dev.ledger();
  return l;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_gemm_costs_2mnk_and_its_operands_bytes) {
  nn::LedgerDevice dev("ledger", size_t{1} << 30);
  const Tensor a = Tensor::empty(dev, DType::bf16, {64, 32}), b = Tensor::empty(dev, DType::bf16, {48, 32});
  const Tensor c16 = Tensor::empty(dev, DType::bf16, {64, 48}), c32 = Tensor::empty(dev, DType::f32, {64, 48});
  const nn::OpCost y = nn::op_cost::gemm(c16, a, false, b, true, 0.0);
  BOOST_TEST(y.flops == 2.0 * 64 * 48 * 32);
  BOOST_TEST(y.bytes == 2.0 * (64 * 32 + 48 * 32 + 64 * 48));
  BOOST_TEST(y.launches == 1);
  BOOST_TEST(!y.widened);
  BOOST_TEST(y.low_precision);
  // Accumulating into an f32 gradient (beta 1): C read and written, still one cuBLAS call.
  const nn::OpCost g = nn::op_cost::gemm(c32, a, false, b, true, 1.0);
  BOOST_TEST(g.bytes == 2.0 * (64 * 32 + 48 * 32) + 2.0 * 4 * 64 * 48);
  BOOST_TEST(g.launches == 1);
  BOOST_TEST(!g.widened);
  // Mixed operand types take the f32 scratch path: a cast, and the ledger says widened.
  const Tensor b32 = Tensor::empty(dev, DType::f32, {48, 32});
  const nn::OpCost m = nn::op_cost::gemm(c32, a, false, b32, true, 0.0);
  BOOST_TEST(m.widened);
  BOOST_TEST(m.launches == 2);
  BOOST_TEST(!m.low_precision);
  BOOST_TEST(m.bytes > m.min_bytes);
}

BOOST_AUTO_TEST_CASE(an_op_takes_its_launches_plus_the_slower_of_compute_and_memory) {
  nn::GpuRates r = nn::h100_rates(nn::AttentionKernel::tensor_cores);
  nn::OpCost gemm;
  gemm.op = "gemm";
  gemm.work = nn::Work::gemm;
  gemm.launches = 1;
  gemm.low_precision = true;
  gemm.flops = 678e9;  // 1 ms at 678 TFLOP/s
  gemm.bytes = 1e9;    // 0.35 ms at 2.85 TB/s
  BOOST_TEST(nn::OpLedger::seconds(gemm, r) == 2e-6 + 1e-3, boost::test_tools::tolerance(1e-12));
  gemm.bytes = 0.85 * 3.35e12 * 4e-3;  // 4 ms of memory: memory bound
  BOOST_TEST(nn::OpLedger::seconds(gemm, r) == 2e-6 + 4e-3, boost::test_tools::tolerance(1e-12));
  nn::OpLedger ledger;
  ledger.add(gemm);
  ledger.add(gemm);
  BOOST_TEST(ledger.predict(r) == 2 * (2e-6 + 4e-3), boost::test_tools::tolerance(1e-12));
  BOOST_TEST(ledger.lines().size() == 1u);
  BOOST_TEST(ledger.lines()[0].calls == 2);
  // The H200 moves the same bytes faster (4.8 against 3.35 TB/s) at the same GEMM rate.
  BOOST_TEST(nn::OpLedger::seconds(gemm, nn::h200_rates(nn::AttentionKernel::tensor_cores)) <
             nn::OpLedger::seconds(gemm, r));
}

BOOST_AUTO_TEST_CASE(attention_rates_come_from_the_measured_or_the_published_curve) {
  // auto is the mma kernels on Hopper: measured on the H200 at head size 64 (TFLOP/s by T).
  const nn::GpuRates tc = nn::h100_rates(nn::AttentionKernel::automatic);
  BOOST_TEST(tc.attention_rate(false, 64, 1024).value == 99.1e12, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(tc.attention_rate(true, 64, 1024).value == 49.1e12, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(tc.attention_rate(false, 64, 100).value == 53.7e12, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(tc.attention_rate(false, 64, 16384).value == 147.4e12, boost::test_tools::tolerance(1e-9));
  // Between measured contexts: linear in log2 T (2048 is halfway from 1024 to 4096).
  BOOST_TEST(tc.attention_rate(false, 64, 2048).value == 0.5 * (99.1e12 + 136.1e12), boost::test_tools::tolerance(1e-9));
  BOOST_TEST(tc.attention_rate(false, 64, 1024).source.find("measured") != std::string::npos);
  BOOST_TEST(tc.attention_rate(false, 64, 1024).source.find("mma.sync") != std::string::npos);
  // A head size mma does not run takes wmma; head size 128 was not timed: scaled, and said so.
  BOOST_TEST(tc.attention_rate(false, 96, 1024).source.find("wmma") != std::string::npos);
  const nn::Rate h128 = tc.attention_rate(true, 128, 2048);
  BOOST_TEST(h128.source.find("assumption") != std::string::npos);
  BOOST_TEST(h128.value == tc.attention_rate(true, 64, 2048).value * 291.0 / 264.0, boost::test_tools::tolerance(1e-9));
  const nn::GpuRates wmma = nn::h100_rates(nn::AttentionKernel::tensor_cores);
  BOOST_TEST(wmma.attention_rate(false, 64, 1024).value == 21.1e12, boost::test_tools::tolerance(1e-9));
  const nn::GpuRates simt = nn::h100_rates(nn::AttentionKernel::simt);
  BOOST_TEST(simt.attention_rate(true, 64, 4096).value == 6.9e12, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(simt.attention_rate(true, 64, 1024).source.find("SIMT") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(every_op_of_a_bf16_step_moves_at_least_its_floor_and_none_widens) {
  for (const Maker& make : {gpt_maker(2), llama_maker(2)}) {
    nn::OpLedger ledger;
    ledger_launches(make, &ledger);
    BOOST_TEST(ledger.widened() == 0);
    for (const auto& l : ledger.lines()) {
      BOOST_TEST_CONTEXT(l.op) {
        BOOST_TEST(l.bytes >= l.min_bytes);
        BOOST_TEST(l.min_bytes > 0.0);
        BOOST_TEST(l.widened == 0);
      }
    }
  }
}

// The first GPU run (docs/design/measured.md, H100, 2026-11-25): GPT-2 124M's body with the
// byte vocabulary, B 8, T 1024, bf16, SIMT flash attention: 107.6 ms per forward+backward.
// The ledger with that run's rates (SIMT attention measured, its memory-bound kernels at
// the 0.8 TB/s the speed notes read off it) must land near it: a ledger that cannot
// reproduce the one measurement there is is not calibrated.
BOOST_AUTO_TEST_CASE(the_ledger_reproduces_the_first_gpu_run) {
  nn::LedgerDevice dev("ledger", size_t{1} << 40);
  nn::GPT model({12, 12, 768, 256, 1024}, dev, DType::bf16);
  nn::ResidentUnits units(dev, DType::bf16, model.units());  // that run kept bf16 gradients
  const Tensor tokens = Tensor::empty(dev, DType::i32, {8 * 1024});
  dev.ledger().clear();
  units.zero_grads();
  model.forward(units, tokens, tokens, 8, 1024);
  model.backward(units);
  nn::GpuRates r = nn::h100_rates(nn::AttentionKernel::simt);
  r.memory.value = 0.8e12;
  const double seconds = dev.ledger().predict(r);
  BOOST_TEST_MESSAGE("the ledger at the first GPU run's rates: " << seconds * 1e3 << " ms against 107.6 measured");
  BOOST_TEST(seconds > 0.85 * 107.6e-3);
  BOOST_TEST(seconds < 1.15 * 107.6e-3);
}

#ifdef FERRY_CUDA_EMULATION

namespace {

// Work items the emulated cuda device ran since the last call: kernels, cuBLAS calls,
// memsets and copies (not allocations, frees or event markers).
int64_t emulated_launches(std::map<std::string, int64_t>* names = nullptr) {
  int64_t n = 0;
  for (const auto& o : ferry_emu::emu().take_order()) {
    if (o.what.empty() || o.what.rfind("cudaFree", 0) == 0 || o.what.rfind("cudaMalloc", 0) == 0) continue;
    ++n;
    if (names) ++(*names)[o.what];
  }
  return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_step_issues_exactly_the_ledgers_launches) {
  auto dev = nn::make_cuda_device(size_t{1} << 30);
  auto& emu = ferry_emu::emu();
  for (const auto& [name, make] :
       {std::pair{"gpt", gpt_maker(2)}, std::pair{"llama", llama_maker(2)}, std::pair{"qlora", qlora_maker(2)}}) {
    BOOST_TEST_CONTEXT(name) {
      std::map<std::string, int64_t> seen;
      emu.set_record_order(true);
      std::vector<std::string> phases;
      const Launches real = run_model(*dev, make, [&] {
        seen.clear();
        const int64_t n = emulated_launches(&seen);
        std::string kinds;
        for (const auto& [k, v] : seen) kinds += " " + k + " x" + std::to_string(v);
        phases.push_back(kinds);
        return n;
      });
      emu.set_record_order(false);
      const Launches declared = ledger_launches(make);
      BOOST_TEST_MESSAGE(name << ": emulated forward " << real.forward << ", backward " << real.backward
                              << "; ledger " << declared.forward << ", " << declared.backward << "; forward:"
                              << phases.at(1) << "; backward:" << phases.at(2));
      BOOST_TEST(real.forward == declared.forward);
      BOOST_TEST(real.backward == declared.backward);
    }
  }
}

#endif  // FERRY_CUDA_EMULATION

// Launches per GPT block (the difference between 2 and 1 layers), forward and backward.
// Issue 39's budget is 8 forward and 12 backward (llm.c's fused blocks need about 6 and 7);
// the limits here are today's counts, so that no change adds a launch unseen, and come down
// as blocks fuse. The ledger is the emulation's exact count (the case above).
BOOST_AUTO_TEST_CASE(a_gpt_block_stays_within_its_launch_budget) {
  const Launches one = ledger_launches(gpt_maker(1)), two = ledger_launches(gpt_maker(2));
  const int64_t forward = two.forward - one.forward, backward = two.backward - one.backward;
  BOOST_TEST_MESSAGE("launches per GPT block: forward " << forward << ", backward " << backward
                                                        << " (issue 39's goal: 8 and 12)");
  BOOST_TEST(forward <= kForwardBudget);
  BOOST_TEST(backward <= kBackwardBudget);
}
