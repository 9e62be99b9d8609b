#include "nn/linear.h"

#include <stdexcept>
#include <string>

namespace ferry::nn {

Linear unit_linear(const UnitSpec& u, const Tensor& weights, const Tensor& grads, size_t w_index, size_t b_index) {
  Linear l;
  l.w = u.view(weights, w_index);
  l.dw = u.grad_view(grads, w_index);
  if (u.tensors.at(w_index).quantized() && dtype_size(weights.dtype()) != kNf4ElementBytes) {
    throw std::invalid_argument("unit_linear: " + u.tensors[w_index].name + " is stored in NF4, which a " +
                                std::string(dtype_name(weights.dtype())) + " unit buffer cannot hold (bf16 or f16)");
  }
  for (const Nf4Piece& p : u.tensors.at(w_index).nf4) {
    l.nf4.push_back({l.w.view(p.at / kNf4ElementBytes, {p.layout.bytes / kNf4ElementBytes}), p.layout, p.row0});
  }
  if (b_index != kNoBias) {
    l.b = u.view(weights, b_index);
    l.db = u.grad_view(grads, b_index);
  }
  return l;
}

namespace {

// x' = the adapter's dropout of x, into a temporary; x itself without dropout.
Tensor dropped_input(Device& dev, const LoraPair& p, const Tensor& x) {
  if (p.dropout == 0.0) return x;
  const Tensor xd = Tensor::empty(dev, x.dtype(), x.shape());
  dev.dropout_rows(xd, x, p.dropout, p.dropout_key, p.dropout_row0);
  return xd;
}

Tensor adapter_input(Device& dev, const LoraPair& p, const Tensor& xd) {  // u = x' a^T, [N, r]
  const Tensor u = Tensor::empty(dev, xd.dtype(), {xd.dim(0), p.a.dim(0)});
  dev.gemm(u, xd, false, p.a, true, 1.0, 0.0);
  return u;
}

}  // namespace

void linear_forward(Device& dev, const Linear& l, const Tensor& y, const Tensor& x, const Tensor& pre) {
  if (!l.nf4.empty()) {
    const Tensor& sum = pre.defined() ? pre : y;
    nf4_matmul_nt(dev, sum, 0, x, l.nf4, 0.0);
    if (l.b.defined()) dev.add_bias(sum, l.b);
    for (const LoraPair& p : l.lora) {
      const Tensor u = adapter_input(dev, p, dropped_input(dev, p, x));
      dev.gemm_cols(sum, p.row0, p.rows, u, 0, u.dim(1), false, p.b, true, p.scale, 1.0);
    }
    if (pre.defined()) dev.gelu_forward(y, pre);
    return;
  }
  if (!l.lora.empty()) {
    // The base product first (no GELU: the adapters add before it), then each adapter into
    // its columns of the output.
    const Tensor& sum = pre.defined() ? pre : y;
    linear_forward(dev, Linear{l.w, l.b, Tensor{}, Tensor{}, {}, {}}, sum, x);
    for (const LoraPair& p : l.lora) {
      const Tensor u = adapter_input(dev, p, dropped_input(dev, p, x));
      dev.gemm_cols(sum, p.row0, p.rows, u, 0, u.dim(1), false, p.b, true, p.scale, 1.0);
    }
    if (pre.defined()) dev.gelu_forward(y, pre);
    return;
  }
  // A plain product stays the device's gemm (cuBLAS's GEMM on the cuda device, as the
  // models called it before this seam); a bias or a GELU makes it the fused op.
  if (!l.b.defined() && !pre.defined()) {
    dev.gemm(y, x, false, l.w, true, 1.0, 0.0);
    return;
  }
  dev.linear_forward(y, x, l.w, l.b, pre);
}

void linear_backward(Device& dev, const Linear& l, const Tensor& dx, const Tensor& dy, const Tensor& x) {
  if (dx.defined() && !l.nf4.empty()) {
    nf4_matmul_nn(dev, dx, dy, 0, l.nf4, 0.0);
  } else if (dx.defined()) {
    dev.gemm(dx, dy, false, l.w, false, 1.0, 0.0);
  }
  if (l.dw.defined()) dev.gemm(l.dw, dy, true, x, false, 1.0, 1.0);
  if (l.db.defined()) dev.bias_backward(l.db, dy);
  for (const LoraPair& p : l.lora) {
    Tensor du;
    {  // x' and u freed before dx's temporary is made: one [N, in] temporary at a time
      const Tensor xd = dropped_input(dev, p, x);
      const Tensor u = adapter_input(dev, p, xd);
      const int64_t r = u.dim(1);
      if (p.db.defined()) dev.gemm_cols(p.db, 0, r, dy, p.row0, p.rows, true, u, false, p.scale, 1.0);
      if (!p.da.defined() && !dx.defined()) continue;
      du = Tensor::empty(dev, dy.dtype(), {dy.dim(0), r});
      dev.gemm_cols(du, 0, r, dy, p.row0, p.rows, false, p.b, false, p.scale, 0.0);
      if (p.da.defined()) dev.gemm(p.da, du, true, xd, false, 1.0, 1.0);
    }
    if (!dx.defined()) continue;
    if (p.dropout == 0.0) {
      dev.gemm(dx, du, false, p.a, false, 1.0, 1.0);
      continue;
    }
    // dx += D (du a), D forward's diagonal map: the same mask and scale, in place on du a.
    const Tensor dxd = Tensor::empty(dev, dx.dtype(), dx.shape());
    dev.gemm(dxd, du, false, p.a, false, 1.0, 0.0);
    dev.dropout_rows(dxd, dxd, p.dropout, p.dropout_key, p.dropout_row0);
    dev.accumulate(dx, dxd);
  }
}

}  // namespace ferry::nn
