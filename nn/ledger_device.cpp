// LedgerDevice: each op checked by ShapeOnlyOps, then its cuda cost recorded (nn/ledger_device.h).
#include "nn/ledger_device.h"

#include <utility>

#include "nn/cuda_device.h"
#include "nn/linear_cross_entropy.h"
#include "nn/op_checks.h"

namespace ferry::nn {

LedgerDevice::LedgerDevice(std::string label, size_t capacity_bytes)
    : CountingDevice(std::move(label), capacity_bytes, false, DeviceKind::cuda) {}

namespace {
OpCost host_copy(const char* op, const Tensor& t) {
  OpCost c;
  c.op = op;
  c.launches = 1;
  c.bytes = c.min_bytes = static_cast<double>(t.nbytes());  // the device's side of a PCIe copy
  return c;
}
}  // namespace

void LedgerDevice::check_errors() {
  if (!std::exchange(flags_pending_, false)) return;
  OpCost c;
  c.op = "error_flags";
  c.launches = 1;
  c.bytes = c.min_bytes = 24.0;
  ledger_.add(c);
}

void LedgerDevice::copy_from_host(const Tensor& dst, const void* src) {
  CountingDevice::copy_from_host(dst, src);
  ledger_.add(host_copy("copy_from_host", dst));
}

void LedgerDevice::copy_to_host(void* dst, const Tensor& src) {
  CountingDevice::copy_to_host(dst, src);
  ledger_.add(host_copy("copy_to_host", src));
  check_errors();
}

void LedgerDevice::synchronize() {
  check_errors();
}

void LedgerDevice::copy(const Tensor& dst, const Tensor& src) {
  CountingDevice::copy(dst, src);
  OpCost c = op_cost::cast(dst, src);
  c.op = "copy";
  ledger_.add(c);
}

void LedgerDevice::cast(const Tensor& dst, const Tensor& src) {
  ShapeOnlyOps::cast(dst, src);
  ledger_.add(op_cost::cast(dst, src));
}

void LedgerDevice::fill(const Tensor& dst, double value) {
  ShapeOnlyOps::fill(dst, value);
  ledger_.add(op_cost::fill(dst));
}

void LedgerDevice::gemm(const Tensor& c, const Tensor& a, bool ta, const Tensor& b, bool tb, double alpha,
                        double beta) {
  ShapeOnlyOps::gemm(c, a, ta, b, tb, alpha, beta);
  ledger_.add(op_cost::gemm(c, a, ta, b, tb, beta));
}

void LedgerDevice::gemm_cols(const Tensor& c, int64_t c_col, int64_t c_cols, const Tensor& a, int64_t a_col,
                             int64_t a_cols, bool ta, const Tensor& b, bool tb, double alpha, double beta) {
  ShapeOnlyOps::gemm_cols(c, c_col, c_cols, a, a_col, a_cols, ta, b, tb, alpha, beta);
  const checks::GemmDims d = checks::gemm_cols("ledger", c, c_col, c_cols, a, a_col, a_cols, ta, b, tb);
  ledger_.add(op_cost::gemm_cols(c, d.M, d.N, d.K, a, b, beta));
}

void LedgerDevice::linear_forward(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                                  const Tensor& pre) {
  if (!linear_forward_fuses(out, x, w, bias, pre)) {
    DeviceOps::linear_forward(out, x, w, bias, pre);  // records the ops the cuda device runs instead
    return;
  }
  ShapeOnlyOps::gemm(out, x, false, w, true, 1.0, 0.0);
  ledger_.add(op_cost::linear_forward(out, x, w, bias, pre));
}

void LedgerDevice::add_bias(const Tensor& out, const Tensor& bias) {
  ShapeOnlyOps::add_bias(out, bias);
  ledger_.add(op_cost::add_bias(out, bias));
}

void LedgerDevice::bias_backward(const Tensor& dbias, const Tensor& dout) {
  ShapeOnlyOps::bias_backward(dbias, dout);
  ledger_.add(op_cost::bias_backward(dbias, dout));
}

void LedgerDevice::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  ShapeOnlyOps::add(out, a, b);
  ledger_.add(op_cost::add(out, a, b));
}

void LedgerDevice::accumulate(const Tensor& dst, const Tensor& src) {
  ShapeOnlyOps::accumulate(dst, src);
  ledger_.add(op_cost::accumulate(dst, src));
}

double LedgerDevice::sum_squares(const Tensor& x) {
  ledger_.add(op_cost::sum_squares(x, false));
  return ShapeOnlyOps::sum_squares(x);
}

void LedgerDevice::sum_squares_to(const Tensor& x, const Tensor& out) {
  (void)out;
  ledger_.add(op_cost::sum_squares(x, true));
}

void LedgerDevice::scale(const Tensor& x, double factor) {
  ShapeOnlyOps::scale(x, factor);
  ledger_.add(op_cost::scale(x));
}

void LedgerDevice::dropout_rows(const Tensor& out, const Tensor& in, double p, uint64_t key, int64_t row0) {
  ShapeOnlyOps::dropout_rows(out, in, p, key, row0);
  const OpCost c = op_cost::dropout_rows(out, in, p);
  if (c.launches > 0) ledger_.add(c);
}

void LedgerDevice::nf4_dequantize(const Tensor& panel, const Tensor& blob, const Nf4Layout& l, int64_t r0,
                                  int64_t c0) {
  ShapeOnlyOps::nf4_dequantize(panel, blob, l, r0, c0);
  const OpCost c = op_cost::nf4_dequantize(panel, l);
  if (c.launches > 0) ledger_.add(c);
}

