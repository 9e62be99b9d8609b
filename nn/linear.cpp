#include "nn/linear.h"

namespace ferry::nn {

Linear unit_linear(const UnitSpec& u, const Tensor& weights, const Tensor& grads, size_t w_index, size_t b_index) {
  Linear l;
  l.w = u.view(weights, w_index);
  l.dw = u.grad_view(grads, w_index);
  if (b_index != kNoBias) {
    l.b = u.view(weights, b_index);
    l.db = u.grad_view(grads, b_index);
  }
  return l;
}

void linear_forward(Device& dev, const Linear& l, const Tensor& y, const Tensor& x, const Tensor& pre) {
  // A plain product stays the device's gemm (cuBLAS's GEMM on the cuda device, as the
  // models called it before this seam); a bias or a GELU makes it the fused op.
  if (!l.b.defined() && !pre.defined()) {
    dev.gemm(y, x, false, l.w, true, 1.0, 0.0);
    return;
  }
  dev.linear_forward(y, x, l.w, l.b, pre);
}

void linear_backward(Device& dev, const Linear& l, const Tensor& dx, const Tensor& dy, const Tensor& x) {
  if (dx.defined()) dev.gemm(dx, dy, false, l.w, false, 1.0, 0.0);
  if (l.dw.defined()) dev.gemm(l.dw, dy, true, x, false, 1.0, 1.0);
  if (l.db.defined()) dev.bias_backward(l.db, dy);
}

}  // namespace ferry::nn
