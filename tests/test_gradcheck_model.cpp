// The whole GPT's gradient against central finite differences, in double precision, on a
// small odd configuration: every parameter of every unit is checked (the tied embedding
// gets gradient from both the head and the input).
#define BOOST_TEST_MODULE gradcheck_model
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <memory>

#include "nn/cpu_device.h"
#include "nn/gpt.h"
#include "nn/ledger_device.h"
#include "nn/llama.h"
#include "test_util.h"

using namespace ferry;
using nn::DType;
using nn::Tensor;

namespace {

// Every tensor of every unit (up to 60 elements each) against central differences of
// `loss`; returns the worst relative error, counting the elements checked.
double check_every_tensor(const nn::Model& model, const nn::ResidentUnits& units, const std::function<double()>& loss,
                          int64_t* checked = nullptr) {
  double worst = 0;
  for (size_t u = 0; u < units.weights.size(); ++u) {
    for (const nn::TensorSpec& t : model.units()[u].tensors) {
      const Tensor w = units.weights[u].view(t.offset, {t.numel()});
      const Tensor g = units.grads[u].view(t.offset, {t.numel()});
      const double err = test::max_grad_error(loss, w, g, 60);
      BOOST_TEST_INFO("tensor " << t.name);
      BOOST_TEST(err < 1e-6);
      worst = std::max(worst, err);
      if (checked) *checked += std::min<int64_t>(t.numel(), 60);
    }
  }
  return worst;
}

}  // namespace

BOOST_AUTO_TEST_CASE(full_model_gradient_matches_finite_differences) {
  nn::CpuDevice dev(1 << 28);
  nn::GPTConfig cfg{/*n_layer=*/2, /*n_head=*/3, /*n_embd=*/9, /*vocab_size=*/11, /*block_size=*/7};
  nn::GPT model(cfg, dev, DType::f64);
  nn::ResidentUnits units(dev, DType::f64, model.units());
  for (int u = 0; u < model.num_units(); ++u) model.init_unit(u, units.weights[static_cast<size_t>(u)], 7);
  // Larger weights than GPT-2's 0.02 so that every path (attention mixing, GELU curvature)
  // carries gradient of order one.
  for (Tensor& w : units.weights) {
    nn::Tensor noise = test::random_tensor(dev, DType::f64, w.shape(), 99, 0.3);
    dev.accumulate(w, noise);
  }
  const int64_t B = 2, T = 5;
  Tensor tokens = Tensor::empty(dev, DType::i32, {B * T}), targets = Tensor::empty(dev, DType::i32, {B * T});
  nn::Rng rng(3);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens.data_as<int32_t>()[i] = static_cast<int32_t>(rng.below(11));
    targets.data_as<int32_t>()[i] = static_cast<int32_t>(rng.below(11));
  }
  auto loss = [&] { return model.forward(units, tokens, targets, B, T); };
  const double l0 = loss();
  BOOST_TEST(std::isfinite(l0));
  model.backward(units);
  int64_t checked = 0;
  const double worst = check_every_tensor(model, units, loss, &checked);
  BOOST_TEST_MESSAGE("checked ~" << checked << " parameters, worst relative error " << worst);
}

BOOST_AUTO_TEST_CASE(gradients_accumulate_over_micro_batches) {
  // backward() adds: two backward passes of the same batch give twice the gradient.
  nn::CpuDevice dev(1 << 28);
  nn::GPTConfig cfg{1, 2, 8, 13, 6};
  nn::GPT model(cfg, dev, DType::f64);
  nn::ResidentUnits units(dev, DType::f64, model.units());
  for (int u = 0; u < model.num_units(); ++u) model.init_unit(u, units.weights[static_cast<size_t>(u)], 1);
  Tensor tokens = Tensor::empty(dev, DType::i32, {6}), targets = Tensor::empty(dev, DType::i32, {6});
  for (int i = 0; i < 6; ++i) tokens.data_as<int32_t>()[i] = i, targets.data_as<int32_t>()[i] = (i * 7) % 13;
  model.forward(units, tokens, targets, 1, 6);
  model.backward(units);
  std::vector<double> once(units.grads[1].data_as<double>(), units.grads[1].data_as<double>() + units.grads[1].numel());
  model.forward(units, tokens, targets, 1, 6);
  model.backward(units);
  // Not bit-exact: a GEMM with beta = 1 accumulates inside its kernel, in another order.
  for (size_t i = 0; i < once.size(); ++i) {
    BOOST_TEST(std::abs(units.grads[1].data_as<double>()[i] - 2 * once[i]) <= 1e-14 + 1e-12 * std::abs(once[i]));
  }
  BOOST_TEST(dev.memory().in_use > 0u);
}

