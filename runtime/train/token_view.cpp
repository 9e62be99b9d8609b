#include "runtime/train/token_view.h"

#include <algorithm>
#include <stdexcept>

namespace ferry::runtime {

void TokenView::append(const uint32_t* p, size_t n, std::shared_ptr<const void> keep) {
  if (n > 0) parts_.push_back({p, true, size_, n, std::move(keep)});
  size_ += n;
}

void TokenView::append(const uint16_t* p, size_t n, std::shared_ptr<const void> keep) {
  if (n > 0) parts_.push_back({p, false, size_, n, std::move(keep)});
  size_ += n;
}

const TokenView::Part& TokenView::part_of(size_t i) const {
  if (i >= size_) throw std::out_of_range("TokenView: index " + std::to_string(i) + " of " + std::to_string(size_));
  const auto it = std::upper_bound(parts_.begin(), parts_.end(), i, [](size_t v, const Part& p) { return v < p.begin; });
  return *(it - 1);
}

uint32_t TokenView::operator[](size_t i) const {
  const Part& p = part_of(i);
  const size_t k = i - p.begin;
  return p.wide ? static_cast<const uint32_t*>(p.p)[k] : static_cast<const uint16_t*>(p.p)[k];
}

void TokenView::copy(size_t off, size_t n, uint32_t* out) const {
  while (n > 0) {
    const Part& p = part_of(off);
    const size_t k = off - p.begin, take = std::min(n, p.n - k);
    if (p.wide) {
      std::copy_n(static_cast<const uint32_t*>(p.p) + k, take, out);
    } else {
      const auto* s = static_cast<const uint16_t*>(p.p) + k;
      for (size_t j = 0; j < take; ++j) out[j] = s[j];
    }
    off += take;
    out += take;
    n -= take;
  }
}

TokenView TokenView::sub(size_t off, size_t n) const {
  TokenView v;
  while (n > 0) {
    const Part& p = part_of(off);
    const size_t k = off - p.begin, take = std::min(n, p.n - k);
    if (p.wide) {
      v.append(static_cast<const uint32_t*>(p.p) + k, take, p.keep);
    } else {
      v.append(static_cast<const uint16_t*>(p.p) + k, take, p.keep);
    }
    off += take;
    n -= take;
  }
  return v;
}

}  // namespace ferry::runtime
