#include "nn/unit.h"

#include <stdexcept>

namespace ferry::nn {

namespace {
int64_t aligned(int64_t n) { return (n + kTensorAlign - 1) / kTensorAlign * kTensorAlign; }
}  // namespace

void UnitSpec::add(std::string tensor_name, Shape shape, bool decay) {
  TensorSpec t{std::move(tensor_name), std::move(shape), 0, decay};
  tensors.push_back(std::move(t));
  lay_out();
}

void UnitSpec::set_trainable(size_t index, bool trainable) {
  if (trainable && tensors.at(index).quantized()) {
    throw std::invalid_argument("UnitSpec::set_trainable: " + tensors[index].name + " is stored in NF4 (frozen)");
  }
  tensors.at(index).trainable = trainable;
  lay_out();
}

int64_t TensorSpec::stored_numel() const {
  if (nf4.empty()) return numel();
  const Nf4Piece& last = nf4.back();
  return (last.at + last.layout.bytes) / kNf4ElementBytes;
}

void UnitSpec::quantize(size_t index, const std::vector<std::pair<int64_t, int64_t>>& pieces, bool double_quant) {
  TensorSpec& t = tensors.at(index);
  if (t.trainable || t.shape.size() != 2) {
    throw std::invalid_argument("UnitSpec::quantize: " + t.name + " is not a frozen matrix");
  }
  std::vector<Nf4Piece> out;
  int64_t row = 0, at = 0;
  for (const auto& [row0, rows] : pieces) {
    if (row0 != row || rows <= 0) break;
    Nf4Piece p{row0, nf4_layout(rows, t.shape[1], double_quant), at};
    at += p.layout.bytes;  // a multiple of 16: every blob starts 16-byte aligned
    row += rows;
    out.push_back(p);
  }
  if (row != t.shape[0] || out.size() != pieces.size()) {
    throw std::invalid_argument("UnitSpec::quantize: the pieces do not cover the rows of " + t.name + " in order");
  }
  t.nf4 = std::move(out);
  lay_out();
}

UnitSpec UnitSpec::with_values() const {
  UnitSpec out = *this;
  for (TensorSpec& t : out.tensors) t.nf4.clear();
  out.lay_out();
  return out;
}

bool UnitSpec::any_quantized() const {
  for (const TensorSpec& t : tensors)
    if (t.quantized()) return true;
  return false;
}

// The trainable tensors at aligned offsets in their order, then the frozen ones: with all
// trainable, each offset is the previous end rounded up, as it always was.
void UnitSpec::lay_out() {
  int64_t end = 0;
  for (TensorSpec& t : tensors) {
    if (!t.trainable) continue;
    t.offset = aligned(end);
    end = t.offset + t.numel();
  }
  trainable_numel = end;
  for (TensorSpec& t : tensors) {
    if (t.trainable) continue;
    t.offset = aligned(end);
    end = t.offset + t.stored_numel();
  }
  numel = end;
}

Tensor UnitSpec::view(const Tensor& flat, size_t index) const {
  const TensorSpec& t = tensors.at(index);
  if (t.quantized()) return flat.view(t.offset, {t.stored_numel()});
  return flat.view(t.offset, t.shape);
}

Tensor UnitSpec::grad_view(const Tensor& grads, size_t index) const {
  const TensorSpec& t = tensors.at(index);
  if (!t.trainable || !grads.defined()) return Tensor{};
  return grads.view(t.offset, t.shape);
}

ResidentUnits::ResidentUnits(Device& device, DType dtype, const std::vector<UnitSpec>& units,
                             std::optional<DType> grad_dtype) {
  for (const UnitSpec& u : units) {
    weights.push_back(Tensor::empty(device, dtype, {u.numel}));
    // Padding between tensors is never written by the model: zero it once so that
    // whole-buffer reductions (norms, checksums) see defined values.
    device.fill(weights.back(), 0.0);
    grads.emplace_back();
    if (u.trainable_numel == 0) continue;  // nothing trained: no gradient buffer
    grads.back() = Tensor::empty(device, grad_dtype.value_or(dtype), {u.trainable_numel});
    device.fill(grads.back(), 0.0);
  }
}

void ResidentUnits::zero_grads() {
  for (Tensor& g : grads)
    if (g.defined()) g.device().fill(g, 0.0);
}

}  // namespace ferry::nn
