// Model: what the runtime needs of a decoder computed unit by unit (nn::GPT, nn::Llama):
// its unit layout, initialisation, forward and backward through UnitAccess, FLOPs, and
// activation checkpointing. Contracts are those of nn::GPT's header.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nn/device.h"
#include "nn/linear.h"
#include "nn/lora.h"
#include "nn/unit.h"

namespace ferry::nn {

class Model {
 public:
  virtual ~Model() = default;
  virtual const std::vector<UnitSpec>& units() const = 0;
  int num_units() const { return static_cast<int>(units().size()); }
  // Freezes the tensors named (TensorSpec::trainable: read only, no gradient computed or
  // kept), which lays their units out again: call it before anything is built on units().
  // Throws std::invalid_argument for a name no tensor has.
  void freeze(const std::vector<std::string>& tensor_names);
  // LoRA (nn/lora.h): adds the adapters `options` asks for to the units and freezes the
  // rest, before anything is built on units(); init_unit then draws the adapters as PEFT
  // does and forward and backward compute them. Throws std::invalid_argument naming a
  // target that matches nothing or takes no adapter.
  void add_lora(const Arch& arch, const LlamaConfig& llama, const LoraOptions& options);
  const std::vector<LoraAdapter>& lora() const { return lora_; }
  double lora_scale() const { return lora_scale_; }
  // PEFT's lora_dropout for the next forward and its backward (nn/linear.h: LoraPair):
  // every adapter's input is dropped with probability p, adapter i of lora() masked with
  // its own key, lora_dropout_key(key, i), at global rows row0, row0 + 1, ... for the rows
  // of the batch (row b T + t of the B x T tokens is global row row0 + b T + t). The trainer
  // calls it before each micro-batch's forward with a key made of (seed, step, micro-batch)
  // and the global index of the micro-batch's first row, and leaves it unchanged until that
  // micro-batch's backward is done (backward, and a checkpointed forward recomputed there,
  // rebuild the masks from it); p = 0 for evaluation. Never called: p = 0, the layer
  // unchanged bit for bit. Throws std::invalid_argument unless 0 <= p < 1 and row0 >= 0.
  void set_lora_dropout(double p, uint64_t key, int64_t row0);
  double lora_dropout() const { return lora_dropout_; }
  // Adapter `adapter`'s mask key in a micro-batch keyed `key`: distinct adapters, distinct
  // masks (a hash of the two; nn/rng.h's Rng::derive).
  static uint64_t lora_dropout_key(uint64_t key, size_t adapter);
  int64_t num_parameters() const;  // distinct parameters, padding excluded
  // Writes unit `unit`'s initial values into `flat` ([numel], any dtype), all but its
  // quantized tensors (TensorSpec::nf4), whose bytes quantized_bytes gives.
  virtual void init_unit(int unit, const Tensor& flat, uint64_t seed) const = 0;
  // Tensor i's initial values (numel(), row-major), as init_unit draws them.
  virtual std::vector<double> initial_values(int unit, size_t i, uint64_t seed) const = 0;
  // Bytes [begin, begin + n) of quantized tensor i's blobs (kNf4ElementBytes x its stored
  // elements; TensorSpec::nf4) into dst: each piece's rows, given by `rows(row0, rows, dst)`
  // (a Hugging Face folder's values) or else the model's initial values, rounded to
  // `values` (the compute dtype: what a LoRA run's frozen base would hold, and what
  // transformers quantizes a model loaded in that dtype from), then nf4_quantize'd. Only the
  // pieces the range touches are read and quantized (a whole piece each: double
  // quantization centres on a mean over all its blocks).
  // `state(row0, &q)`, when given, may hand a piece's NF4 state as it is (a folder
  // bitsandbytes saved quantized): true, and q is used unchanged (it must have the piece's
  // values and double quantization, else std::invalid_argument); false: the values as above.
  using RowsFn = std::function<void(int64_t row0, int64_t rows, float* dst)>;
  using StateFn = std::function<bool(int64_t row0, Nf4Tensor* q)>;
  void quantized_bytes(int unit, size_t i, uint64_t seed, const RowsFn& rows, const StateFn& state, DType values,
                       int64_t begin, int64_t n, uint8_t* dst) const;
  virtual double forward(UnitAccess& units, const Tensor& tokens, const Tensor& targets, int64_t B, int64_t T) = 0;
  virtual void backward(UnitAccess& units) = 0;
  // [B*T, V] after a forward without targets (sampling, evaluation); a forward with
  // targets fuses the head and the loss and leaves it undefined (nn/linear_cross_entropy.h).
  virtual const Tensor& logits() const = 0;
  virtual void free_activations() = 0;
  virtual void set_activation_checkpointing(bool on) = 0;
  virtual bool activation_checkpointing() const = 0;
  virtual double flops_per_token(int64_t T) const = 0;
  // fp16 loss scaling: backward() differentiates loss_scale x the mean loss, so every
  // gradient comes out multiplied by it (the caller divides it out). 1 by default.
  void set_loss_scale(double scale) { loss_scale_ = scale; }
  // Packed documents for the next forward (and its backward): i32 [B*T] on the model's
  // device, each position's first position of its document (Device::attention_forward);
  // an undefined tensor: one sequence per row.
  void set_document_starts(const Tensor& doc_start) { doc_start_ = doc_start; }
  double loss_scale() const { return loss_scale_; }
  // Deferred losses, for a training step that reads the loss once (review F7: no host
  // synchronisation per micro-batch). While `acc` (f64 [1] on the model's device) is
  // defined, forward() with targets adds its mean loss to `acc` on the device and returns
  // 0 instead of reading it back, and backward divides by `counted` (the rows whose
  // target is not kIgnoreTarget, which the caller counts on the host; at least 1) instead
  // of counting on the device. An undefined `acc` restores the synchronous forward.
  void defer_loss(const Tensor& acc, int64_t counted) {
    loss_acc_ = acc;
    deferred_tokens_ = counted;
  }
  // "GPT-2 style, 4 layers, 4 heads, 128 channels, ..." for the run's header.
  virtual std::string describe() const = 0;

