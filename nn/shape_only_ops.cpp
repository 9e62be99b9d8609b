#include "nn/shape_only_ops.h"

#include "nn/op_checks.h"

namespace ferry::nn {

namespace {

void same(const char* dev, const char* op, const Tensor& a, const Tensor& b) { checks::same_shape(dev, op, a, b); }

void same_numel(const char* dev, const char* op, const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) checks::fail(dev, op, a.describe() + " vs " + b.describe());
}

// A [N, C] operand against a per-channel [C] one.
void channels(const char* dev, const char* op, const Tensor& rows, const Tensor& per_channel) {
  if (per_channel.defined() && per_channel.numel() != rows.dim(-1)) {
    checks::fail(dev, op, rows.describe() + " with " + per_channel.describe());
  }
}

// Per-row statistics [N] of a [N, C] tensor.
void per_row(const char* dev, const char* op, const Tensor& rows, const Tensor& stats) {
  if (stats.defined() && stats.numel() != checks::rows_of(rows)) {
    checks::fail(dev, op, rows.describe() + " with statistics " + stats.describe());
  }
}

}  // namespace

ShapeOnlyOps::ShapeOnlyOps(const char* device_name) : dev_(device_name) {}

void ShapeOnlyOps::cast(const Tensor& dst, const Tensor& src) { same_numel(dev_, "cast", dst, src); }

void ShapeOnlyOps::gemm(const Tensor& c, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, double,
                          double) {
  checks::gemm(dev_, c, a, trans_a, b, trans_b);
}

void ShapeOnlyOps::gemm_cols(const Tensor& c, int64_t c_col, int64_t c_cols, const Tensor& a, int64_t a_col,
                             int64_t a_cols, bool trans_a, const Tensor& b, bool trans_b, double, double) {
  checks::gemm_cols(dev_, c, c_col, c_cols, a, a_col, a_cols, trans_a, b, trans_b);
}

void ShapeOnlyOps::add_bias(const Tensor& out, const Tensor& bias) { channels(dev_, "add_bias", out, bias); }
void ShapeOnlyOps::bias_backward(const Tensor& dbias, const Tensor& dout) { channels(dev_, "bias_backward", dout, dbias); }

void ShapeOnlyOps::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  same_numel(dev_, "add", out, a);
  same_numel(dev_, "add", out, b);
}

void ShapeOnlyOps::accumulate(const Tensor& dst, const Tensor& src) { same_numel(dev_, "accumulate", dst, src); }

void ShapeOnlyOps::nf4_dequantize(const Tensor& panel, const Tensor& blob, const Nf4Layout& l, int64_t r0,
                                  int64_t c0) {
  checks::nf4_dequantize(dev_, panel, blob, l, r0, c0);
}

void ShapeOnlyOps::dropout_rows(const Tensor& out, const Tensor& in, double p, uint64_t, int64_t row0) {
  checks::dropout_rows(dev_, out, in, p, row0);
}

void ShapeOnlyOps::embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor&, const Tensor&,
                                       int64_t) {
  if (tokens.dtype() != DType::i32 || tokens.numel() != checks::rows_of(out)) {
    checks::fail(dev_, "embedding_forward", out.describe() + " from tokens " + tokens.describe());
  }
}

void ShapeOnlyOps::embedding_backward(const Tensor& dwte, const Tensor&, const Tensor& dout, const Tensor& tokens,
                                        int64_t) {
  if (tokens.numel() != checks::rows_of(dout) || dwte.dim(-1) != dout.dim(-1)) {
    checks::fail(dev_, "embedding_backward", dwte.describe() + " from " + dout.describe());
  }
}

void ShapeOnlyOps::layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                                       const Tensor& weight, const Tensor& bias) {
  same(dev_, "layernorm_forward", out, inp);
  per_row(dev_, "layernorm_forward", inp, mean);
  per_row(dev_, "layernorm_forward", inp, rstd);
  channels(dev_, "layernorm_forward", inp, weight);
  channels(dev_, "layernorm_forward", inp, bias);
}

