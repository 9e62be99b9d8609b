#include "nn/gpt.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "nn/linear.h"
#include "nn/rng.h"

namespace ferry::nn {

namespace {

// Tensor order inside a block unit (UnitSpec::tensors index).
enum BlockTensor : size_t {
  kLn1W, kLn1B, kQkvW, kQkvB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB
};
enum EmbeddingTensor : size_t { kWte, kWpe };
enum FinalTensor : size_t { kLnfW, kLnfB };

}  // namespace

std::vector<UnitSpec> GPT::layout(const GPTConfig& c) {
  const int64_t C = c.n_embd;
  std::vector<UnitSpec> units;
  UnitSpec emb{"embedding", {}, 0};
  emb.add("wte", {c.vocab_size, C}, true);
  emb.add("wpe", {c.positions(), C}, true);
  units.push_back(emb);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    UnitSpec u{"block." + std::to_string(l), {}, 0};
    u.add(p + "ln_1.weight", {C}, false);
    u.add(p + "ln_1.bias", {C}, false);
    u.add(p + "attn.c_attn.weight", {3 * C, C}, true);
    u.add(p + "attn.c_attn.bias", {3 * C}, false);
    u.add(p + "attn.c_proj.weight", {C, C}, true);
    u.add(p + "attn.c_proj.bias", {C}, false);
    u.add(p + "ln_2.weight", {C}, false);
    u.add(p + "ln_2.bias", {C}, false);
    u.add(p + "mlp.c_fc.weight", {4 * C, C}, true);
    u.add(p + "mlp.c_fc.bias", {4 * C}, false);
    u.add(p + "mlp.c_proj.weight", {C, 4 * C}, true);
    u.add(p + "mlp.c_proj.bias", {C}, false);
    units.push_back(u);
  }
  UnitSpec fin{"final", {}, 0};
  fin.add("ln_f.weight", {C}, false);
  fin.add("ln_f.bias", {C}, false);
  units.push_back(fin);
  return units;
}

GPT::GPT(const GPTConfig& config, Device& device, DType dtype)
    : cfg_(config), dev_(device), dtype_(dtype), units_(layout(config)) {
  if (cfg_.n_layer < 1 || cfg_.n_head < 1 || cfg_.n_embd < 1 || cfg_.vocab_size < 1 ||
      cfg_.block_size < 1) {
    throw std::invalid_argument("GPT: every model dimension must be >= 1");
  }
  if (cfg_.n_embd % cfg_.n_head != 0) {
    throw std::invalid_argument("GPT: n_embd (" + std::to_string(cfg_.n_embd) +
                                ") must be a multiple of n_head (" + std::to_string(cfg_.n_head) + ")");
  }
  if (cfg_.positions() < cfg_.block_size) {
    throw std::invalid_argument("GPT: block_size (" + std::to_string(cfg_.block_size) + ") exceeds the " +
                                std::to_string(cfg_.positions()) + " positions of the model's wpe");
  }
  check_dtype("GPT", dtype);
}

GPT::~GPT() = default;

std::string GPT::describe() const {
  return "GPT-2 style, " + std::to_string(cfg_.n_layer) + " layers, " + std::to_string(cfg_.n_head) + " heads, " +
         std::to_string(cfg_.n_embd) + " channels, context " + std::to_string(cfg_.block_size) + ", vocab " +
         std::to_string(cfg_.vocab_size);
}

double GPT::flops_per_token(const GPTConfig& cfg, int64_t T) {
  const int64_t C = cfg.n_embd;
  const double matmul_weights = static_cast<double>(cfg.n_layer * 12 * C * C + cfg.vocab_size * C);
  const double attention = static_cast<double>(cfg.n_layer) * 12.0 * static_cast<double>(T * C);
  return 6.0 * matmul_weights + attention;
}

std::vector<double> GPT::initial_values(int unit, size_t i, uint64_t seed) const {
  const TensorSpec& t = units_.at(static_cast<size_t>(unit)).tensors.at(i);
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg_.n_layer));
  std::vector<double> host(static_cast<size_t>(t.numel()), 0.0);
  const bool is_gain = t.name.ends_with("ln_1.weight") || t.name.ends_with("ln_2.weight") ||
                       t.name.ends_with("ln_f.weight");
  if (is_gain) {
    host.assign(host.size(), 1.0);
  } else if (t.decay) {
    const bool into_residual = t.name.ends_with("c_proj.weight");
    const double sd = into_residual ? residual_std : 0.02;
    Rng rng = Rng::derive({seed, static_cast<uint64_t>(unit), i});
    for (double& x : host) x = sd * rng.normal();
  }
  return host;
}

void GPT::init_unit(int unit, const Tensor& flat, uint64_t seed) const {
  const UnitSpec& u = units_.at(static_cast<size_t>(unit));
  if (flat.numel() != u.numel) throw std::invalid_argument("GPT::init_unit: wrong buffer size");
  for (size_t i = 0; i < u.tensors.size(); ++i) {
    if (u.tensors[i].quantized()) continue;  // its bytes come from quantized_bytes
    write_values(dev_, u.view(flat, i), initial_values(unit, i, seed));
  }
  init_adapters(dev_, unit, flat, seed);
}

