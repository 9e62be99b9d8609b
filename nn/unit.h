// Units: the granularity at which parameters are stored, moved and sharded.
//
// A model's parameters are grouped into units (GPT: the embedding, each block, the final
// norm). A unit's tensors are packed into one flat buffer at the offsets its UnitSpec
// gives (each aligned to kTensorAlign elements). The model never owns parameter memory:
// it asks a UnitAccess for a unit's full weights (and gradient buffer) right before it
// computes with them and hands them back right after, which is where a sharded runtime
// gathers and frees them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/device.h"
#include "nn/nf4_blob.h"
#include "nn/tensor.h"

namespace ferry::nn {

constexpr int64_t kTensorAlign = 16;  // elements: 64 bytes for f32

// One NF4 piece of a frozen weight (QLoRA, nn/nf4_blob.h): rows [row0, row0 + layout.rows)
// of the weight, quantized on their own (one Hugging Face module of a packed projection, as
// bitsandbytes quantizes each nn.Linear), its blob at byte `at` of the tensor's bytes.
struct Nf4Piece {
  int64_t row0 = 0;
  Nf4Layout layout;
  int64_t at = 0;
};
// A unit holding NF4 tensors keeps its frozen span in a 16-bit dtype (bf16 or f16, the
// compute dtype) on every tier, so a blob of b bytes takes b / 2 elements of the flat
// buffer and every copy, gather and read moves it as plain bytes.
constexpr int64_t kNf4ElementBytes = 2;

struct TensorSpec {
  std::string name;  // GPT-2 naming, e.g. "h.0.attn.c_attn.weight"
  Shape shape;
  int64_t offset = 0;  // elements from the start of the unit's flat buffer
  bool decay = false;  // weight decay applies (matrices and embeddings, not biases or norms)
  // Trained (a gradient, reduced and updated) or frozen (read only: no gradient is computed
  // for it, nor kept, reduced or updated). Every tensor of today's models is trainable;
  // adapters freeze the base (docs/design/nn.md, "Trainable and frozen tensors").
  bool trainable = true;
  // Quantized to NF4 (frozen weights only, UnitSpec::quantize): the pieces that cover its
  // rows in order; empty: kept as values.
  std::vector<Nf4Piece> nf4{};
  bool quantized() const { return !nf4.empty(); }
  int64_t numel() const { return shape_numel(shape); }  // the parameter's values
  // Its elements in the unit's flat buffer: numel(), or its blobs' bytes / kNf4ElementBytes.
  int64_t stored_numel() const;
};

// A unit's layout. Its flat buffer holds the trainable tensors first, in the order they
// were added, then the frozen ones: the trainable ones are its first `trainable_numel`
// elements, which is all a gradient buffer of the unit holds (same offsets). Tensor
// indices are the order of add() whatever the layout; a unit whose tensors are all
// trainable is laid out exactly as they were added.
struct UnitSpec {
  std::string name;  // "embedding", "block.3", "final"
  std::vector<TensorSpec> tensors;
  int64_t numel = 0;            // flat length including alignment padding
  int64_t trainable_numel = 0;  // the trainable tensors' span at the start (numel when all are)
  // Adds a tensor, trainable, at the next aligned offset of its region.
  void add(std::string tensor_name, Shape shape, bool decay);
  // Marks tensor `index` trainable or frozen, which lays the unit out again (offsets move).
  void set_trainable(size_t index, bool trainable);
  bool all_trainable() const { return trainable_numel == numel; }
  // Stores frozen 2-D tensor `index` in NF4, each [row0, row0 + rows) of `pieces` (which
  // cover its rows in order) quantized on its own, which lays the unit out again.
  // std::invalid_argument for a trainable tensor or pieces that do not cover the rows.
  void quantize(size_t index, const std::vector<std::pair<int64_t, int64_t>>& pieces, bool double_quant);
  bool any_quantized() const;
  // The same unit with every tensor kept as values (NF4 tensors at their shapes' extents):
  // the trainable span is unchanged; what an export reads a folder's values into.
  UnitSpec with_values() const;
  // Tensor `index` inside `flat`; a quantized tensor is its raw blobs, 1-D [stored_numel()]
  // (Nf4Piece::at / kNf4ElementBytes is a piece's first element).
  Tensor view(const Tensor& flat, size_t index) const;
  // Tensor `index` inside the unit's gradient buffer `grads` ([trainable_numel]); undefined
  // for a frozen tensor or an undefined `grads` (no gradient to write).
  Tensor grad_view(const Tensor& grads, size_t index) const;

 private:
  void lay_out();
};

// What the model calls to reach parameters. Calls come from the thread running the model.
// acquire_weights returns a flat [unit.numel] tensor, acquire_grads a flat
// [unit.trainable_numel] one (undefined when the unit has no trainable tensor), each valid
// until the matching release_*.
// Gradient buffers are accumulated into (+=); release_grads(u, complete=true) tells that
// this micro-batch has added everything it will to unit u (a unit whose weights are used
// twice, like a tied embedding, is released with complete=false the first time).
class UnitAccess {
 public:
  virtual ~UnitAccess() = default;
  virtual Tensor acquire_weights(int unit) = 0;
  virtual void release_weights(int unit) = 0;
  virtual Tensor acquire_grads(int unit) = 0;
  virtual void release_grads(int unit, bool complete) = 0;
};

// Every unit's weights and gradients resident on one device: the unsharded case.
class ResidentUnits final : public UnitAccess {
 public:
  // Weights in `dtype`, gradients in `grad_dtype` (the trainer's are f32 whatever the
  // weights': runtime/zero reduces and updates them in f32); grad_dtype nullopt = dtype.
  // Gradient buffers hold each unit's trainable span only (UnitSpec::trainable_numel).
  ResidentUnits(Device& device, DType dtype, const std::vector<UnitSpec>& units,
                std::optional<DType> grad_dtype = std::nullopt);
  Tensor acquire_weights(int unit) override { return weights.at(static_cast<size_t>(unit)); }
  void release_weights(int) override {}
  Tensor acquire_grads(int unit) override { return grads.at(static_cast<size_t>(unit)); }
  void release_grads(int, bool) override {}
  void zero_grads();

  std::vector<Tensor> weights, grads;
};

}  // namespace ferry::nn
