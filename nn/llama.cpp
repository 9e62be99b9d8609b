#include "nn/llama.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "nn/linear.h"
#include "nn/rng.h"

namespace ferry::nn {

namespace {

// A block's tensors; the optional ones (bqkv with qkv_bias, q_norm and k_norm with qk_norm)
// shift the later ones' indices in the UnitSpec: slot() maps a name to its index.
enum BlockTensor : size_t { kAttnNorm, kWqkv, kBqkv, kQNorm, kKNorm, kWo, kFfnNorm, kWGateUp, kWDown };
enum FinalTensor : size_t { kNorm, kOutput };
constexpr size_t kTok = 0;

// The index in a block's UnitSpec of BlockTensor i (present in this configuration).
size_t slot(const LlamaConfig& c, size_t i) {
  size_t at = i;
  if (i > kBqkv && !c.qkv_bias) --at;
  if (i > kKNorm && !c.qk_norm) at -= 2;
  return at;
}

// The qkv projection's bias, where the configuration has one (Qwen2).
size_t qkv_bias(const LlamaConfig& c) { return c.qkv_bias ? slot(c, kBqkv) : kNoBias; }

}  // namespace

std::vector<UnitSpec> Llama::layout(const LlamaConfig& c) {
  std::vector<UnitSpec> units;
  UnitSpec emb;
  emb.name = "embedding";
  emb.add("tok_embeddings.weight", {c.vocab_size, c.n_embd}, true);
  units.push_back(emb);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    UnitSpec b;
    b.name = "block." + std::to_string(l);
    const std::string p = "layers." + std::to_string(l) + ".";
    b.add(p + "attention_norm.weight", {c.n_embd}, false);
    b.add(p + "attention.wqkv.weight", {c.qkv_width(), c.n_embd}, true);
    if (c.qkv_bias) b.add(p + "attention.bqkv.bias", {c.qkv_width()}, false);
    if (c.qk_norm) {
      b.add(p + "attention.q_norm.weight", {c.head_dim()}, false);
      b.add(p + "attention.k_norm.weight", {c.head_dim()}, false);
    }
    b.add(p + "attention.wo.weight", {c.n_embd, c.q_width()}, true);
    b.add(p + "ffn_norm.weight", {c.n_embd}, false);
    b.add(p + "feed_forward.w_gate_up.weight", {2 * c.intermediate, c.n_embd}, true);
    b.add(p + "feed_forward.w_down.weight", {c.n_embd, c.intermediate}, true);
    units.push_back(b);
  }
  UnitSpec fin;
  fin.name = "final";
  fin.add("norm.weight", {c.n_embd}, false);
  if (!c.tie_embeddings) fin.add("output.weight", {c.vocab_size, c.n_embd}, true);
  units.push_back(fin);
  return units;
}

Llama::Llama(const LlamaConfig& config, Device& device, DType dtype)
    : cfg_(config), dev_(device), dtype_(dtype), units_(layout(config)) {
  const LlamaConfig& c = cfg_;
  if (c.n_layer < 1 || c.n_head < 1 || c.n_kv_head < 1 || c.n_embd < 1 || c.intermediate < 1 || c.vocab_size < 1 ||
      c.block_size < 1) {
    throw std::invalid_argument("Llama: every model dimension must be >= 1");
  }
  if (c.head_size < 0 || (c.head_size == 0 && c.n_embd % c.n_head != 0) || c.head_dim() % 2 != 0) {
    throw std::invalid_argument("Llama: n_embd (" + std::to_string(c.n_embd) + ") must be n_head (" +
                                std::to_string(c.n_head) + ") x an even head size (rotary embeddings pair halves), "
                                "or head_size given and even");
  }
  if (c.n_head % c.n_kv_head != 0) {
    throw std::invalid_argument("Llama: n_head (" + std::to_string(c.n_head) + ") must be a multiple of n_kv_head (" +
                                std::to_string(c.n_kv_head) + ")");
  }
  if (c.rope_factor > 0.0 && !(c.rope_high_freq_factor > c.rope_low_freq_factor && c.rope_low_freq_factor > 0.0 &&
                              c.rope_original_max_positions > 0)) {
    throw std::invalid_argument("Llama: llama3 rope scaling needs high_freq_factor > low_freq_factor > 0 and "
                                "original_max_position_embeddings > 0");
  }
  check_dtype("Llama", dtype);
  if (c.qk_norm) head_norm_ = HeadNorm(device, dtype, stat_dtype(dtype), c.n_head, c.n_kv_head, c.head_dim(), c.norm_eps);
}