void GPT::free_activations() { acts_ = Activations{}; }

void GPT::block_forward(int64_t l, const Tensor& w, int64_t B, int64_t T) {
  const int64_t N = B * T, C = cfg_.n_embd;
  const UnitSpec& u = units_[static_cast<size_t>(1 + l)];
  auto W = [&](size_t i) { return u.view(w, i); };
  auto L = [&](size_t wi, size_t bi) { return linear(static_cast<int>(1 + l), w, Tensor{}, wi, bi); };
  BlockActs& a = acts_.blocks[static_cast<size_t>(l)];
  const Tensor& x = acts_.residual[static_cast<size_t>(l)];
  a.ln1 = act({N, C});
  a.ln1_mean = stat({N});
  a.ln1_rstd = stat({N});
  dev_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, W(kLn1W), W(kLn1B));
  // The linear layers (nn/linear.h) with their bias (and the MLP's GELU) as one op: one
  // cuBLASLt call on the cuda device (nn/device_ops.h, linear_forward).
  a.qkv = act({N, 3 * C});
  linear_forward(dev_, L(kQkvW, kQkvB), a.qkv, a.ln1);
  a.atty = act({N, C});
  a.lse = stat({B, cfg_.n_head, T});
  dev_.attention_forward(a.atty, a.lse, a.qkv.reshape({B, T, 3 * C}), cfg_.n_head, 0, doc_start_);
  const Tensor scratch = act({N, C});
  linear_forward(dev_, L(kProjW, kProjB), scratch, a.atty);
  a.res2 = act({N, C});
  dev_.add(a.res2, x, scratch);
  a.ln2 = act({N, C});
  a.ln2_mean = stat({N});
  a.ln2_rstd = stat({N});
  dev_.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, W(kLn2W), W(kLn2B));
  a.fch = act({N, 4 * C});
  a.fch_gelu = act({N, 4 * C});
  linear_forward(dev_, L(kFcW, kFcB), a.fch_gelu, a.ln2, a.fch);
  linear_forward(dev_, L(kFcProjW, kFcProjB), scratch, a.fch_gelu);
  Tensor& out = acts_.residual[static_cast<size_t>(l + 1)];
  out = act({N, C});
  dev_.add(out, a.res2, scratch);
}

double GPT::forward(UnitAccess& units, const Tensor& tokens, const Tensor& targets, int64_t B,
                    int64_t T) {
  check_batch("GPT", cfg_.block_size, tokens, targets, B, T);
  free_activations();
  const int64_t N = B * T, C = cfg_.n_embd, V = cfg_.vocab_size;
  const int emb = 0, fin = num_units() - 1;
  acts_.B = B;
  acts_.T = T;
  acts_.tokens = tokens;
  acts_.targets = targets;
  acts_.residual.resize(static_cast<size_t>(cfg_.n_layer + 1));
  acts_.blocks.resize(static_cast<size_t>(cfg_.n_layer));

  const Tensor we = units.acquire_weights(emb);
  acts_.residual[0] = act({N, C});
  dev_.embedding_forward(acts_.residual[0], tokens, units_[0].view(we, kWte),
                         units_[0].view(we, kWpe), T);
  units.release_weights(emb);

  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const Tensor w = units.acquire_weights(static_cast<int>(1 + l));
    block_forward(l, w, B, T);
    if (checkpoint_) acts_.blocks[static_cast<size_t>(l)] = BlockActs{};  // recomputed in backward
    units.release_weights(static_cast<int>(1 + l));
  }

  const Tensor wf = units.acquire_weights(fin);
  const Tensor wt = units.acquire_weights(emb);
  acts_.lnf = act({N, C});
  acts_.lnf_mean = stat({N});
  acts_.lnf_rstd = stat({N});
  dev_.layernorm_forward(acts_.lnf, acts_.lnf_mean, acts_.lnf_rstd, acts_.residual.back(),
                         units_.back().view(wf, kLnfW), units_.back().view(wf, kLnfB));
  if (!targets.defined()) {
    acts_.logits = act({N, V});
    dev_.gemm(acts_.logits, acts_.lnf, false, units_[0].view(wt, kWte), true, 1.0, 0.0);
  } else {
    // The head and the loss fused: [N, V] is never stored (nn/linear_cross_entropy.h).
    acts_.losses = stat({N});
    dev_.linear_cross_entropy_forward(acts_.losses, acts_.lnf, units_[0].view(wt, kWte), targets);
  }
  units.release_weights(emb);
  units.release_weights(fin);
  if (!targets.defined()) return 0.0;
  return mean_loss(dev_, acts_.losses, targets);
}

