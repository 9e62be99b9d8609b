// A read-only view of a token stream: one or more stretches of uint16 or uint32 ids
// (owned vectors or memory-mapped files) seen as one sequence. Reading a window copies
// only that window; nothing reads the whole stream. Threads: immutable, shareable.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace ferry::runtime {

class TokenView {
 public:
  TokenView() = default;
  // Appends n ids at p (uint16 or uint32); `keep` owns the memory (a vector, a mapping).
  void append(const uint32_t* p, size_t n, std::shared_ptr<const void> keep);
  void append(const uint16_t* p, size_t n, std::shared_ptr<const void> keep);

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  uint32_t operator[](size_t i) const;
  // Copies ids [off, off + n) into out.
  void copy(size_t off, size_t n, uint32_t* out) const;
  TokenView sub(size_t off, size_t n) const;  // ids [off, off + n)

  class iterator {
   public:
    iterator(const TokenView* v, size_t i) : v_(v), i_(i) {}
    uint32_t operator*() const { return (*v_)[i_]; }
    iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator!=(const iterator& o) const { return i_ != o.i_; }

   private:
    const TokenView* v_;
    size_t i_;
  };
  iterator begin() const { return {this, 0}; }
  iterator end() const { return {this, size_}; }

 private:
  struct Part {
    const void* p = nullptr;
    bool wide = true;  // uint32
    size_t begin = 0, n = 0;  // its first index in the view, its length
    std::shared_ptr<const void> keep;
  };
  const Part& part_of(size_t i) const;
  std::vector<Part> parts_;
  size_t size_ = 0;
};

}  // namespace ferry::runtime