 protected:
  // The dtype of normalisation statistics, probabilities and losses: f32 under mixed
  // precision (as autocast keeps softmax and cross-entropy in fp32), else the compute dtype.
  static DType stat_dtype(DType compute) { return is_low_precision(compute) ? DType::f32 : compute; }
  // Throws std::invalid_argument naming `model` unless `dtype` is one a model computes in.
  static void check_dtype(const char* model, DType dtype);
  virtual std::vector<UnitSpec>& mutable_units() = 0;
  double loss_scale_ = 1.0;
  Tensor doc_start_;
  // The pieces every model's forward and init_unit share.
  // Throws std::invalid_argument naming `model` unless 1 <= T <= block_size, B >= 1 and
  // tokens (and targets, when given) hold B*T ids.
  static void check_batch(const char* model, int64_t block_size, const Tensor& tokens, const Tensor& targets,
                          int64_t B, int64_t T);
  // The mean of losses[N] over the rows whose target is not kIgnoreTarget (at least one
  // row counts, so a batch of only ignored targets gives 0), summed in double on the host in
  // row order; sets loss_tokens_, which backward divides by.
  // Under defer_loss, adds the mean to the accumulator on the device and returns 0.
  double mean_loss(Device& dev, const Tensor& losses, const Tensor& targets);
  int64_t loss_tokens_ = 1;
  Tensor loss_acc_;
  int64_t deferred_tokens_ = 1;
  // Writes `host` (f64, view.numel() values) into `view`, cast to its dtype.
  static void write_values(Device& dev, const Tensor& view, const std::vector<double>& host);
  // Tensor `index`'s gradient inside unit `u`'s `grads`; for a frozen tensor, a zeroed
  // scratch tensor of its shape on `dev` (in grads' dtype, or `dtype` where the unit has no
  // gradient buffer), written and dropped: for the ops that compute a parameter's gradient
  // together with their input's (the norms, the embedding), whose input gradient a frozen
  // parameter still needs.
  static Tensor grad_or_scratch(Device& dev, const UnitSpec& u, const Tensor& grads, size_t index, DType dtype);
  // The linear layer of weight `w_index` (bias `b_index`) of unit `unit`, with its adapters.
  Linear linear(int unit, const Tensor& weights, const Tensor& grads, size_t w_index, size_t b_index = kNoBias) const;
  // Overwrites unit `unit`'s adapter tensors in `flat` with their initial values (the
  // models' init_unit calls it last).
  void init_adapters(Device& dev, int unit, const Tensor& flat, uint64_t seed) const;

 private:
  std::vector<LoraAdapter> lora_;
  double lora_scale_ = 0.0;
  double lora_dropout_ = 0.0;
  uint64_t lora_dropout_key_ = 0;
  int64_t lora_dropout_row0_ = 0;
};

}  // namespace ferry::nn
