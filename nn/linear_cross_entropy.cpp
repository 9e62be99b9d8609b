#include "nn/linear_cross_entropy.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "nn/device.h"
#include "nn/op_checks.h"

namespace ferry::nn {

namespace {
std::atomic<size_t> scratch_override{0};
}  // namespace

size_t linear_cross_entropy_scratch_bytes() {
  const size_t set = scratch_override.load(std::memory_order_relaxed);
  return set != 0 ? set : kLinearXentScratchBytes;
}

void set_linear_cross_entropy_scratch_bytes(size_t bytes) { scratch_override.store(bytes, std::memory_order_relaxed); }

int64_t linear_cross_entropy_chunk_rows(int64_t N, int64_t V, size_t bytes_per_score) {
  const size_t row_bytes = static_cast<size_t>(std::max<int64_t>(V, 1)) * std::max<size_t>(bytes_per_score, 1);
  int64_t rows = static_cast<int64_t>(linear_cross_entropy_scratch_bytes() / row_bytes);
  if (rows >= 8) rows -= rows % 8;
  return std::clamp<int64_t>(rows, 1, std::max<int64_t>(N, 1));
}

LinearXentDims check_linear_cross_entropy(const char* device, const char* op, const Tensor& x, const Tensor& w,
                                          const Tensor& targets, const Tensor& losses, const Tensor& dx,
                                          const Tensor& dw) {
  auto fail = [&](const std::string& what) { checks::fail(device, op, what); };
  if (x.ndim() != 2 || w.ndim() != 2 || x.dim(1) != w.dim(1) || x.dtype() != w.dtype()) {
    fail("x " + x.describe() + " against w " + w.describe() + ": want x[N,C] and w[V,C] of one dtype");
  }
  const LinearXentDims d{x.dim(0), x.dim(1), w.dim(0)};
  if (targets.dtype() != DType::i32 || targets.numel() != d.N) {
    fail("targets " + targets.describe() + " for x " + x.describe());
  }
  if (losses.defined() && losses.numel() != d.N) fail("losses " + losses.describe() + " for x " + x.describe());
  if (dx.defined() && dx.shape() != x.shape()) fail("dx " + dx.describe() + " for x " + x.describe());
  if (dw.defined() && dw.shape() != w.shape()) fail("dw " + dw.describe() + " for w " + w.describe());
  return d;
}

namespace {

// One call's scratch: the largest chunk's scores and probabilities, and its losses when
// the caller has none to write (backward), from x's device; the last, shorter chunk uses
// their first rows.
struct XentScratch {
  int64_t rows = 0;  // per full chunk
  Tensor scores, probs, losses;
  XentScratch(const Tensor& x, const LinearXentDims& d, DType stat, bool need_losses) {
    rows = linear_cross_entropy_chunk_rows(d.N, d.V, dtype_size(x.dtype()) + dtype_size(stat));
    Device& dev = x.device();
    scores = Tensor::empty(dev, x.dtype(), {rows, d.V});
    probs = Tensor::empty(dev, stat, {rows, d.V});
    if (need_losses) losses = Tensor::empty(dev, stat, {rows});
  }
};

// Rows [first, first + n) of a matrix, and elements of a per-row vector (whatever its shape).
Tensor row_block(const Tensor& t, int64_t first, int64_t n) { return t.view(first * t.dim(-1), {n, t.dim(-1)}); }
Tensor elem_block(const Tensor& t, int64_t first, int64_t n) { return t.view(first, {n}); }

}  // namespace

void DeviceOps::linear_cross_entropy_forward(const Tensor& losses, const Tensor& x, const Tensor& w,
                                             const Tensor& targets) {
  const std::string dev = x.device().name();
  const LinearXentDims d = check_linear_cross_entropy(dev.c_str(), "linear_cross_entropy_forward", x, w, targets,
                                                      losses);
  if (d.N == 0) return;
  XentScratch c(x, d, losses.dtype(), false);
  for (int64_t r0 = 0; r0 < d.N; r0 += c.rows) {
    const int64_t n = std::min(c.rows, d.N - r0);
    const Tensor scores = row_block(c.scores, 0, n), probs = row_block(c.probs, 0, n);
    gemm(scores, row_block(x, r0, n), false, w, true, 1.0, 0.0);
    softmax_cross_entropy_forward(elem_block(losses, r0, n), probs, scores, elem_block(targets, r0, n));
  }
}

void DeviceOps::linear_cross_entropy_backward(const Tensor& dx, const Tensor& dw, const Tensor& x, const Tensor& w,
                                              const Tensor& targets, double dloss) {
  const std::string dev = x.device().name();
  const LinearXentDims d = check_linear_cross_entropy(dev.c_str(), "linear_cross_entropy_backward", x, w, targets,
                                                      Tensor{}, dx, dw);
  if (d.N == 0) return;
  // The probabilities in the dtype the forward's losses had: f32 beside low-precision x, as
  // the models' statistics, else x's own.
  const DType stat = is_low_precision(x.dtype()) ? DType::f32 : x.dtype();
  XentScratch c(x, d, stat, true);
  for (int64_t r0 = 0; r0 < d.N; r0 += c.rows) {
    const int64_t n = std::min(c.rows, d.N - r0);
    const Tensor scores = row_block(c.scores, 0, n), probs = row_block(c.probs, 0, n);
    const Tensor xc = row_block(x, r0, n), tc = elem_block(targets, r0, n);
    gemm(scores, xc, false, w, true, 1.0, 0.0);
    softmax_cross_entropy_forward(elem_block(c.losses, 0, n), probs, scores, tc);
    const Tensor& dscores = scores;  // the scores are spent: their buffer takes the gradient
    fill(dscores, 0.0);
    softmax_cross_entropy_backward(dscores, probs, tc, dloss);
    gemm(row_block(dx, r0, n), dscores, false, w, false, 1.0, 1.0);
    if (dw.defined()) gemm(dw, dscores, true, xc, false, 1.0, 1.0);  // undefined: a frozen head
  }
}

void linear_cross_entropy_forward_in_place(DeviceOps& ops, const char* device, const Tensor& losses, const Tensor& x,
                                           const Tensor& w, const Tensor& targets, const LinearXentForwardRows& rows) {
  const LinearXentDims d = check_linear_cross_entropy(device, "linear_cross_entropy_forward", x, w, targets, losses);
  if (d.N == 0) return;
  const int64_t per = linear_cross_entropy_chunk_rows(d.N, d.V, dtype_size(x.dtype()));
  const Tensor scratch = Tensor::empty(x.device(), x.dtype(), {per, d.V});
  for (int64_t r0 = 0; r0 < d.N; r0 += per) {
    const int64_t n = std::min(per, d.N - r0);
    const Tensor scores = row_block(scratch, 0, n);
    ops.gemm(scores, row_block(x, r0, n), false, w, true, 1.0, 0.0);
    rows(elem_block(losses, r0, n), scores, elem_block(targets, r0, n));
  }
}

void linear_cross_entropy_backward_in_place(DeviceOps& ops, const char* device, const Tensor& dx, const Tensor& dw,
                                            const Tensor& x, const Tensor& w, const Tensor& targets,
                                            const LinearXentBackwardRows& rows) {
  const LinearXentDims d =
      check_linear_cross_entropy(device, "linear_cross_entropy_backward", x, w, targets, Tensor{}, dx, dw);
  if (d.N == 0) return;
  const int64_t per = linear_cross_entropy_chunk_rows(d.N, d.V, dtype_size(x.dtype()));
  const Tensor scratch = Tensor::empty(x.device(), x.dtype(), {per, d.V});
  for (int64_t r0 = 0; r0 < d.N; r0 += per) {
    const int64_t n = std::min(per, d.N - r0);
    const Tensor scores = row_block(scratch, 0, n), xc = row_block(x, r0, n);
    ops.gemm(scores, xc, false, w, true, 1.0, 0.0);
    rows(scores, elem_block(targets, r0, n));
    ops.gemm(row_block(dx, r0, n), scores, false, w, false, 1.0, 1.0);
    if (dw.defined()) ops.gemm(dw, scores, true, xc, false, 1.0, 1.0);  // undefined: a frozen head
  }
}

}  // namespace ferry::nn