BOOST_AUTO_TEST_CASE(forward_rejects_bad_shapes) {
  nn::CpuDevice dev(1 << 24);
  nn::GPT model({1, 2, 8, 13, 6}, dev, DType::f32);
  nn::ResidentUnits units(dev, DType::f32, model.units());
  Tensor tokens = Tensor::empty(dev, DType::i32, {7});
  BOOST_CHECK_THROW(model.forward(units, tokens, Tensor{}, 1, 7), std::invalid_argument);  // T > block_size
  BOOST_CHECK_THROW(nn::GPT({1, 3, 8, 13, 6}, dev), std::invalid_argument);                // 8 % 3 != 0
}

// The Llama-style model: every tensor's gradient (RMSNorm gains, fused q/k/v with rotary
// embeddings and 3 query heads per key/value head, SwiGLU, untied head) against central
// differences; with activation checkpointing the same gradient bit for bit.
BOOST_AUTO_TEST_CASE(llama_gradient_matches_finite_differences) {
  nn::CpuDevice dev(1 << 28);
  nn::LlamaConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 6;
  cfg.n_kv_head = 2;
  cfg.n_embd = 12;
  cfg.intermediate = 10;
  cfg.vocab_size = 11;
  cfg.block_size = 7;
  nn::Llama model(cfg, dev, DType::f64);
  nn::ResidentUnits units(dev, DType::f64, model.units());
  for (int u = 0; u < model.num_units(); ++u) model.init_unit(u, units.weights[static_cast<size_t>(u)], 7);
  for (Tensor& w : units.weights) dev.accumulate(w, test::random_tensor(dev, DType::f64, w.shape(), 98, 0.3));
  const int64_t B = 2, T = 5;
  Tensor tokens = Tensor::empty(dev, DType::i32, {B * T}), targets = Tensor::empty(dev, DType::i32, {B * T});
  nn::Rng rng(4);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens.data_as<int32_t>()[i] = static_cast<int32_t>(rng.below(11));
    targets.data_as<int32_t>()[i] = static_cast<int32_t>(rng.below(11));
  }
  auto loss = [&] { return model.forward(units, tokens, targets, B, T); };
  BOOST_TEST(std::isfinite(loss()));
  model.backward(units);
  const double worst = check_every_tensor(model, units, loss);
  BOOST_TEST_MESSAGE("llama: worst relative error " << worst);
  std::vector<std::vector<double>> plain;
  for (const Tensor& g : units.grads) plain.emplace_back(g.data_as<double>(), g.data_as<double>() + g.numel());
  units.zero_grads();
  model.set_activation_checkpointing(true);
  loss();
  model.backward(units);
  for (size_t u = 0; u < units.grads.size(); ++u) {
    const std::vector<double> ck(units.grads[u].data_as<double>(), units.grads[u].data_as<double>() + units.grads[u].numel());
    BOOST_TEST(ck == plain[u], boost::test_tools::per_element());
  }
}