Llama::~Llama() = default;

std::string Llama::describe() const {
  return "Llama style, " + std::to_string(cfg_.n_layer) + " layers, " + std::to_string(cfg_.n_head) + " heads (" +
         std::to_string(cfg_.n_kv_head) + " key/value), " + std::to_string(cfg_.n_embd) + " channels, SwiGLU " +
         std::to_string(cfg_.intermediate) + ", context " + std::to_string(cfg_.block_size) + ", vocab " +
         std::to_string(cfg_.vocab_size) + (cfg_.qkv_bias ? ", q/k/v biases" : "") +
         (cfg_.qk_norm ? ", q/k norms" : "") +
         (cfg_.head_size > 0 ? ", head size " + std::to_string(cfg_.head_size) : "") +
         (cfg_.tie_embeddings ? ", tied head" : "") +
         (cfg_.rope_factor > 0.0 ? ", llama3 rope scaling x" + std::to_string(cfg_.rope_factor).substr(0, 4) : "");
}

double Llama::flops_per_token(const LlamaConfig& c, int64_t T) {
  const double C = static_cast<double>(c.n_embd);
  const double QW = static_cast<double>(c.q_width());
  const double per_block = static_cast<double>(c.qkv_width()) * C + C * QW + 3.0 * static_cast<double>(c.intermediate) * C;
  const double matmul_weights = static_cast<double>(c.n_layer) * per_block + static_cast<double>(c.vocab_size) * C;
  return 6.0 * matmul_weights + static_cast<double>(c.n_layer) * 12.0 * static_cast<double>(T) * QW;
}

std::vector<double> Llama::initial_values(int unit, size_t i, uint64_t seed) const {
  const TensorSpec& t = units_.at(static_cast<size_t>(unit)).tensors.at(i);
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg_.n_layer));
  std::vector<double> host(static_cast<size_t>(t.numel()), 0.0);
  if (t.name.ends_with(".bias")) {
    // zero, as nn::GPT's biases
  } else if (!t.decay) {
    host.assign(host.size(), 1.0);  // the norms' gains
  } else {
    const bool into_residual = t.name.ends_with("wo.weight") || t.name.ends_with("w_down.weight");
    Rng rng = Rng::derive({seed, static_cast<uint64_t>(unit), i});
    for (double& x : host) x = (into_residual ? residual_std : 0.02) * rng.normal();
  }
  return host;
}

void Llama::init_unit(int unit, const Tensor& flat, uint64_t seed) const {
  const UnitSpec& u = units_.at(static_cast<size_t>(unit));
  if (flat.numel() != u.numel) throw std::invalid_argument("Llama::init_unit: wrong buffer size");
  for (size_t i = 0; i < u.tensors.size(); ++i) {
    if (u.tensors[i].quantized()) continue;  // its bytes come from quantized_bytes
    write_values(dev_, u.view(flat, i), initial_values(unit, i, seed));
  }
  init_adapters(dev_, unit, flat, seed);
}

void Llama::free_activations() { acts_ = Activations{}; }

void Llama::block_forward(int64_t l, const Tensor& w, int64_t B, int64_t T) {
  const int64_t N = B * T, C = cfg_.n_embd, W = cfg_.qkv_width(), I = cfg_.intermediate;
  const UnitSpec& u = units_[static_cast<size_t>(1 + l)];
  auto Wt = [&](size_t i) { return u.view(w, slot(cfg_, i)); };
  const int unit = static_cast<int>(1 + l);
  auto L = [&](size_t wi) { return linear(unit, w, Tensor{}, slot(cfg_, wi), wi == kWqkv ? qkv_bias(cfg_) : kNoBias); };
  BlockActs& a = acts_.blocks[static_cast<size_t>(l)];
  const Tensor& x = acts_.residual[static_cast<size_t>(l)];
  a.xn = act({N, C});
  a.rstd1 = stat({N});
  dev_.rmsnorm_forward(a.xn, a.rstd1, x, Wt(kAttnNorm), cfg_.norm_eps);
  a.qkv = act({N, W});
  linear_forward(dev_, L(kWqkv), a.qkv, a.xn);
  if (cfg_.qk_norm) head_norm_.forward(a.qkv, Wt(kQNorm), Wt(kKNorm), a.qk);
  // q and k rotated in place; backward's attention reads the rotated values.
  dev_.rope_forward(a.qkv, a.qkv, T, cfg_.n_head + cfg_.n_kv_head, cfg_.head_dim(), cfg_.rope());
  a.atty = act({N, cfg_.q_width()});
  a.lse = stat({B, cfg_.n_head, T});
  dev_.attention_forward(a.atty, a.lse, a.qkv.reshape({B, T, W}), cfg_.n_head, cfg_.n_kv_head, doc_start_);
  const Tensor scratch = act({N, C});
  linear_forward(dev_, L(kWo), scratch, a.atty);
  a.res2 = act({N, C});
  dev_.add(a.res2, x, scratch);
  a.xn2 = act({N, C});
  a.rstd2 = stat({N});
  dev_.rmsnorm_forward(a.xn2, a.rstd2, a.res2, Wt(kFfnNorm), cfg_.norm_eps);
  a.gate_up = act({N, 2 * I});
  linear_forward(dev_, L(kWGateUp), a.gate_up, a.xn2);
  a.h = act({N, I});
  dev_.swiglu_forward(a.h, a.gate_up);
  linear_forward(dev_, L(kWDown), scratch, a.h);
  Tensor& out = acts_.residual[static_cast<size_t>(l + 1)];
  out = act({N, C});
  dev_.add(out, a.res2, scratch);
}