void LedgerDevice::embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                                     int64_t T) {
  ShapeOnlyOps::embedding_forward(out, tokens, wte, wpe, T);
  ledger_.add(op_cost::embedding_forward(out, tokens));
  flags_pending_ = true;
}

void LedgerDevice::embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                      const Tensor& tokens, int64_t T) {
  ShapeOnlyOps::embedding_backward(dwte, dwpe, dout, tokens, T);
  ledger_.add(op_cost::embedding_backward(dwte, dwpe, dout, tokens, T));
}

void LedgerDevice::layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                                     const Tensor& weight, const Tensor& bias) {
  ShapeOnlyOps::layernorm_forward(out, mean, rstd, inp, weight, bias);
  ledger_.add(op_cost::layernorm_forward(out, inp, mean));
}

void LedgerDevice::layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                      const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                      const Tensor& mean, const Tensor& rstd) {
  ShapeOnlyOps::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  ledger_.add(op_cost::layernorm_backward(dinp, dweight, dout, mean));
}

void LedgerDevice::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t n_head,
                                     int64_t n_kv_head, const Tensor& doc_start) {
  ShapeOnlyOps::attention_forward(out, lse, qkv, n_head, n_kv_head, doc_start);
  ledger_.add(op_cost::attention_forward(out, lse, qkv, n_head, n_kv_head));
}

void LedgerDevice::attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                      const Tensor& lse, int64_t n_head, int64_t n_kv_head,
                                      const Tensor& doc_start) {
  ShapeOnlyOps::attention_backward(dqkv, dout, qkv, out, lse, n_head, n_kv_head, doc_start);
  ledger_.add(op_cost::attention_backward(dqkv, qkv, out, lse, n_head, n_kv_head));
}

void LedgerDevice::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                                   double eps) {
  ShapeOnlyOps::rmsnorm_forward(out, rstd, inp, weight, eps);
  ledger_.add(op_cost::rmsnorm_forward(out, inp, rstd));
}

void LedgerDevice::rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                                    const Tensor& weight, const Tensor& rstd) {
  ShapeOnlyOps::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd);
  ledger_.add(op_cost::rmsnorm_backward(dinp, dweight, dout, rstd));
}

void LedgerDevice::swiglu_forward(const Tensor& out, const Tensor& gate_up) {
  ShapeOnlyOps::swiglu_forward(out, gate_up);
  ledger_.add(op_cost::swiglu_forward(out, gate_up));
}

void LedgerDevice::swiglu_backward(const Tensor& dgate_up, const Tensor& gate_up, const Tensor& dout) {
  ShapeOnlyOps::swiglu_backward(dgate_up, gate_up, dout);
  ledger_.add(op_cost::swiglu_backward(dgate_up, dout));
}

void LedgerDevice::rope_forward(const Tensor& out, const Tensor& inp, int64_t T, int64_t heads, int64_t head_dim,
                                const Rope& rope) {
  ShapeOnlyOps::rope_forward(out, inp, T, heads, head_dim, rope);
  ledger_.add(op_cost::rope(out, inp, heads, head_dim, false));
}

void LedgerDevice::rope_backward(const Tensor& dinp, const Tensor& dout, int64_t T, int64_t heads, int64_t head_dim,
                                 const Rope& rope) {
  ShapeOnlyOps::rope_backward(dinp, dout, T, heads, head_dim, rope);
  ledger_.add(op_cost::rope(dinp, dout, heads, head_dim, true));
}

void LedgerDevice::gelu_forward(const Tensor& out, const Tensor& inp) {
  ShapeOnlyOps::gelu_forward(out, inp);
  ledger_.add(op_cost::gelu_forward(out, inp));
}

void LedgerDevice::gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  ShapeOnlyOps::gelu_backward(dinp, inp, dout);
  ledger_.add(op_cost::gelu_backward(dinp));
}

void LedgerDevice::softmax_cross_entropy_forward(const Tensor& losses, const Tensor& probs, const Tensor& logits,
                                                 const Tensor& targets) {
  ShapeOnlyOps::softmax_cross_entropy_forward(losses, probs, logits, targets);
  ledger_.add(op_cost::softmax_cross_entropy_forward(losses, probs, logits));
  flags_pending_ = true;
}

void LedgerDevice::softmax_cross_entropy_backward(const Tensor& dlogits, const Tensor& probs, const Tensor& targets,
                                                  double dloss) {
  ShapeOnlyOps::softmax_cross_entropy_backward(dlogits, probs, targets, dloss);
  ledger_.add(op_cost::softmax_cross_entropy_backward(dlogits, probs));
}

void LedgerDevice::linear_cross_entropy_forward(const Tensor& losses, const Tensor& x, const Tensor& w,
                                                const Tensor& targets) {
  linear_cross_entropy_forward_in_place(*this, "ledger", losses, x, w, targets,
                                        [&](const Tensor& lc, const Tensor& scores, const Tensor&) {
                                          ledger_.add(op_cost::linear_xent_forward_rows(lc, scores));
                                        });
  flags_pending_ = true;
}

void LedgerDevice::linear_cross_entropy_backward(const Tensor& dx, const Tensor& dw, const Tensor& x, const Tensor& w,
                                                 const Tensor& targets, double) {
  linear_cross_entropy_backward_in_place(*this, "ledger", dx, dw, x, w, targets,
                                         [&](const Tensor& scores, const Tensor&) {
                                           ledger_.add(op_cost::linear_xent_backward_rows(scores));
                                         });
}

void LedgerDevice::adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                         const AdamWStep& step) {
  ShapeOnlyOps::adamw(param, grad, m, v, step);
  ledger_.add(op_cost::adamw(param));
}

}  // namespace ferry::nn