void GPT::backward(UnitAccess& units) {
  if (!acts_.losses.defined()) {
    throw std::logic_error("GPT::backward without a forward that had targets");
  }
  const int64_t B = acts_.B, T = acts_.T, N = B * T, C = cfg_.n_embd;
  const int emb = 0, fin = num_units() - 1;

  // Head: loss -> (fused) logits -> ln_f -> residual stream.
  Tensor dx = act({N, C});
  {
    const Tensor wf = units.acquire_weights(fin), wt = units.acquire_weights(emb);
    const Tensor gf = units.acquire_grads(fin), gt = units.acquire_grads(emb);
    const UnitSpec &uf = units_.back(), &ue = units_[0];
    const Tensor dlnf = act({N, C});
    dev_.fill(dlnf, 0.0);
    // A frozen wte (tied head) gets no weight gradient: ue.grad_view is undefined.
    dev_.linear_cross_entropy_backward(dlnf, ue.grad_view(gt, kWte), acts_.lnf, ue.view(wt, kWte), acts_.targets,
                                       loss_scale_ / static_cast<double>(loss_tokens_));
    dev_.fill(dx, 0.0);
    dev_.layernorm_backward(dx, grad_or_scratch(dev_, uf, gf, kLnfW, dtype_),
                            grad_or_scratch(dev_, uf, gf, kLnfB, dtype_), dlnf, acts_.residual.back(),
                            uf.view(wf, kLnfW), acts_.lnf_mean, acts_.lnf_rstd);
    units.release_grads(emb, false);
    units.release_grads(fin, true);
    units.release_weights(emb);
    units.release_weights(fin);
  }
  acts_.lnf = acts_.losses = Tensor{};

  const Tensor dres2 = act({N, C}), dxin = act({N, C}), dln = act({N, C}), datty = act({N, C});
  const Tensor dfch = act({N, 4 * C}), dfch_gelu = act({N, 4 * C}), dqkv = act({N, 3 * C});
  for (int64_t l = cfg_.n_layer - 1; l >= 0; --l) {
    const int unit = static_cast<int>(1 + l);
    const UnitSpec& u = units_[static_cast<size_t>(unit)];
    const Tensor w = units.acquire_weights(unit);
    if (checkpoint_) {
      // The block's activations again, from its saved input; its output (the next block's
      // input, already through backward) is not needed and goes at once. Before the
      // gradient buffer is taken, so that the two are not in the arena together.
      block_forward(l, w, B, T);
      acts_.residual[static_cast<size_t>(l + 1)] = Tensor{};
    }
    const Tensor g = units.acquire_grads(unit);
    auto W = [&](size_t i) { return u.view(w, i); };
    auto G = [&](size_t i) { return grad_or_scratch(dev_, u, g, i, dtype_); };
    auto L = [&](size_t wi, size_t bi) { return linear(unit, w, g, wi, bi); };
    BlockActs& a = acts_.blocks[static_cast<size_t>(l)];
    const Tensor& x = acts_.residual[static_cast<size_t>(l)];

    // MLP branch: out = res2 + c_proj(gelu(c_fc(ln_2(res2)))); dx is d(out).
    dev_.copy(dres2, dx);
    linear_backward(dev_, L(kFcProjW, kFcProjB), dfch_gelu, dx, a.fch_gelu);
    dev_.fill(dfch, 0.0);
    dev_.gelu_backward(dfch, a.fch, dfch_gelu);
    linear_backward(dev_, L(kFcW, kFcB), dln, dfch, a.ln2);
    dev_.layernorm_backward(dres2, G(kLn2W), G(kLn2B), dln, a.res2, W(kLn2W), a.ln2_mean, a.ln2_rstd);

    // Attention branch: res2 = x + c_proj(attn(c_attn(ln_1(x)))).
    dev_.copy(dxin, dres2);
    linear_backward(dev_, L(kProjW, kProjB), datty, dres2, a.atty);
    dev_.fill(dqkv, 0.0);
    dev_.attention_backward(dqkv.reshape({B, T, 3 * C}), datty, a.qkv.reshape({B, T, 3 * C}), a.atty, a.lse,
                            cfg_.n_head, 0, doc_start_);
    linear_backward(dev_, L(kQkvW, kQkvB), dln, dqkv, a.ln1);
    dev_.layernorm_backward(dxin, G(kLn1W), G(kLn1B), dln, x, W(kLn1W), a.ln1_mean, a.ln1_rstd);
    dev_.copy(dx, dxin);

    units.release_grads(unit, true);
    units.release_weights(unit);
    a = BlockActs{};  // this block's activations are no longer needed
  }

  const Tensor ge = units.acquire_grads(emb);
  const UnitSpec& ue = units_[0];
  if (ue.tensors[kWte].trainable || ue.tensors[kWpe].trainable) {  // nothing to compute when both are frozen
    dev_.embedding_backward(grad_or_scratch(dev_, ue, ge, kWte, dtype_), grad_or_scratch(dev_, ue, ge, kWpe, dtype_),
                            dx, acts_.tokens, T);
  }
  units.release_grads(emb, true);
  free_activations();
}

}  // namespace ferry::nn
