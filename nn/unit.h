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
#include "nn/tensor.h"

namespace ferry::nn {

constexpr int64_t kTensorAlign = 16;  // elements: 64 bytes for f32

struct TensorSpec {
  std::string name;  // GPT-2 naming, e.g. "h.0.attn.c_attn.weight"
  Shape shape;
  int64_t offset = 0;  // elements from the start of the unit's flat buffer
  bool decay = false;  // weight decay applies (matrices and embeddings, not biases or norms)
  int64_t numel() const { return shape_numel(shape); }
};

struct UnitSpec {
  std::string name;  // "embedding", "block.3", "final"
  std::vector<TensorSpec> tensors;
  int64_t numel = 0;  // flat length including alignment padding
  // Appends a tensor at the next aligned offset.
  void add(std::string tensor_name, Shape shape, bool decay);
  Tensor view(const Tensor& flat, size_t index) const;  // tensor `index` inside `flat`
};

// What the model calls to reach parameters. Calls come from the thread running the model.
// acquire_* return flat [unit.numel] tensors valid until the matching release_*.
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
