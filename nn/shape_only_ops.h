// ShapeOnlyOps: DeviceOps (nn/device_ops.h) that check their operands' shapes and dtypes
// (nn/op_checks.h) and do nothing else: no FLOPs, no data; sum_squares returns 0. The ops
// half of a device whose values do not matter, only its allocation sequence: the counting
// device that `ferry plan` runs the engine on (nn/counting_device.h) takes it as its ops.
// A shape mismatch throws std::invalid_argument naming the device given at construction,
// the op and the operands, as every device does. Stateless: thread safe.
#pragma once

#include "nn/device_ops.h"

namespace ferry::nn {

class ShapeOnlyOps : public virtual DeviceOps {
 public:
  // device_name: how errors name the device ("counting"); a string literal (kept, not copied).
  explicit ShapeOnlyOps(const char* device_name);

  void cast(const Tensor& dst, const Tensor& src) override;
  void fill(const Tensor&, double) override {}

  void gemm(const Tensor& c, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, double alpha,
            double beta) override;
  void gemm_cols(const Tensor& c, int64_t c_col, int64_t c_cols, const Tensor& a, int64_t a_col, int64_t a_cols,
                 bool trans_a, const Tensor& b, bool trans_b, double alpha, double beta) override;
  void add_bias(const Tensor& out, const Tensor& bias) override;
  void bias_backward(const Tensor& dbias, const Tensor& dout) override;
  void add(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void accumulate(const Tensor& dst, const Tensor& src) override;
  double sum_squares(const Tensor&) override { return 0.0; }
  void scale(const Tensor&, double) override {}
  void dropout_rows(const Tensor& out, const Tensor& in, double p, uint64_t key, int64_t row0) override;
  void nf4_dequantize(const Tensor& panel, const Tensor& blob, const Nf4Layout& l, int64_t r0, int64_t c0) override;

  void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                         int64_t T) override;
  void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,
                          int64_t T) override;
  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                         const Tensor& weight, const Tensor& bias) override;
  void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd) override;
  void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t n_head,
                         int64_t n_kv_head = 0, const Tensor& doc_start = Tensor{}) override;
  void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, int64_t n_head, int64_t n_kv_head = 0,
                          const Tensor& doc_start = Tensor{}) override;
  void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                       double eps) override;
  void rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& rstd) override;
  void swiglu_forward(const Tensor& out, const Tensor& gate_up) override;
  void swiglu_backward(const Tensor& dgate_up, const Tensor& gate_up, const Tensor& dout) override;
  void rope_forward(const Tensor& out, const Tensor& inp, int64_t T, int64_t heads, int64_t head_dim,
                    const Rope& rope) override;
  void rope_backward(const Tensor& dinp, const Tensor& dout, int64_t T, int64_t heads, int64_t head_dim,
                     const Rope& rope) override;
  void gelu_forward(const Tensor& out, const Tensor& inp) override;
  void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) override;
  void softmax_cross_entropy_forward(const Tensor& losses, const Tensor& probs, const Tensor& logits,
                                     const Tensor& targets) override;
  void softmax_cross_entropy_backward(const Tensor& dlogits, const Tensor& probs, const Tensor& targets,
                                      double dloss) override;
  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
             const AdamWStep& step) override;

 private:
  const char* dev_;
};

}  // namespace ferry::nn