double Llama::forward(UnitAccess& units, const Tensor& tokens, const Tensor& targets, int64_t B, int64_t T) {
  check_batch("Llama", cfg_.block_size, tokens, targets, B, T);
  free_activations();
  const int64_t N = B * T, C = cfg_.n_embd, V = cfg_.vocab_size;
  const int emb = 0, fin = num_units() - 1;
  acts_.B = B;
  acts_.T = T;
  acts_.tokens = tokens;
  acts_.targets = targets;
  acts_.residual.resize(static_cast<size_t>(cfg_.n_layer + 1));
  acts_.blocks.resize(static_cast<size_t>(cfg_.n_layer));

  {
    // Positions enter through the rotary embeddings: the embedding kernel gets a zero
    // position table.
    const Tensor we = units.acquire_weights(emb);
    const Tensor no_positions = act({T, C});
    dev_.fill(no_positions, 0.0);
    acts_.residual[0] = act({N, C});
    dev_.embedding_forward(acts_.residual[0], tokens, units_[0].view(we, kTok), no_positions, T);
    units.release_weights(emb);
  }
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const Tensor w = units.acquire_weights(static_cast<int>(1 + l));
    block_forward(l, w, B, T);
    if (checkpoint_) acts_.blocks[static_cast<size_t>(l)] = BlockActs{};
    units.release_weights(static_cast<int>(1 + l));
  }
  const Tensor wf = units.acquire_weights(fin);
  const UnitSpec& uf = units_.back();
  acts_.xf = act({N, C});
  acts_.rstdf = stat({N});
  dev_.rmsnorm_forward(acts_.xf, acts_.rstdf, acts_.residual.back(), uf.view(wf, kNorm), cfg_.norm_eps);
  const Tensor wt = cfg_.tie_embeddings ? units.acquire_weights(emb) : Tensor{};
  const Tensor head = cfg_.tie_embeddings ? units_[0].view(wt, kTok) : uf.view(wf, kOutput);
  if (!targets.defined()) {
    acts_.logits = act({N, V});
    dev_.gemm(acts_.logits, acts_.xf, false, head, true, 1.0, 0.0);
  } else {
    // The head and the loss fused: [N, V] is never stored (nn/linear_cross_entropy.h).
    acts_.losses = stat({N});
    dev_.linear_cross_entropy_forward(acts_.losses, acts_.xf, head, targets);
  }
  if (cfg_.tie_embeddings) units.release_weights(emb);
  units.release_weights(fin);
  if (!targets.defined()) return 0.0;
  return mean_loss(dev_, acts_.losses, targets);
}