// The Llama variants a Hugging Face folder brings: Qwen2's q/k/v biases, a head tied to the
// token embedding (it gets gradient from the head and the input), Llama 3's rope scaling;
// and a loss over only some positions (targets kIgnoreTarget are prompt or padding: the
// loss is the mean over the others, and the ignored ones give no gradient); packed
// documents (attention within each). GPT-2 too, with ignored targets.
BOOST_AUTO_TEST_CASE(llama_variants_and_ignored_targets) {
  nn::CpuDevice dev(1 << 28);
  nn::LlamaConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_kv_head = 1;
  cfg.n_embd = 12;
  cfg.intermediate = 10;
  cfg.vocab_size = 11;
  cfg.block_size = 7;
  cfg.qkv_bias = true;
  cfg.tie_embeddings = true;
  cfg.rope_theta = 500.0;
  cfg.rope_factor = 4.0;
  cfg.rope_original_max_positions = 4;
  nn::Llama llama(cfg, dev, DType::f64);
  nn::GPT gpt(nn::GPTConfig{1, 2, 8, 11, 7}, dev, DType::f64);
  for (nn::Model* model : {static_cast<nn::Model*>(&llama), static_cast<nn::Model*>(&gpt)}) {
    nn::ResidentUnits units(dev, DType::f64, model->units());
    for (int u = 0; u < model->num_units(); ++u) model->init_unit(u, units.weights[static_cast<size_t>(u)], 7);
    for (Tensor& w : units.weights) dev.accumulate(w, test::random_tensor(dev, DType::f64, w.shape(), 97, 0.3));
    const int64_t B = 2, T = 5;
    Tensor tokens = Tensor::empty(dev, DType::i32, {B * T}), targets = Tensor::empty(dev, DType::i32, {B * T});
    nn::Rng rng(5);
    for (int64_t i = 0; i < B * T; ++i) {
      tokens.data_as<int32_t>()[i] = static_cast<int32_t>(rng.below(11));
      // The first 3 positions of each row are "prompt".
      targets.data_as<int32_t>()[i] = i % T < 3 ? nn::kIgnoreTarget : static_cast<int32_t>(rng.below(11));
    }
    // Packed documents in the Llama rows: row 0 holds [0, 3) and [3, 5), row 1 [0, 1) and [1, 5).
    Tensor starts = Tensor::empty(dev, DType::i32, {B * T});
    const int32_t s[] = {0, 0, 0, 3, 3, 0, 1, 1, 1, 1};
    std::copy(s, s + B * T, starts.data_as<int32_t>());
    model->set_document_starts(model == &llama ? starts : Tensor{});
    auto loss = [&] { return model->forward(units, tokens, targets, B, T); };
    // The mean over the 4 counted positions: the fused head's losses against the logits of
    // a forward without targets, summed here.
    model->forward(units, tokens, Tensor{}, B, T);
    const Tensor logits = model->logits();
    const double l0 = loss();
    double sum = 0;
    for (int64_t i = 0; i < B * T; ++i) {
      const int32_t t = targets.data_as<int32_t>()[i];
      if (t == nn::kIgnoreTarget) continue;
      const double* row = logits.data_as<double>() + i * 11;
      double mx = row[0], z = 0;
      for (int v = 0; v < 11; ++v) mx = std::max(mx, row[v]);
      for (int v = 0; v < 11; ++v) z += std::exp(row[v] - mx);
      sum += std::log(z) + mx - row[t];
    }
    BOOST_TEST(l0 == sum / 4.0, boost::test_tools::tolerance(1e-12));
    model->backward(units);
    const double worst = check_every_tensor(*model, units, loss);
    BOOST_TEST_MESSAGE(model->describe() << ": worst relative error " << worst);
  }
}

