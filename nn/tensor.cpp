#include "nn/tensor.h"

#include <stdexcept>

#include "nn/device.h"

namespace ferry::nn {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Storage::~Storage() {
  if (ptr) device->deallocate(ptr, bytes);
}

Tensor Tensor::empty(Device& device, DType dtype, Shape shape) {
  for (int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("Tensor::empty: negative dimension in " + shape_str(shape));
  }
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  const size_t bytes = t.nbytes();
  void* p = device.allocate(bytes);
  t.storage_ = std::make_shared<Storage>(&device, p, bytes);
  return t;
}

int64_t Tensor::dim(int i) const {
  const int n = ndim();
  const int k = i < 0 ? i + n : i;
  if (k < 0 || k >= n) {
    throw std::out_of_range("Tensor::dim(" + std::to_string(i) + ") of " + describe());
  }
  return shape_[static_cast<size_t>(k)];
}

Device& Tensor::device() const {
  if (!storage_) throw std::logic_error("Tensor::device on an undefined tensor");
  return *storage_->device;
}

void* Tensor::data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->ptr) + offset_bytes_;
}

Tensor Tensor::view(int64_t elem_offset, Shape shape) const {
  const int64_t n = shape_numel(shape);
  if (elem_offset < 0 || n < 0 || elem_offset + n > numel()) {
    throw std::out_of_range("Tensor::view: " + std::to_string(n) + " elements at offset " +
                            std::to_string(elem_offset) + " leave " + describe());
  }
  Tensor t = *this;
  t.offset_bytes_ = offset_bytes_ + static_cast<size_t>(elem_offset) * dtype_size(dtype_);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  if (shape_numel(shape) != numel()) {
    throw std::invalid_argument("Tensor::reshape: " + describe() + " to " + shape_str(shape));
  }
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype_)) + shape_str(shape_);
}

}  // namespace ferry::nn