void Llama::backward(UnitAccess& units) {
  if (!acts_.losses.defined()) throw std::logic_error("Llama::backward without a forward that had targets");
  const int64_t B = acts_.B, T = acts_.T, N = B * T, C = cfg_.n_embd;
  const int64_t W = cfg_.qkv_width(), I = cfg_.intermediate;
  const int emb = 0, fin = num_units() - 1;

  Tensor dx = act({N, C});
  {
    const Tensor wf = units.acquire_weights(fin), gf = units.acquire_grads(fin);
    const UnitSpec& uf = units_.back();
    const Tensor dxf = act({N, C});
    dev_.fill(dxf, 0.0);
    const double dloss = loss_scale_ / static_cast<double>(loss_tokens_);
    // A frozen head gets no weight gradient (grad_view undefined).
    if (cfg_.tie_embeddings) {
      const Tensor wt = units.acquire_weights(emb), gt = units.acquire_grads(emb);
      dev_.linear_cross_entropy_backward(dxf, units_[0].grad_view(gt, kTok), acts_.xf, units_[0].view(wt, kTok),
                                         acts_.targets, dloss);
      units.release_grads(emb, false);
      units.release_weights(emb);
    } else {
      dev_.linear_cross_entropy_backward(dxf, uf.grad_view(gf, kOutput), acts_.xf, uf.view(wf, kOutput),
                                         acts_.targets, dloss);
    }
    dev_.fill(dx, 0.0);
    dev_.rmsnorm_backward(dx, grad_or_scratch(dev_, uf, gf, kNorm, dtype_), dxf, acts_.residual.back(),
                          uf.view(wf, kNorm), acts_.rstdf);
    units.release_grads(fin, true);
    units.release_weights(fin);
  }
  acts_.xf = acts_.losses = Tensor{};

  const Tensor dres2 = act({N, C}), dxin = act({N, C}), dnorm = act({N, C}), datty = act({N, cfg_.q_width()});
  const Tensor dh = act({N, I}), dgu = act({N, 2 * I}), dqkv = act({N, W}), dpre = act({N, W});
  for (int64_t l = cfg_.n_layer - 1; l >= 0; --l) {
    const int unit = static_cast<int>(1 + l);
    const UnitSpec& u = units_[static_cast<size_t>(unit)];
    const Tensor w = units.acquire_weights(unit);
    if (checkpoint_) {
      block_forward(l, w, B, T);  // as nn::GPT: recomputed before the gradient buffer is taken
      acts_.residual[static_cast<size_t>(l + 1)] = Tensor{};
    }
    const Tensor g = units.acquire_grads(unit);
    auto Wt = [&](size_t i) { return u.view(w, slot(cfg_, i)); };
    auto G = [&](size_t i) { return grad_or_scratch(dev_, u, g, slot(cfg_, i), dtype_); };
    auto L = [&](size_t wi) { return linear(unit, w, g, slot(cfg_, wi), wi == kWqkv ? qkv_bias(cfg_) : kNoBias); };
    BlockActs& a = acts_.blocks[static_cast<size_t>(l)];
    const Tensor& x = acts_.residual[static_cast<size_t>(l)];

    // MLP branch: out = res2 + w_down(swiglu(w_gate_up(norm(res2)))).
    dev_.copy(dres2, dx);
    linear_backward(dev_, L(kWDown), dh, dx, a.h);
    dev_.fill(dgu, 0.0);
    dev_.swiglu_backward(dgu, a.gate_up, dh);
    linear_backward(dev_, L(kWGateUp), dnorm, dgu, a.xn2);
    dev_.rmsnorm_backward(dres2, G(kFfnNorm), dnorm, a.res2, Wt(kFfnNorm), a.rstd2);

    // Attention branch: res2 = x + wo(attention(rope(wqkv(norm(x))))).
    dev_.copy(dxin, dres2);
    linear_backward(dev_, L(kWo), datty, dres2, a.atty);
    dev_.fill(dqkv, 0.0);
    dev_.attention_backward(dqkv.reshape({B, T, W}), datty, a.qkv.reshape({B, T, W}), a.atty, a.lse, cfg_.n_head,
                            cfg_.n_kv_head, doc_start_);
    dev_.fill(dpre, 0.0);
    dev_.rope_backward(dpre, dqkv, T, cfg_.n_head + cfg_.n_kv_head, cfg_.head_dim(), cfg_.rope());
    if (cfg_.qk_norm) head_norm_.backward(dpre, G(kQNorm), G(kKNorm), Wt(kQNorm), Wt(kKNorm), a.qk);
    linear_backward(dev_, L(kWqkv), dnorm, dpre, a.xn);
    dev_.rmsnorm_backward(dxin, G(kAttnNorm), dnorm, x, Wt(kAttnNorm), a.rstd1);
    dev_.copy(dx, dxin);

    units.release_grads(unit, true);
    units.release_weights(unit);
    a = BlockActs{};
  }

  const Tensor ge = units.acquire_grads(emb);
  if (units_[0].tensors[kTok].trainable) {  // a frozen embedding: nothing to compute
    const Tensor no_positions = act({T, C});  // the zero position table's gradient, dropped
    dev_.fill(no_positions, 0.0);
    dev_.embedding_backward(units_[0].grad_view(ge, kTok), no_positions, dx, acts_.tokens, T);
  }
  units.release_grads(emb, true);
  free_activations();
}

}  // namespace ferry::nn