// Qwen3's block (nn/arch.h "qwen3"): an RMSNorm on each query and key head before the
// rotation (nn/qk_norm.h, composed of gathers and the rmsnorm kernel over rows of head_dim)
// and a head size of its own (4, where n_embd / n_head is 6: wqkv [(2+2)*4, 12], wo [12, 8]).
// Every tensor, q_norm and k_norm included, against central differences, with activation
// checkpointing off and on (the recomputed forward gives the same gradients).
BOOST_AUTO_TEST_CASE(qwen3_head_norms_and_own_head_size) {
  nn::CpuDevice dev(1 << 28);
  nn::LlamaConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_kv_head = 1;
  cfg.n_embd = 12;
  cfg.head_size = 4;
  cfg.intermediate = 10;
  cfg.vocab_size = 11;
  cfg.block_size = 7;
  cfg.qk_norm = true;
  cfg.tie_embeddings = true;
  cfg.norm_eps = 1e-6;
  nn::Llama model(cfg, dev, DType::f64);
  BOOST_TEST(model.units()[1].tensors.at(2).name == "layers.0.attention.q_norm.weight");
  BOOST_TEST(model.units()[1].tensors.at(4).shape == (nn::Shape{12, 8}), "wo is [n_embd, n_head * head_size]");
  nn::ResidentUnits units(dev, DType::f64, model.units());
  for (int u = 0; u < model.num_units(); ++u) model.init_unit(u, units.weights[static_cast<size_t>(u)], 7);
  for (Tensor& w : units.weights) dev.accumulate(w, test::random_tensor(dev, DType::f64, w.shape(), 93, 0.3));
  const int64_t B = 2, T = 5;
  Tensor tokens = Tensor::empty(dev, DType::i32, {B * T}), targets = Tensor::empty(dev, DType::i32, {B * T});
  nn::Rng rng(9);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens.data_as<int32_t>()[i] = static_cast<int32_t>(rng.below(11));
    targets.data_as<int32_t>()[i] = static_cast<int32_t>(rng.below(11));
  }
  auto loss = [&] { return model.forward(units, tokens, targets, B, T); };
  units.zero_grads();
  loss();
  model.backward(units);
  const double worst = check_every_tensor(model, units, loss);
  BOOST_TEST_MESSAGE(model.describe() << ": worst relative error " << worst);
  std::vector<std::vector<double>> plain;
  for (const Tensor& g : units.grads) plain.emplace_back(g.data_as<double>(), g.data_as<double>() + g.numel());
  // The q/k norm weights carry gradient (a composition that dropped it would pass with zeros).
  const nn::TensorSpec& qn = model.units()[1].tensors.at(2);
  double qn_grad = 0;
  for (int64_t i = 0; i < qn.numel(); ++i) qn_grad += std::abs(plain[1][static_cast<size_t>(qn.offset + i)]);
  BOOST_TEST(qn_grad > 1e-3);
  units.zero_grads();
  model.set_activation_checkpointing(true);
  loss();
  model.backward(units);
  for (size_t u = 0; u < units.grads.size(); ++u) {
    const std::vector<double> ck(units.grads[u].data_as<double>(), units.grads[u].data_as<double>() + units.grads[u].numel());
    BOOST_TEST(ck == plain[u], boost::test_tools::per_element());
  }
}

