// DeviceOps: the half of a Device (nn/device.h) that computes: numeric conversion and
// fill, GEMM, and the kernels the models use, forward and backward, and AdamW. The other
// half, memory, copies and ordering, is nn/device_memory.h. Every op of every device is
// checked against the CPU device, which is the oracle (tests/test_backend_ops.cpp).
//
// Contracts, for every implementation (ordering and lifetimes: nn/device_memory.h):
// - Shapes: row-major and contiguous. Shape and dtype mismatches are programmer errors
//   and throw std::invalid_argument with both shapes.
// - Accumulation: ops named *_backward ADD into their gradient outputs (dinp, dweight,
//   dbias...), so gradients accumulate over micro-batches and over the branches of a
//   residual; callers zero them when a new accumulation starts.
#pragma once

#include <cstdint>
#include <vector>

#include "nn/adamw_formula.h"
#include "nn/nf4_blob.h"
#include "nn/rope.h"
#include "nn/tensor.h"

namespace ferry::nn {

struct Nf4Weight;  // nn/nf4_matmul.h

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;

  // ---- conversions ----------------------------------------------------------------------
  virtual void cast(const Tensor& dst, const Tensor& src) = 0;  // numeric conversion, same numel
  virtual void fill(const Tensor& dst, double value) = 0;

  // ---- math -----------------------------------------------------------------------------
  // c[M,N] = alpha * op(a) @ op(b) + beta * c, op(x) = x^T when trans_x. 2-D tensors.
  virtual void gemm(const Tensor& c, const Tensor& a, bool trans_a, const Tensor& b,
                    bool trans_b, double alpha, double beta) = 0;
  // gemm on column windows, for a low-rank adapter on a piece of a packed projection
  // (nn/lora.h: q_proj's rows of Llama's wqkv): c's operand is columns [c_col, c_col + n)
  // of every row of the row-major c ([M, ldc]), n = c_cols; likewise a's operand is
  // columns [a_col, a_col + a_cols) of a's rows, and op(a) its transpose when trans_a.
  // A window of all columns (col 0, cols = the width) is gemm itself. Values as gemm; one
  // dtype for all three operands, or f32 c with 16-bit a and b (as cuBLAS takes them).
  virtual void gemm_cols(const Tensor& c, int64_t c_col, int64_t c_cols, const Tensor& a, int64_t a_col,
                         int64_t a_cols, bool trans_a, const Tensor& b, bool trans_b, double alpha, double beta) = 0;
  // A linear layer with its epilogue: out[N,O] = x[N,I] @ w[O,I]^T + bias[O] (bias may be
  // undefined: no bias). With `pre` defined (same shape and dtype as out), pre receives
  // x w^T + bias and out = gelu(pre), GELU's tanh form (gelu_forward). Values as gemm,
  // add_bias and gelu_forward give them, up to one rounding less (the bias and the GELU are
  // applied to the f32 product before it is rounded to out's dtype). This default runs
  // those three ops (nn/fused_ops.cpp); the cuda device makes it one cuBLASLt call with a
  // bias or GELU+bias epilogue where the dtypes allow (nn/cuda/device_linear.cpp).
  virtual void linear_forward(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                              const Tensor& pre = Tensor{});
  virtual void add_bias(const Tensor& out, const Tensor& bias) = 0;       // out[N,C] += bias[C]
  virtual void bias_backward(const Tensor& dbias, const Tensor& dout) = 0;  // dbias += sum_n dout
  virtual void add(const Tensor& out, const Tensor& a, const Tensor& b) = 0;  // out = a + b
  virtual void accumulate(const Tensor& dst, const Tensor& src) = 0;           // dst += src
  virtual double sum_squares(const Tensor& x) = 0;  // in double, for gradient norms
  // The same into `out` (f64 [1] on this device) without reading it back: a device queues
  // it and the caller reads many at once (review F7). Device gives the default (sum_squares,
  // then a copy).
  virtual void sum_squares_to(const Tensor& x, const Tensor& out) = 0;
  virtual void scale(const Tensor& x, double factor) = 0;
  // Dropout with a mask that is a pure function of its key and each element's global
  // position (PEFT's lora_dropout on an adapter's input, nn/linear.h): for 2-D out and in
  // [N, C] of one dtype (f32, bf16, f16 or f64),
  //   out[i, j] = keep(key, row0 + i, j) ? in[i, j] * (1 / (1 - p)) : 0,
  // keep and the scale as nn/dropout_mask.h defines them (a stateless 64-bit hash against a
  // threshold the host computes from p; the product in f32, f64 for f64, rounded once).
  // Every device gives the same bits: the mask does not depend on N, C, the device or its
  // launch shape, so rows split over calls (row0 = each piece's first global row) get the
  // mask the whole tensor gets, and backward recomputes forward's mask from the same
  // (key, row0). A dropped element is +0 whatever in holds (NaN included). out may be in
  // itself (the same tensor; no other overlap); p == 0 is a copy (nothing when out is in).
  // 0 <= p < 1 and row0 >= 0, else std::invalid_argument, as for shapes and dtypes.
  virtual void dropout_rows(const Tensor& out, const Tensor& in, double p, uint64_t key, int64_t row0) = 0;
  // NF4 (QLoRA's frozen base, nn/nf4_blob.h): panel[R, C] (2-D; f32, bf16, f16 or f64) =
  // rows [r0, r0 + R) x columns [c0, c0 + C) of the matrix whose blob (layout l) starts at
  // `blob`'s first byte, each value nf4_dequantize_rect's float32 rounded once to panel's
  // dtype: the same bits on every device. `blob` is raw bytes in a tensor of any dtype (a
  // view of a unit's frozen span) at least l.bytes long; the rectangle lies inside the
  // matrix, else std::invalid_argument. nn/nf4_matmul.h multiplies by such panels.
  virtual void nf4_dequantize(const Tensor& panel, const Tensor& blob, const Nf4Layout& l, int64_t r0, int64_t c0) = 0;
  // nn/nf4_matmul.h's products straight from W's NF4 pieces, where this device multiplies
  // without a dequantized panel (the CPU device, with its bf16 kernel: the operand is
  // dequantized as the GEMM packs it; the cuda device with device.nf4_gemm fused, in its
  // shared-memory tiles): trans_w, c[:, c_col + j] = beta c + sum_k a[:, k] W[j, k] (the
  // forward); else c[:, k] = beta c + sum_j a[:, a_col + j] W[j, k] (dx). The CPU's values
  // are the panel path's bit for bit; the cuda kernel's match it to the GEMM's rounding
  // (its sums in the tensor cores' order, not cuBLAS's). Returns false, having done
  // nothing, where the device has no such path: the caller then dequantizes panels. Shapes
  // as the panel path's, and pieces that tile W's rows in order with one row length
  // (std::invalid_argument).
  virtual bool nf4_gemm(const Tensor& c, int64_t c_col, const Tensor& a, int64_t a_col,
                        const std::vector<Nf4Weight>& pieces, bool trans_w, double beta) {
    (void)c, (void)c_col, (void)a, (void)a_col, (void)pieces, (void)trans_w, (void)beta;
    return false;
  }

