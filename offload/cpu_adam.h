// CPU AdamW over fp32 shards, with decoupled weight decay and bias correction, computed
// exactly as torch.optim.AdamW does:
//   g = grad * grad_scale
//   m = b1 m + (1-b1) g;   v = b2 v + (1-b2) g^2
//   p = p (1 - lr wd) - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// grad_scale folds gradient averaging and clipping into the update, so the gradient buffer
// is read once and never rewritten. With `low_out`, the updated weights are also written
// as bf16 or f16 (round to nearest even) in the same pass: the compute copy for the next forward.
// Tiling: the range is processed in kTile-element tiles; a caller overlapping I/O calls
// update() on one tile range while the next tile's reads are in flight.
//
// SIMD: one pass per element with Eigen's packet primitives (the widest vector the build
// targets: AVX-512 with -march=native here).
// Threads: update() splits the range into fixed tiles spread over OpenMP threads; each
// element is computed by the same expression whatever the thread count, so results are
// bit-identical across thread counts. Call it from one thread at a time.
// Memory: p, m, v are updated in place; g is only read. No alignment is required (64-byte
// alignment is faster). Arrays must not overlap.
#pragma once

#include <cstdint>

#include "nn/dtype.h"

namespace ferry::offload {

struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

class CpuAdam {
 public:
  explicit CpuAdam(const AdamWParams& params) : params_(params) {}
  const AdamWParams& params() const { return params_; }

  // One AdamW step (step >= 1, the count including this one) over n elements.
  // `lr` is this step's learning rate (the scheduler's), `weight_decay` this range's decay
  // (0 for biases and norms).
  // `low_out` (optional): the updated weights rounded to `low` (bf16 or f16) in the same
  // pass, while each tile is in cache (16-bit parameter shards: their fused copy-out).
  void update(float* p, const float* g, float* m, float* v, int64_t n, int64_t step, double lr,
              double weight_decay, double grad_scale, uint16_t* low_out = nullptr,
              nn::DType low = nn::DType::bf16) const;

  static constexpr int64_t kTile = 1 << 14;  // elements: 4 arrays x 64 KiB stay in L2

 private:
  AdamWParams params_;
};

}  // namespace ferry::offload
