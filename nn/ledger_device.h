// LedgerDevice: a counting device (nn/counting_device.h: memory counted, ops checked for
// shape, nothing computed) that also writes the cost each op would have on the cuda device
// into an OpLedger (nn/op_ledger.h). A model run on it at a GPU's shapes gives, in
// milliseconds of CPU time and no GPU, the launches, FLOPs and bytes of a step, and the
// step time a GPU's rates predict: `ferry bench model --predict`.
// Every DeviceOps op is overridden here; tests/test_op_ledger.cpp checks, on the CPU
// emulation of the cuda device, that a model step's launches match the ledger's, so an op
// added without its cost shows there.
#pragma once

#include <string>

#include "nn/counting_device.h"
#include "nn/op_ledger.h"

namespace ferry::nn {

class LedgerDevice final : public CountingDevice {
 public:
  // A stand-in for a GPU: not host accessible, kind cuda, `capacity_bytes` of memory.
  LedgerDevice(std::string label, size_t capacity_bytes);

  OpLedger& ledger() { return ledger_; }

  // Host copies are one launch each; the cuda device also reads its value-error flags back
  // (one more copy) at the first host read or synchronize after an op that sets them
  // (embedding_forward, softmax_cross_entropy_forward): CudaDevice::check_errors.
  void copy_from_host(const Tensor& dst, const void* src) override;
  void copy_to_host(void* dst, const Tensor& src) override;
  void synchronize() override;
  void copy(const Tensor& dst, const Tensor& src) override;
  void cast(const Tensor& dst, const Tensor& src) override;
  void fill(const Tensor& dst, double value) override;
  void gemm(const Tensor& c, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, double alpha,
            double beta) override;
  void gemm_cols(const Tensor& c, int64_t c_col, int64_t c_cols, const Tensor& a, int64_t a_col, int64_t a_cols,
                 bool trans_a, const Tensor& b, bool trans_b, double alpha, double beta) override;
  void linear_forward(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                      const Tensor& pre) override;
  void add_bias(const Tensor& out, const Tensor& bias) override;
  void bias_backward(const Tensor& dbias, const Tensor& dout) override;
  void add(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void accumulate(const Tensor& dst, const Tensor& src) override;
  double sum_squares(const Tensor& x) override;
  void sum_squares_to(const Tensor& x, const Tensor& out) override;
  void scale(const Tensor& x, double factor) override;
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
  // The cuda device's fused head: its chunk loop (nn/linear_cross_entropy.h) with the row
  // kernels' costs; the GEMMs recorded as gemm.
  void linear_cross_entropy_forward(const Tensor& losses, const Tensor& x, const Tensor& w,
                                    const Tensor& targets) override;
  void linear_cross_entropy_backward(const Tensor& dx, const Tensor& dw, const Tensor& x, const Tensor& w,
                                     const Tensor& targets, double dloss) override;
  void softmax_cross_entropy_backward(const Tensor& dlogits, const Tensor& probs, const Tensor& targets,
                                      double dloss) override;
  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
             const AdamWStep& step) override;

 private:
  void check_errors() override;
  OpLedger ledger_;
  bool flags_pending_ = false;
};

}  // namespace ferry::nn
