// Tensor: a typed, shaped, contiguous (row-major) view into device memory.
//
// Ownership: a Tensor is a handle. Copies share the same Storage (reference counted); the
// bytes go back to the device when the last handle to the storage goes away. `view()`
// makes a handle on a sub-range of the same storage, which is how a unit's flat parameter
// buffer is cut into the tensors of its layers.
// Constness: like a pointer, a const Tensor& still allows writing the elements; ops take
// their outputs as const Tensor& too.
// Thread safety: handles may be copied from several threads (shared_ptr semantics); the
// elements have no synchronization of their own.
// Alignment: the storage base is aligned as the device guarantees (64 bytes on the CPU
// device); a view's data is aligned only as far as its offset makes it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/dtype.h"

namespace ferry::nn {

class Device;

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

// A block of device memory. Frees itself through its device.
struct Storage {
  Device* device = nullptr;
  void* ptr = nullptr;
  size_t bytes = 0;
  Storage(Device* d, void* p, size_t b) : device(d), ptr(p), bytes(b) {}
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();
};

class Tensor {
 public:
  Tensor() = default;

  // Allocates numel(shape) elements from `device` (throws OutOfDeviceMemory past its budget).
  // The contents are unspecified.
  static Tensor empty(Device& device, DType dtype, Shape shape);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  Device& device() const;

  void* data() const;
  template <class T>
  T* data_as() const {
    return static_cast<T*>(data());
  }

  // numel(shape) elements starting `elem_offset` elements into this tensor; shares storage.
  // Throws std::out_of_range when the view would leave this tensor.
  Tensor view(int64_t elem_offset, Shape shape) const;
  // Same elements, another shape with the same numel.
  Tensor reshape(Shape shape) const;

  std::string describe() const;  // e.g. "f32[4, 8]"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
  Shape shape_;
  DType dtype_ = DType::f32;
};

}  // namespace ferry::nn
