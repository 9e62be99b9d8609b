#include "nn/nf4_matmul.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ferry::nn {

namespace {

int64_t panel_extent(int64_t max_panel, int64_t other, int64_t whole) {
  return std::clamp<int64_t>(max_panel / std::max<int64_t>(other, 1), 1, std::max<int64_t>(whole, 1));
}

struct Shape2 {
  int64_t rows = 0, cols = 0;
};

// The whole weight's [R, in], checking that the pieces tile its rows in order.
Shape2 weight_of(const std::vector<Nf4Weight>& pieces) {
  Shape2 s;
  for (const Nf4Weight& w : pieces) {
    if (w.row0 != s.rows || (s.rows > 0 && w.layout.cols != s.cols)) {
      throw std::invalid_argument("nf4_matmul: the pieces must cover the weight's rows in order with one row length "
                                  "(a piece at row " + std::to_string(w.row0) + " after " + std::to_string(s.rows) + ")");
    }
    s.cols = w.layout.cols;
    s.rows += w.layout.rows;
  }
  return s;
}

// panel = rows [r, r + panel rows) x columns [k, k + panel cols) of the weight, from each
// piece the rectangle's rows fall in.
void fill_panel(Device& dev, const Tensor& panel, const std::vector<Nf4Weight>& pieces, int64_t r, int64_t k) {
  const int64_t end = r + panel.dim(0), q = panel.dim(1);
  for (const Nf4Weight& w : pieces) {
    const int64_t lo = std::max(r, w.row0), hi = std::min(end, w.row0 + w.layout.rows);
    if (lo >= hi) continue;
    dev.nf4_dequantize(panel.view((lo - r) * q, {hi - lo, q}), w.blob, w.layout, lo - w.row0, k);
  }
}

}  // namespace

void nf4_matmul_nt(Device& dev, const Tensor& c, int64_t c_col, const Tensor& a, const std::vector<Nf4Weight>& pieces,
                   double beta, int64_t max_panel) {
  const Shape2 W = weight_of(pieces);
  if (W.rows == 0 || c.numel() == 0) return;
  if (dev.nf4_gemm(c, c_col, a, 0, pieces, true, beta)) return;
  const int64_t P = panel_extent(max_panel, W.cols, W.rows);
  const Tensor scratch = Tensor::empty(dev, a.dtype(), {P * W.cols});
  for (int64_t r = 0; r < W.rows; r += P) {
    const int64_t p = std::min(P, W.rows - r);
    const Tensor panel = scratch.view(0, {p, W.cols});
    fill_panel(dev, panel, pieces, r, 0);
    dev.gemm_cols(c, c_col + r, p, a, 0, a.dim(1), false, panel, true, 1.0, beta);
  }
}

void nf4_matmul_nn(Device& dev, const Tensor& c, const Tensor& a, int64_t a_col, const std::vector<Nf4Weight>& pieces,
                   double beta, int64_t max_panel) {
  const Shape2 W = weight_of(pieces);
  if (W.cols == 0 || c.numel() == 0) return;
  if (W.rows == 0) {  // an empty inner dimension: c = beta c
    if (beta == 0.0) dev.fill(c, 0.0);
    if (beta != 0.0 && beta != 1.0) dev.scale(c, beta);
    return;
  }
  if (dev.nf4_gemm(c, 0, a, a_col, pieces, false, beta)) return;
  const int64_t Q = panel_extent(max_panel, W.rows, W.cols);
  const Tensor scratch = Tensor::empty(dev, a.dtype(), {W.rows * Q});
  for (int64_t k = 0; k < W.cols; k += Q) {
    const int64_t q = std::min(Q, W.cols - k);
    const Tensor panel = scratch.view(0, {W.rows, q});
    fill_panel(dev, panel, pieces, 0, k);
    dev.gemm_cols(c, k, q, a, a_col, W.rows, false, panel, false, 1.0, beta);
  }
}

}  // namespace ferry::nn