  // ---- model kernels (shapes: B batch, T time, C channels, V vocab, NH heads) -----------
  // out[B*T,C] = wte[tokens] + wpe[t]; tokens i32[B*T].
  virtual void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                 const Tensor& wpe, int64_t T) = 0;
  virtual void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                  const Tensor& tokens, int64_t T) = 0;
  // LayerNorm over the last dim of inp[N,C]; mean/rstd [N] are saved for backward.
  virtual void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                 const Tensor& inp, const Tensor& weight, const Tensor& bias) = 0;
  virtual void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                  const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd) = 0;
  // Causal self-attention in memory linear in T (FlashAttention-2's algorithm: scores
  // are made tile by tile with an online softmax and never stored). qkv[B,T,(NH+2KVH)*hs]
  // holds q (n_head heads), then k and v (n_kv_head heads each; 0 = n_head: GPT-2's q|k|v
  // of C each); query head h uses key/value head h / (n_head / n_kv_head) (grouped-query
  // attention). out[B,T,C], C = NH * hs. lse[B,NH,T] (the statistics dtype: f32, f64 for
  // f64 models) receives each query row's log-sum-exp of its scaled scores, all that
  // backward needs beside q, k, v and out.
  // doc_start (optional, i32 [B*T]): packed documents; position t of row b attends only to
  // positions [doc_start[b*T+t], t] (its own document's prefix), 0 <= doc_start <= t
  // (FlashAttention's cu_seqlens, one start per position). Backward takes the same tensor.
  virtual void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                 int64_t n_head, int64_t n_kv_head = 0, const Tensor& doc_start = Tensor{}) = 0;
  // dqkv += the gradient of out (dout) through attention, recomputing the probabilities
  // tile by tile from q, k and lse; out is forward's output (for rowsum(dout * out)).
  virtual void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                  const Tensor& lse, int64_t n_head, int64_t n_kv_head = 0,
                                  const Tensor& doc_start = Tensor{}) = 0;
  // RMSNorm over the last dim of inp[N,C] (Llama); rstd [N] is saved for backward.
  virtual void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                               double eps) = 0;
  virtual void rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                                const Tensor& weight, const Tensor& rstd) = 0;
  // SwiGLU: gate_up[N,2H] holds gate | up; out[N,H] = silu(gate) * up.
  virtual void swiglu_forward(const Tensor& out, const Tensor& gate_up) = 0;
  virtual void swiglu_backward(const Tensor& dgate_up, const Tensor& gate_up, const Tensor& dout) = 0;
  // Rotary position embeddings on the first heads*head_dim columns of x[B*T, width]
  // (position = row % T, frequencies Rope::inv_freq), the halves of each head rotated together (Hugging
  // Face's Llama); later columns pass through. out may be inp. rope_backward adds the
  // transposed map of dout into dinp (inverse rotation; identity past the rotated heads).
  virtual void rope_forward(const Tensor& out, const Tensor& inp, int64_t T, int64_t heads, int64_t head_dim,
                            const Rope& rope) = 0;
  virtual void rope_backward(const Tensor& dinp, const Tensor& dout, int64_t T, int64_t heads, int64_t head_dim,
                             const Rope& rope) = 0;
  // GELU, tanh approximation (GPT-2).
  virtual void gelu_forward(const Tensor& out, const Tensor& inp) = 0;
  virtual void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) = 0;
  // probs[N,V] = softmax(logits); losses[N] = -log probs[target]. targets i32[N]; a target of
  // kIgnoreTarget (-1: a prompt or padding position) gives loss 0 and no gradient.
  virtual void softmax_cross_entropy_forward(const Tensor& losses, const Tensor& probs,
                                             const Tensor& logits, const Tensor& targets) = 0;
  // dlogits += dloss * (probs - onehot(target)), the same dloss for every row; ignored rows
  // are left as they are.
  virtual void softmax_cross_entropy_backward(const Tensor& dlogits, const Tensor& probs,
                                              const Tensor& targets, double dloss) = 0;

  // The output layer and the loss fused (Liger-Kernel's fused linear cross-entropy): the
  // scores x @ w^T are made a chunk of rows at a time into device scratch whose size does
  // not depend on N (nn/linear_cross_entropy.h: the budget and how rows are chunked), so
  // [N, V] logits, probabilities and their gradient never exist. x[N,C] in the compute
  // dtype, w[V,C] the head (a tied embedding or its own weight), targets i32[N].
  // losses[N] (the statistics dtype: f32, f64 for f64 models; its dtype is that of the
  // softmax) = logsumexp_v(x_n . w_v) - x_n . w_target, 0 where the target is kIgnoreTarget;
  // the values of softmax_cross_entropy_forward on the stored logits, up to rounding.
  // A target outside [0, V) is an error as there.
  virtual void linear_cross_entropy_forward(const Tensor& losses, const Tensor& x, const Tensor& w,
                                            const Tensor& targets);
  // dx[N,C] += dloss * (softmax(x w^T) - onehot(target)) @ w and dw[V,C] += its transpose
  // @ x, the same dloss for every row, ignored rows contributing nothing. Each chunk's
  // scores are recomputed from x and w, one more head GEMM (2 N V C FLOPs) beside the two
  // of the gradient: the price of never storing them. dw may be f32 beside bf16 x and w
  // (the trainer's gradient dtype), as gemm allows; an undefined dw (a frozen head) skips
  // its GEMM. Nothing is kept between the two calls:
  // backward's softmax is recomputed from the scores, whole rows of which every chunk holds,
  // in the statistics dtype forward's losses had (f32 for bf16/f16 x, else x's dtype).
  virtual void linear_cross_entropy_backward(const Tensor& dx, const Tensor& dw, const Tensor& x,
                                             const Tensor& w, const Tensor& targets, double dloss);

  // ---- optimizer ---------------------------------------------------------------------------
  // One AdamW step in place over f32 param, m, v from f32 grad, all of one numel
  // (nn/adamw_formula.h: the formula offload/cpu_adam.h computes on host shards). For runs
  // whose optimizer states stay on the device.
  virtual void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                     const AdamWStep& step) = 0;
};

}  // namespace ferry::nn