void ShapeOnlyOps::layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                        const Tensor& dout, const Tensor& inp, const Tensor&, const Tensor& mean,
                                        const Tensor& rstd) {
  same(dev_, "layernorm_backward", dinp, inp);
  same(dev_, "layernorm_backward", dout, inp);
  channels(dev_, "layernorm_backward", inp, dweight);
  channels(dev_, "layernorm_backward", inp, dbias);
  per_row(dev_, "layernorm_backward", inp, mean);
  per_row(dev_, "layernorm_backward", inp, rstd);
}

void ShapeOnlyOps::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t n_head,
                                       int64_t n_kv_head, const Tensor& doc_start) {
  checks::attention(dev_, "attention_forward", out, lse, qkv, n_head, n_kv_head == 0 ? n_head : n_kv_head);
  checks::doc_start(dev_, "attention_forward", doc_start, qkv);
}

void ShapeOnlyOps::attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                        const Tensor& lse, int64_t n_head, int64_t n_kv_head,
                                        const Tensor& doc_start) {
  same(dev_, "attention_backward", dqkv, qkv);
  same(dev_, "attention_backward", dout, out);
  checks::attention(dev_, "attention_backward", dout, lse, qkv, n_head, n_kv_head == 0 ? n_head : n_kv_head);
  checks::doc_start(dev_, "attention_backward", doc_start, qkv);
}

void ShapeOnlyOps::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                                     double) {
  same(dev_, "rmsnorm_forward", out, inp);
  per_row(dev_, "rmsnorm_forward", inp, rstd);
  channels(dev_, "rmsnorm_forward", inp, weight);
}

void ShapeOnlyOps::rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                                      const Tensor&, const Tensor& rstd) {
  same(dev_, "rmsnorm_backward", dinp, inp);
  same(dev_, "rmsnorm_backward", dout, inp);
  channels(dev_, "rmsnorm_backward", inp, dweight);
  per_row(dev_, "rmsnorm_backward", inp, rstd);
}

void ShapeOnlyOps::swiglu_forward(const Tensor& out, const Tensor& gate_up) {
  if (checks::rows_of(out) != checks::rows_of(gate_up) || 2 * out.dim(-1) != gate_up.dim(-1)) {
    checks::fail(dev_, "swiglu_forward", out.describe() + " from " + gate_up.describe());
  }
}

void ShapeOnlyOps::swiglu_backward(const Tensor& dgate_up, const Tensor& gate_up, const Tensor& dout) {
  same(dev_, "swiglu_backward", dgate_up, gate_up);
  ShapeOnlyOps::swiglu_forward(dout, gate_up);
}

void ShapeOnlyOps::rope_forward(const Tensor& out, const Tensor& inp, int64_t T, int64_t heads, int64_t head_dim,
                                  const Rope&) {
  checks::rope(dev_, "rope_forward", out, inp, T, heads, head_dim);
}

void ShapeOnlyOps::rope_backward(const Tensor& dinp, const Tensor& dout, int64_t T, int64_t heads, int64_t head_dim,
                                   const Rope&) {
  checks::rope(dev_, "rope_backward", dinp, dout, T, heads, head_dim);
}

void ShapeOnlyOps::gelu_forward(const Tensor& out, const Tensor& inp) { same(dev_, "gelu_forward", out, inp); }

void ShapeOnlyOps::gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  same(dev_, "gelu_backward", dinp, inp);
  same(dev_, "gelu_backward", dout, inp);
}

void ShapeOnlyOps::softmax_cross_entropy_forward(const Tensor& losses, const Tensor& probs, const Tensor& logits,
                                                   const Tensor& targets) {
  same(dev_, "softmax_cross_entropy_forward", probs, logits);
  per_row(dev_, "softmax_cross_entropy_forward", logits, losses);
  per_row(dev_, "softmax_cross_entropy_forward", logits, targets);
}

void ShapeOnlyOps::softmax_cross_entropy_backward(const Tensor& dlogits, const Tensor& probs, const Tensor& targets,
                                                    double) {
  same_numel(dev_, "softmax_cross_entropy_backward", dlogits, probs);
  per_row(dev_, "softmax_cross_entropy_backward", probs, targets);
}

void ShapeOnlyOps::adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                           const AdamWStep&) {
  same_numel(dev_, "adamw", param, grad);
  same_numel(dev_, "adamw", param, m);
  same_numel(dev_, "adamw", param, v);
}

}  // namespace ferry::nn
