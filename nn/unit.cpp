#include "nn/unit.h"

namespace ferry::nn {

void UnitSpec::add(std::string tensor_name, Shape shape, bool decay) {
  TensorSpec t{std::move(tensor_name), std::move(shape), 0, decay};
  t.offset = (numel + kTensorAlign - 1) / kTensorAlign * kTensorAlign;
  numel = t.offset + t.numel();
  tensors.push_back(std::move(t));
}

Tensor UnitSpec::view(const Tensor& flat, size_t index) const {
  const TensorSpec& t = tensors.at(index);
  return flat.view(t.offset, t.shape);
}

ResidentUnits::ResidentUnits(Device& device, DType dtype, const std::vector<UnitSpec>& units,
                             std::optional<DType> grad_dtype) {
  for (const UnitSpec& u : units) {
    weights.push_back(Tensor::empty(device, dtype, {u.numel}));
    grads.push_back(Tensor::empty(device, grad_dtype.value_or(dtype), {u.numel}));
    // Padding between tensors is never written by the model: zero it once so that
    // whole-buffer reductions (norms, checksums) see defined values.
    device.fill(weights.back(), 0.0);
    device.fill(grads.back(), 0.0);
  }
}

void ResidentUnits::zero_grads() {
  for (Tensor& g : grads) g.device().fill(g, 0.0);
}

}  // namespace ferry::nn
