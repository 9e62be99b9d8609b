#include "nn/nf4_matmul.h"

#include <algorithm>

namespace ferry::nn {

namespace {

int64_t panel_extent(int64_t max_panel, int64_t other, int64_t whole) {
  return std::clamp<int64_t>(max_panel / std::max<int64_t>(other, 1), 1, std::max<int64_t>(whole, 1));
}

}  // namespace

void nf4_matmul_nt(Device& dev, const Tensor& c, int64_t c_col, const Tensor& a, const Nf4Weight& w, double beta,
                   int64_t max_panel) {
  const Nf4Layout& l = w.layout;
  if (l.rows == 0 || c.numel() == 0) return;
  const int64_t P = panel_extent(max_panel, l.cols, l.rows);
  const Tensor scratch = Tensor::empty(dev, a.dtype(), {P * l.cols});
  for (int64_t r = 0; r < l.rows; r += P) {
    const int64_t p = std::min(P, l.rows - r);
    const Tensor panel = scratch.view(0, {p, l.cols});
    dev.nf4_dequantize(panel, w.blob, l, r, 0);
    dev.gemm_cols(c, c_col + r, p, a, 0, a.dim(1), false, panel, true, 1.0, beta);
  }
}

void nf4_matmul_nn(Device& dev, const Tensor& c, const Tensor& a, int64_t a_col, const Nf4Weight& w, double beta,
                   int64_t max_panel) {
  const Nf4Layout& l = w.layout;
  if (l.cols == 0 || c.numel() == 0) return;
  if (l.rows == 0) {  // an empty inner dimension: c = beta c
    if (beta == 0.0) dev.fill(c, 0.0);
    if (beta != 0.0 && beta != 1.0) dev.scale(c, beta);
    return;
  }
  const int64_t Q = panel_extent(max_panel, l.rows, l.cols);
  const Tensor scratch = Tensor::empty(dev, a.dtype(), {l.rows * Q});
  for (int64_t k = 0; k < l.cols; k += Q) {
    const int64_t q = std::min(Q, l.cols - k);
    const Tensor panel = scratch.view(0, {l.rows, q});
    dev.nf4_dequantize(panel, w.blob, l, 0, k);
    dev.gemm_cols(c, k, q, a, a_col, l.rows, false, panel, false, 1.0, beta);
  }
}

}  // namespace ferry::nn