// Frozen tensors (nn/unit.h, nn/linear.h): a frozen tensor has no place in its unit's
// gradient buffer (a unit of only frozen tensors has none) and no gradient is computed for
// it; the loss and every trainable tensor's gradient stay those of the all-trainable
// model, bit for bit. Frozen here: a whole block, the embedding (tied to the head in the
// GPT and in one Llama, so the fused head computes no weight gradient), projections, a
// bias, norm gains.
BOOST_AUTO_TEST_CASE(frozen_tensors_get_no_gradient_and_change_no_other) {
  nn::CpuDevice dev(1 << 28);
  nn::LlamaConfig lc;
  lc.n_layer = 2;
  lc.n_head = 2;
  lc.n_kv_head = 1;
  lc.n_embd = 8;
  lc.intermediate = 6;
  lc.vocab_size = 11;
  lc.block_size = 6;
  lc.qkv_bias = true;
  lc.qk_norm = true;
  const nn::GPTConfig gc{2, 2, 8, 11, 6};
  nn::LlamaConfig tied = lc;  // the head is tok_embeddings: frozen, the fused head computes no dw
  tied.tie_embeddings = true;
  struct Case {
    const nn::LlamaConfig* llama;  // null: the GPT
    std::vector<std::string> frozen;
  };
  std::vector<std::string> gpt_frozen = {"wte", "h.1.mlp.c_fc.weight", "h.1.ln_1.bias", "ln_f.weight"};
  std::vector<std::string> llama_frozen = {"tok_embeddings.weight", "layers.1.attention.wqkv.weight",
                                           "layers.1.attention.q_norm.weight", "norm.weight", "output.weight"};
  const std::vector<nn::UnitSpec> gpt_units = nn::GPT::layout(gc), llama_units = nn::Llama::layout(lc);
  for (const nn::TensorSpec& t : gpt_units[1].tensors) gpt_frozen.push_back(t.name);  // block 0, whole
  for (const nn::TensorSpec& t : llama_units[1].tensors) llama_frozen.push_back(t.name);
  for (const Case& c : {Case{nullptr, gpt_frozen}, Case{&lc, llama_frozen},
                        Case{&tied, {"tok_embeddings.weight", "layers.0.ffn_norm.weight"}}}) {
    auto make = [&]() -> std::unique_ptr<nn::Model> {
      if (c.llama) return std::make_unique<nn::Llama>(*c.llama, dev, DType::f64);
      return std::make_unique<nn::GPT>(gc, dev, DType::f64);
    };
    std::unique_ptr<nn::Model> all = make(), part = make();
    part->freeze(c.frozen);
    BOOST_CHECK_THROW(make()->freeze({"no.such.tensor"}), std::invalid_argument);
    nn::ResidentUnits ua(dev, DType::f64, all->units()), up(dev, DType::f64, part->units());
    for (int u = 0; u < all->num_units(); ++u) all->init_unit(u, ua.weights[static_cast<size_t>(u)], 7);
    for (Tensor& w : ua.weights) dev.accumulate(w, test::random_tensor(dev, DType::f64, w.shape(), 97, 0.3));
    // The same weights in the frozen model's layout: trainable tensors first in each unit.
    for (size_t u = 0; u < ua.weights.size(); ++u) {
      const nn::UnitSpec &sa = all->units()[u], &sp = part->units()[u];
      int64_t end = 0;
      for (size_t i = 0; i < sa.tensors.size(); ++i) {
        dev.copy(sp.view(up.weights[u], i), sa.view(ua.weights[u], i));
        if (sp.tensors[i].trainable) {
          BOOST_TEST(sp.tensors[i].offset + sp.tensors[i].numel() <= sp.trainable_numel);
          end = std::max(end, sp.tensors[i].offset + sp.tensors[i].numel());
        } else {
          BOOST_TEST(sp.tensors[i].offset >= sp.trainable_numel);
        }
      }
      BOOST_TEST(sp.trainable_numel == end);
      BOOST_TEST(sp.numel >= sa.numel - static_cast<int64_t>(sa.tensors.size()) * nn::kTensorAlign);
      BOOST_TEST(up.grads[u].defined() == (sp.trainable_numel > 0));
      if (up.grads[u].defined()) BOOST_TEST(up.grads[u].numel() == sp.trainable_numel);
    }
    if (c.llama != &tied) BOOST_TEST(!up.grads[1].defined());  // block 0 is frozen whole
    const int64_t B = 2, T = 5;
    Tensor tokens = Tensor::empty(dev, DType::i32, {B * T}), targets = Tensor::empty(dev, DType::i32, {B * T});
    nn::Rng rng(11);
    for (int64_t i = 0; i < B * T; ++i) {
      tokens.data_as<int32_t>()[i] = static_cast<int32_t>(rng.below(11));
      targets.data_as<int32_t>()[i] = static_cast<int32_t>(rng.below(11));
    }
    const double la = all->forward(ua, tokens, targets, B, T), lp = part->forward(up, tokens, targets, B, T);
    BOOST_TEST(la == lp);
    all->backward(ua);
    part->backward(up);
    int trained = 0;
    for (size_t u = 0; u < ua.weights.size(); ++u) {
      const nn::UnitSpec &sa = all->units()[u], &sp = part->units()[u];
      for (size_t i = 0; i < sa.tensors.size(); ++i) {
        const Tensor gp = sp.grad_view(up.grads[u], i);
        BOOST_TEST(gp.defined() == sp.tensors[i].trainable, sp.tensors[i].name);
        if (!gp.defined()) continue;
        const Tensor ga = sa.grad_view(ua.grads[u], i);
        BOOST_TEST(std::memcmp(ga.data(), gp.data(), static_cast<size_t>(ga.numel()) * 8) == 0, sa.tensors[i].name);
        ++trained;
      }
    }
    BOOST_TEST(trained > 3);
  }
}

// What a frozen weight saves: its weight-gradient GEMM, 2 N x in x out FLOPs of backward,
// counted by the op ledger (nn/op_ledger.h) over one forward and backward.
BOOST_AUTO_TEST_CASE(a_frozen_weight_runs_no_gradient_gemm) {
  const nn::GPTConfig gc{2, 2, 8, 11, 6};
  const int64_t B = 2, T = 5, N = B * T, C = 8;
  auto flops = [&](const std::vector<std::string>& frozen) {
    nn::LedgerDevice dev("ledger", size_t{1} << 28);
    nn::GPT model(gc, dev, DType::f32);
    model.freeze(frozen);
    nn::ResidentUnits units(dev, DType::f32, model.units());
    Tensor tokens = Tensor::empty(dev, DType::i32, {N}), targets = Tensor::empty(dev, DType::i32, {N});
    model.forward(units, tokens, targets, B, T);
    model.backward(units);
    return dev.ledger().flops();
  };
  const double all = flops({}), fc = flops({"h.1.mlp.c_fc.weight"});
  BOOST_TEST(all - fc == 2.0 * N * (4 * C) * C);
}
