// The linear layer the models call: y = x W^T (+ b), forward and backward.
//
// Every weight matrix a model multiplies by goes through here, so that what a layer is (a
// trained weight, a frozen one, and with adapters a low-rank pair beside a frozen or
// quantized base) is a property of its parameters and not a second path through each
// model. What a layer's backward computes follows the tensors it is given: an undefined
// dw is a frozen weight (its gradient GEMM is not run), an undefined db a frozen or absent
// bias, an undefined dx an input that needs no gradient.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "nn/device.h"
#include "nn/nf4_matmul.h"
#include "nn/unit.h"

namespace ferry::nn {

// A low-rank adapter on rows [row0, row0 + rows) of the layer's output (nn/lora.h):
// y[:, rows] += scale x' a^T b^T, a [r, in], b [rows, r], where x' is the layer's input x
// after PEFT's lora_dropout: x' = DeviceOps::dropout_rows(x, dropout, dropout_key,
// dropout_row0), x itself when dropout is 0. The mask is a function of (dropout_key, global
// row, column) alone, so backward recomputes it from the same fields; a layer's forward and
// its backward must be given the same values.
struct LoraPair {
  Tensor a, b;
  Tensor da, db;  // their gradients, accumulated into; undefined: not trained
  int64_t row0 = 0, rows = 0;
  double scale = 1.0;
  double dropout = 0.0;       // PEFT's lora_dropout p, in [0, 1); 0: none (x' = x, no temporary)
  uint64_t dropout_key = 0;   // this adapter's mask key for this micro-batch (nn::Model::linear)
  int64_t dropout_row0 = 0;   // the global row index of x's first row (a position in the step)
};

struct Linear {
  Tensor w;   // [out, in], the weight as y = x w^T uses it
  Tensor b;   // [out]; undefined: no bias
  Tensor dw;  // w's gradient, accumulated into (+=); undefined: w is frozen
  Tensor db;  // b's gradient, accumulated into; undefined: no bias, or a frozen one
  std::vector<LoraPair> lora;  // adapters beside the weight (usually with w frozen)
  // A frozen NF4 base (QLoRA): when not empty, W is these pieces, which cover its rows in
  // order, and w holds their blobs' bytes (it is not read as values); dw is undefined.
  std::vector<Nf4Weight> nf4{};
};

// The linear layer whose weight is tensor `w_index` of unit `u` and whose bias is tensor
// `b_index` (kNoBias: none), viewed inside the unit's `weights` and, for backward, its
// `grads` (UnitSpec::grad_view: frozen tensors and an undefined `grads` give no gradient);
// a weight stored in NF4 (TensorSpec::nf4) gives its pieces in Linear::nf4.
constexpr size_t kNoBias = static_cast<size_t>(-1);
Linear unit_linear(const UnitSpec& u, const Tensor& weights, const Tensor& grads, size_t w_index,
                   size_t b_index = kNoBias);

// y[N,out] = x[N,in] w^T + b (+ each adapter's scale (x a^T) b^T in its rows). With `pre`
// defined (shaped as y), pre = that sum and y = gelu(pre) (DeviceOps::linear_forward: one
// cuBLASLt call with its epilogue on the cuda device where there is no adapter).
void linear_forward(Device& dev, const Linear& l, const Tensor& y, const Tensor& x, const Tensor& pre = Tensor{});

// From dy[N,out] and the forward's input x[N,in]: dx = dy w (overwritten; skipped when dx
// is undefined), dw += dy^T x and db += the column sums of dy, each only where defined.
// Adapters: u = x' a^T is recomputed (an [N, r] GEMM, not kept from forward), then
// db += scale dy[:, rows]^T u, du = scale dy[:, rows] b, da += du^T x', dx += du a; with
// dropout, x' is recomputed from x (forward's mask) and dx += dropout_rows(du a) (the same
// mask and 1 / (1 - p): the map x -> x' is diagonal), du a made in an [N, in] temporary of
// dx's dtype (one rounding more than the GEMM adding into dx at dropout 0).
// Temporaries per adapter with dropout: x' [N, in] in x's dtype, and that [N, in].
// An NF4 base (l.nf4): the products of nn/nf4_matmul.h (one GEMM per panel whatever the
// pieces), the bias added after (no fused epilogue).
void linear_backward(Device& dev, const Linear& l, const Tensor& dx, const Tensor& dy, const Tensor& x);

}  // namespace ferry::nn
