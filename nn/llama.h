// Llama-style decoder, forward and backward written by hand, computed unit by unit like
// nn::GPT: pre-RMSNorm blocks with rotary position embeddings, grouped-query causal
// attention (n_kv_head key/value heads shared by n_head query heads), a SwiGLU MLP, no
// biases, and an untied output head. The variants the registry (nn/arch.h) names set
// switches here: q/k/v biases (Qwen2), per-head RMSNorm of q and k before the rotation and
// a head size of its own (Qwen3).
//
// Units: 0 = embedding (tok_embeddings [V,C]); 1..n_layer = blocks (attention_norm [C],
// wqkv [(NH+2KVH)*hd, C] = q | k | v rows, wo [C, NH*hd], ffn_norm [C], w_gate_up [2I, C] =
// gate | up rows, w_down [C, I]; with qkv_bias, attention.bqkv.bias [(NH+2KVH)*hd] after
// wqkv; with qk_norm, attention.q_norm.weight [hd] and attention.k_norm.weight [hd] after
// those, before wo); n_layer+1 = final (norm [C], output [V,C]; without output when the head is tied
// to tok_embeddings, which then reads and accumulates into unit 0 as nn::GPT). Linear
// weights are stored [out, in] (y = x W^T). Tensor names follow Meta's checkpoints with
// the q/k/v and gate/up matrices fused.
//
// Memory, activation checkpointing, UnitAccess and threads: as nn::GPT.
#pragma once

#include <cstdint>
#include <vector>

#include "nn/device.h"
#include "nn/model.h"
#include "nn/qk_norm.h"
#include "nn/rope.h"
#include "nn/unit.h"

namespace ferry::nn {

struct LlamaConfig {
  int64_t n_layer = 2;
  int64_t n_head = 4;
  int64_t n_kv_head = 2;
  int64_t n_embd = 128;
  int64_t intermediate = 384;  // SwiGLU hidden width
  int64_t vocab_size = 256;
  int64_t block_size = 128;
  double rope_theta = 10000.0;
  // Llama 3's rope scaling (rope_type "llama3"); rope_factor 0 = none. See nn/rope.h.
  double rope_factor = 0.0, rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  int64_t rope_original_max_positions = 8192;
  double norm_eps = 1e-5;
  bool qkv_bias = false;        // biases on q, k and v (Qwen2): "attention.bqkv.bias" [qkv_width]
  bool tie_embeddings = false;  // the output head is tok_embeddings (Llama 3.2 1B/3B, small Qwen2.5)
  bool qk_norm = false;         // RMSNorm of each q and k head before RoPE (Qwen3), weights [hd] each
  int64_t head_size = 0;        // 0: n_embd / n_head; else the head size (Qwen3's head_dim)
  Rope rope() const {
    return rope_factor > 0.0 ? Rope::llama3(rope_theta, rope_factor, rope_low_freq_factor, rope_high_freq_factor,
                                            static_cast<double>(rope_original_max_positions))
                             : Rope(rope_theta);
  }
  int64_t head_dim() const { return head_size > 0 ? head_size : n_embd / n_head; }
  int64_t q_width() const { return n_head * head_dim(); }  // attention's output width, wo's input
  int64_t qkv_width() const { return (n_head + 2 * n_kv_head) * head_dim(); }
};

class Llama final : public Model {
 public:
  // Throws std::invalid_argument for dimensions that do not fit together (names them).
  Llama(const LlamaConfig& config, Device& device, DType dtype = DType::f32);
  ~Llama() override;
  Llama(const Llama&) = delete;
  Llama& operator=(const Llama&) = delete;

  const LlamaConfig& config() const { return cfg_; }
  const std::vector<UnitSpec>& units() const override { return units_; }
  static std::vector<UnitSpec> layout(const LlamaConfig& config);
  // N(0, 0.02) for matrices and the embedding, N(0, 0.02/sqrt(2 n_layer)) for wo and
  // w_down (into the residual stream), unit norm gains; per-tensor streams as nn::GPT.
  void init_unit(int unit, const Tensor& flat, uint64_t seed) const override;
  std::vector<double> initial_values(int unit, size_t i, uint64_t seed) const override;

  double forward(UnitAccess& units, const Tensor& tokens, const Tensor& targets, int64_t B, int64_t T) override;
  void backward(UnitAccess& units) override;
  // With targets, forward fuses the head and the loss (DeviceOps::linear_cross_entropy_forward)
  // and stores no logits: logits() ([B*T, V]) is meaningful after a forward without targets.
  const Tensor& logits() const override { return acts_.logits; }
  void free_activations() override;
  void set_activation_checkpointing(bool on) override { checkpoint_ = on; }
  bool activation_checkpointing() const override { return checkpoint_; }
  std::string describe() const override;

  // 6 per matmul weight per token (the embedding lookup excluded, the output head
  // included), plus attention's 12 x T x NH*hd per layer (NH*hd = C unless head_size).
  static double flops_per_token(const LlamaConfig& config, int64_t T);
  double flops_per_token(int64_t T) const override { return flops_per_token(cfg_, T); }

 private:
  struct BlockActs {
    Tensor xn, rstd1, qkv, atty, lse, res2, xn2, rstd2, gate_up, h;
    HeadNorm::Saved qk;  // with qk_norm
  };
  struct Activations {
    int64_t B = 0, T = 0;
    Tensor tokens, targets;
    std::vector<Tensor> residual;  // n_layer + 1: each block's input, then the last output
    std::vector<BlockActs> blocks;
    Tensor xf, rstdf, logits, losses;  // logits: only after a forward without targets
  };

  std::vector<UnitSpec>& mutable_units() override { return units_; }
  Tensor act(Shape shape) const { return Tensor::empty(dev_, dtype_, std::move(shape)); }
  Tensor stat(Shape shape) const { return Tensor::empty(dev_, stat_dtype(dtype_), std::move(shape)); }
  void block_forward(int64_t l, const Tensor& w, int64_t B, int64_t T);

  LlamaConfig cfg_;
  Device& dev_;
  DType dtype_;
  std::vector<UnitSpec> units_;
  Activations acts_;
  HeadNorm head_norm_;  // used with qk_norm only
  bool checkpoint_ = false;
};

}  // namespace ferry::nn
