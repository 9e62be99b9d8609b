#include "offload/staged_copy.h"

#include <algorithm>
#include <cstring>

namespace ferry::offload {

void write_staged(ShardStore& store, int region, const float* src, int64_t n, PinnedPool* pool) {
  if (pool == nullptr) {
    if (n > 0) store.write(region, 0, n, src);
    return;
  }
  PooledBuffer staging(*pool);
  const int64_t piece = staging.elements();
  for (int64_t k = 0; k < n; k += piece) {
    const int64_t len = std::min(piece, n - k);
    pool->copy(staging.get(), src + k, static_cast<size_t>(len) * 4);
    store.write(region, k, len, staging.get());
  }
}

void read_staged(ShardStore& store, int region, float* dst, int64_t n, PinnedPool& pool) {
  PooledBuffer staging(pool);
  const int64_t piece = staging.elements();
  for (int64_t k = 0; k < n; k += piece) {
    const int64_t len = std::min(piece, n - k);
    store.read(region, k, len, staging.get());
    pool.copy(dst + k, staging.get(), static_cast<size_t>(len) * 4);
  }
}

}  // namespace ferry::offload
