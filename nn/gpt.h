// GPT-2-style decoder, forward and backward written by hand, computed unit by unit.
//
// Units: 0 = embedding (wte [V,C], wpe [positions(),C]); 1..n_layer = blocks (pre-LayerNorm,
// causal multi-head self-attention, GELU MLP); n_layer+1 = final LayerNorm. The LM head is
// tied to wte, so the head reads unit 0's weights and adds to its gradient too.
// Linear weights are stored [out, in] (y = x W^T + b).
//
// Memory: activations for backward are allocated from the device during forward() and
// kept until backward() or free_activations(); parameters are never owned here (UnitAccess).
// With activation checkpointing, forward keeps only each block's input (the residual
// stream between blocks) and backward recomputes a block's forward from it just before
// that block's backward: the same kernels on the same inputs, so gradients are
// bit-identical, for one more forward of the blocks.
// Thread safety: none; one thread drives a GPT and its device.
#pragma once

#include <cstdint>
#include <vector>

#include "nn/device.h"
#include "nn/model.h"
#include "nn/unit.h"

namespace ferry::nn {

struct GPTConfig {
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  int64_t vocab_size = 256;
  int64_t block_size = 128;
  // Rows of the position table wpe; 0 = block_size. A pretrained GPT-2 brings n_positions
  // (1024) and may be fine-tuned at a shorter context.
  int64_t n_positions = 0;
  int64_t positions() const { return n_positions > 0 ? n_positions : block_size; }
};

class GPT final : public Model {
 public:
  GPT(const GPTConfig& config, Device& device, DType dtype = DType::f32);
  ~GPT() override;
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  const GPTConfig& config() const { return cfg_; }
  DType dtype() const { return dtype_; }
  const std::vector<UnitSpec>& units() const override { return units_; }

  static std::vector<UnitSpec> layout(const GPTConfig& config);
  // GPT-2 initialisation of unit `unit` into `flat`: N(0, 0.02) for matrices and embeddings,
  // N(0, 0.02/sqrt(2 n_layer)) for the projections into the residual stream, zero biases,
  // unit LayerNorm gains. Each tensor draws from its own stream of (seed, unit, tensor), so
  // the values do not depend on how units are later placed or sharded.
  void init_unit(int unit, const Tensor& flat, uint64_t seed) const override;
  std::vector<double> initial_values(int unit, size_t i, uint64_t seed) const override;

  // Forward over tokens [B*T] (i32, on the device). With targets (i32 [B*T]) returns the
  // mean cross-entropy and keeps what backward() needs; the head and the loss are fused
  // (DeviceOps::linear_cross_entropy_forward), so no logits are stored. Without targets,
  // returns 0 and only logits() is meaningful. 1 <= T <= block_size.
  double forward(UnitAccess& units, const Tensor& tokens, const Tensor& targets, int64_t B,
                 int64_t T) override;
  // Adds d(mean loss)/d(params) of the last forward into the units' gradient buffers,
  // then frees the activations.
  void backward(UnitAccess& units) override;
  // [B*T, V] after a forward without targets; undefined after one with targets.
  const Tensor& logits() const override { return acts_.logits; }
  void free_activations() override;
  void set_activation_checkpointing(bool on) override { checkpoint_ = on; }
  bool activation_checkpointing() const override { return checkpoint_; }
  std::string describe() const override;

  // Floating-point operations of one forward+backward per token at sequence length T:
  // 6 per matmul weight, plus attention's 4 (QK^T, PV) x 3 (fwd+bwd) x T x C per layer.
  double flops_per_token(int64_t T) const override { return flops_per_token(cfg_, T); }
  static double flops_per_token(const GPTConfig& config, int64_t T);

 private:
  struct BlockActs {
    Tensor ln1, ln1_mean, ln1_rstd, qkv, atty, lse, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
  };
  struct Activations {
    int64_t B = 0, T = 0;
    Tensor tokens, targets;
    std::vector<Tensor> residual;  // n_layer + 1 tensors [B*T, C]: the input of each block, then the output
    std::vector<BlockActs> blocks;
    Tensor lnf, lnf_mean, lnf_rstd, logits, losses;  // logits: only after a forward without targets
  };

  std::vector<UnitSpec>& mutable_units() override { return units_; }
  Tensor act(Shape shape) const { return Tensor::empty(dev_, dtype_, std::move(shape)); }
  Tensor stat(Shape shape) const { return Tensor::empty(dev_, stat_dtype(dtype_), std::move(shape)); }
  void block_forward(int64_t l, const Tensor& w, int64_t B, int64_t T);

  GPTConfig cfg_;
  Device& dev_;
  DType dtype_;
  std::vector<UnitSpec> units_;
  Activations acts_;
  bool checkpoint_ = false;
};

}  // namespace ferry::nn
