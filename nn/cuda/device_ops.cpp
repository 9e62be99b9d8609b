// The cuda device's model ops: shape checks (nn/op_checks.h) and the launchers of
// nn/cuda_kernels.h on the compute stream; the value-error flags of embedding and loss.
#include "nn/cuda/device_impl.h"
#include "nn/dropout_mask.h"
#include "nn/linear_cross_entropy.h"
#include "nn/nf4_matmul.h"

namespace ferry::nn::cuda_dev {
FERRY_CUDA_ABI_BEGIN

namespace {

// Where a blob of layout l keeps each part, for the NF4 kernels.
cuda::Nf4Args nf4_args(const Nf4Layout& l) {
  cuda::Nf4Args q;
  q.cols = l.cols;
  q.code_at = l.code_at;
  q.offset_at = l.offset_at;
  q.nested_at = l.nested_at;
  q.absmax_at = l.absmax_at;
  q.packed_at = l.packed_at;
  q.double_quant = l.double_quant;
  return q;
}

}  // namespace

void CudaDevice::cast(const Tensor& dst, const Tensor& src) {
  if (dst.numel() != src.numel()) fail(kDev, "cast", dst.describe() + " <- " + src.describe());
  if (dst.dtype() == src.dtype()) return copy(dst, src);
  cuda::cast(st(), arr(dst), arr(src), src.numel());
}

void CudaDevice::fill(const Tensor& dst, double value) {
  cuda::fill(st(), arr(dst), value, dst.numel());
}

void CudaDevice::add_bias(const Tensor& out, const Tensor& bias) {
  if (bias.numel() != out.dim(-1)) fail(kDev, "add_bias", out.describe() + " + " + bias.describe());
  cuda::add_bias(st(), arr(out), arr(bias), rows_of(out), out.dim(-1));
}

void CudaDevice::bias_backward(const Tensor& dbias, const Tensor& dout) {
  if (dbias.numel() != dout.dim(-1))
    fail(kDev, "bias_backward", dbias.describe() + " from " + dout.describe());
  cuda::column_sums(st(), arr(dbias), arr(dout), rows_of(dout), dout.dim(-1));
}

void CudaDevice::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  checks::same_shape(kDev, "add", out, a);
  checks::same_shape(kDev, "add", out, b);
  cuda::add(st(), arr(out), arr(a), arr(b), out.numel());
}

void CudaDevice::accumulate(const Tensor& dst, const Tensor& src) {
  checks::same_shape(kDev, "accumulate", dst, src);
  cuda::accumulate(st(), arr(dst), arr(src), dst.numel());
}

void CudaDevice::sum_squares_to(const Tensor& x, const Tensor& out) {
  if (out.dtype() != DType::f64 || out.numel() != 1) fail(kDev, "sum_squares_to", "out " + out.describe());
  cuda::sum_squares(st(), arr(x), x.numel(), partial_);
  FERRY_CUDA_CHECK(cudaMemcpyAsync(out.data(), partial_ + cuda::kSumSquaresBlocks, sizeof(double),
                                   cudaMemcpyDeviceToDevice, compute_));
  debug_sync("sum_squares_to");
}

double CudaDevice::sum_squares(const Tensor& x) {
  cuda::sum_squares(st(), arr(x), x.numel(), partial_);
  FERRY_CUDA_CHECK(cudaMemcpyAsync(total_host_, partial_ + cuda::kSumSquaresBlocks, sizeof(double),
                                   cudaMemcpyDeviceToHost, compute_));
  to_host_ += sizeof(double);
  FERRY_CUDA_CHECK(cudaStreamSynchronize(compute_));
  return *total_host_;
}

void CudaDevice::scale(const Tensor& x, double factor) {
  cuda::scale(st(), arr(x), factor, x.numel());
}

void CudaDevice::dropout_rows(const Tensor& out, const Tensor& in, double p, uint64_t key, int64_t row0) {
  checks::dropout_rows(kDev, out, in, p, row0);
  if (p == 0.0) {
    if (out.data() != in.data()) copy(out, in);
    return;
  }
  cuda::dropout_rows(st(), arr(out), arr(in), in.dim(0), in.dim(1), key, row0, dropout_threshold(p),
                     dropout_scale(p));
}

void CudaDevice::nf4_dequantize(const Tensor& panel, const Tensor& blob, const Nf4Layout& l, int64_t r0,
                                int64_t c0) {
  checks::nf4_dequantize(kDev, panel, blob, l, r0, c0);
  cuda::nf4_dequantize(st(), arr(panel), static_cast<const uint8_t*>(blob.data()), nf4_args(l), panel.dim(0),
                       panel.dim(1), r0, c0);
}

bool CudaDevice::nf4_gemm(const Tensor& c, int64_t c_col, const Tensor& a, int64_t a_col,
                          const std::vector<Nf4Weight>& pieces, bool trans_w, double beta) {
  static_assert(kNf4FusedMaxPieces == static_cast<size_t>(cuda::kNf4GemmMaxPieces));
  if (!nf4_fused_ || !is_low_precision(a.dtype()) || c.dtype() == DType::f64 || c.dtype() == DType::i32 ||
      pieces.size() > kNf4FusedMaxPieces) {
    return false;
  }
  const checks::Nf4GemmDims d = checks::nf4_gemm(kDev, c, c_col, a, a_col, pieces, trans_w);
  std::vector<cuda::Nf4Piece> w;
  for (const Nf4Weight& p : pieces) {
    cuda::Nf4Piece x;
    x.blob = static_cast<const uint8_t*>(p.blob.data());
    x.q = nf4_args(p.layout);
    x.row0 = p.row0;
    w.push_back(x);
  }
  const auto at = [](const Tensor& t, int64_t col) {
    return Arr{static_cast<char*>(t.data()) + col * static_cast<int64_t>(dtype_size(t.dtype())), t.dtype()};
  };
  cuda::nf4_gemm(st(), at(c, d.c_from), c.dim(1), at(a, d.a_from), a.dim(1), w.data(), static_cast<int>(w.size()),
                 trans_w, d.M, d.N, d.K, beta);
  return true;
}

void CudaDevice::embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                   const Tensor& wpe, int64_t T) {
  const int64_t N = tokens.numel(), C = wte.dim(1), V = wte.dim(0);
  if (tokens.dtype() != DType::i32 || out.numel() != N * C || wpe.dim(1) != C || wpe.dim(0) < T ||
      N % T != 0) {
    fail(kDev, "embedding_forward",
         "out " + out.describe() + ", tokens " + tokens.describe() + ", wte " + wte.describe() +
             ", wpe " + wpe.describe() + ", T " + std::to_string(T));
  }
  cuda::embedding_forward(st(), arr(out), tokens.data_as<int32_t>(), arr(wte), arr(wpe), N, T, C, V,
                          err_ + 3 * kTokenSlot);
  flag_limit_[kTokenSlot] = V;
  flags_pending_ = true;
}

void CudaDevice::embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                    const Tensor& tokens, int64_t T) {
  const int64_t N = tokens.numel(), C = dwte.dim(1);
  if (tokens.dtype() != DType::i32 || dout.numel() != N * C || dwpe.dim(1) != C ||
      dwpe.dim(0) < T || N % T != 0) {
    fail(kDev, "embedding_backward", "dout " + dout.describe() + ", dwte " + dwte.describe());
  }
  // A low-precision dwte would be rounded after every row's addition: widened instead, so
  // the sum is rounded once (the CPU device's rule).
  Scratch keep;
  const Arr wte = is_low_precision(dwte.dtype()) ? widen(dwte, keep) : arr(dwte);
  cuda::embedding_backward(st(), wte, arr(dwpe), arr(dout), tokens.data_as<int32_t>(), N, T, C);
  if (wte.p != dwte.data()) cuda::cast(st(), arr(dwte), wte, dwte.numel());
}

void CudaDevice::layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  checks::same_shape(kDev, "layernorm_forward", out, inp);
  const int64_t C = inp.dim(-1), N = rows_of(inp);
  if (weight.numel() != C || bias.numel() != C || mean.numel() != N || rstd.numel() != N) {
    fail(kDev, "layernorm_forward",
         "inp " + inp.describe() + ", weight " + weight.describe() + ", mean " + mean.describe());
  }
  cuda::layernorm_forward(st(), arr(out), arr(mean), arr(rstd), arr(inp), arr(weight), arr(bias), N,
                          C);
}

void CudaDevice::layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                    const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                    const Tensor& mean, const Tensor& rstd) {
  checks::same_shape(kDev, "layernorm_backward", dinp, inp);
  checks::same_shape(kDev, "layernorm_backward", dout, inp);
  const int64_t C = inp.dim(-1), N = rows_of(inp);
  if (dweight.numel() != C || dbias.numel() != C || weight.numel() != C || mean.numel() != N ||
      rstd.numel() != N) {
    fail(kDev, "layernorm_backward", "inp " + inp.describe() + ", dweight " + dweight.describe());
  }
  cuda::layernorm_backward(st(), arr(dinp), arr(dweight), arr(dbias), arr(dout), arr(inp),
                           arr(weight), arr(mean), arr(rstd), N, C);
}

void CudaDevice::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                   int64_t n_head, int64_t n_kv_head, const Tensor& doc_start) {
  const int64_t kv = n_kv_head > 0 ? n_kv_head : n_head;
  const int64_t C = checks::attention(kDev, "attention_forward", out, lse, qkv, n_head, kv);
  checks::doc_start(kDev, "attention_forward", doc_start, qkv);
  cuda::attention_forward(st(), arr(out), arr(lse), arr(qkv), qkv.dim(0), qkv.dim(1), C, n_head,
                          kv, doc_start.defined() ? doc_start.data_as<int32_t>() : nullptr, attention_);
}

void CudaDevice::attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                    const Tensor& out, const Tensor& lse, int64_t n_head,
                                    int64_t n_kv_head, const Tensor& doc_start) {
  const int64_t kv = n_kv_head > 0 ? n_kv_head : n_head;
  const int64_t C = checks::attention(kDev, "attention_backward", dout, lse, qkv, n_head, kv);
  checks::same_shape(kDev, "attention_backward", dqkv, qkv);
  checks::same_shape(kDev, "attention_backward", out, dout);
  checks::doc_start(kDev, "attention_backward", doc_start, qkv);
  const bool f64 = dqkv.dtype() == DType::f64 || dout.dtype() == DType::f64 ||
                   qkv.dtype() == DType::f64 || out.dtype() == DType::f64 || lse.dtype() == DType::f64;
  const int64_t rows = qkv.dim(0) * n_head * qkv.dim(1);
  Scratch rowdot(*this, static_cast<size_t>(rows) * (f64 ? 8 : 4));
  cuda::attention_backward(st(), arr(dqkv), arr(dout), arr(qkv), arr(out), arr(lse), qkv.dim(0),
                           qkv.dim(1), C, n_head, kv,
                           doc_start.defined() ? doc_start.data_as<int32_t>() : nullptr, rowdot.get(),
                           attention_);
}

void CudaDevice::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp,
                                 const Tensor& weight, double eps) {
  checks::same_shape(kDev, "rmsnorm_forward", out, inp);
  const int64_t C = inp.dim(-1), N = rows_of(inp);
  if (weight.numel() != C || rstd.numel() != N) {
    fail(kDev, "rmsnorm_forward",
         "inp " + inp.describe() + ", weight " + weight.describe() + ", rstd " + rstd.describe());
  }
  cuda::rmsnorm_forward(st(), arr(out), arr(rstd), arr(inp), arr(weight), N, C, eps);
}

void CudaDevice::rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout,
                                  const Tensor& inp, const Tensor& weight, const Tensor& rstd) {
  checks::same_shape(kDev, "rmsnorm_backward", dinp, inp);
  checks::same_shape(kDev, "rmsnorm_backward", dout, inp);
  const int64_t C = inp.dim(-1), N = rows_of(inp);
  if (dweight.numel() != C || weight.numel() != C || rstd.numel() != N) {
    fail(kDev, "rmsnorm_backward",
         "inp " + inp.describe() + ", dweight " + dweight.describe() + ", rstd " + rstd.describe());
  }
  cuda::rmsnorm_backward(st(), arr(dinp), arr(dweight), arr(dout), arr(inp), arr(weight), arr(rstd),
                         N, C);
}

void CudaDevice::swiglu_forward(const Tensor& out, const Tensor& gate_up) {
  const int64_t H = out.dim(-1), N = rows_of(out);
  if (gate_up.numel() != 2 * N * H || gate_up.dim(-1) != 2 * H) {
    fail(kDev, "swiglu_forward",
         "out " + out.describe() + ", gate_up " + gate_up.describe() + " (must be [N, 2H])");
  }
  cuda::swiglu_forward(st(), arr(out), arr(gate_up), N, H);
}

void CudaDevice::swiglu_backward(const Tensor& dgate_up, const Tensor& gate_up,
                                 const Tensor& dout) {
  checks::same_shape(kDev, "swiglu_backward", dgate_up, gate_up);
  const int64_t H = dout.dim(-1), N = rows_of(dout);
  if (gate_up.numel() != 2 * N * H || gate_up.dim(-1) != 2 * H) {
    fail(kDev, "swiglu_backward",
         "dout " + dout.describe() + ", gate_up " + gate_up.describe() + " (must be [N, 2H])");
  }
  cuda::swiglu_backward(st(), arr(dgate_up), arr(gate_up), arr(dout), N, H);
}

void CudaDevice::rope_forward(const Tensor& out, const Tensor& inp, int64_t T, int64_t heads,
                              int64_t head_dim, const Rope& rope) {
  checks::rope(kDev, "rope_forward", out, inp, T, heads, head_dim);
  cuda::rope(st(), arr(out), arr(inp), rows_of(inp), T, heads, head_dim, inp.dim(-1), rope, false,
             false);
}

void CudaDevice::rope_backward(const Tensor& dinp, const Tensor& dout, int64_t T, int64_t heads,
                               int64_t head_dim, const Rope& rope) {
  checks::rope(kDev, "rope_backward", dinp, dout, T, heads, head_dim);
  cuda::rope(st(), arr(dinp), arr(dout), rows_of(dout), T, heads, head_dim, dout.dim(-1), rope,
             true, true);
}

void CudaDevice::gelu_forward(const Tensor& out, const Tensor& inp) {
  checks::same_shape(kDev, "gelu_forward", out, inp);
  cuda::gelu_forward(st(), arr(out), arr(inp), inp.numel());
}

void CudaDevice::gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  checks::same_shape(kDev, "gelu_backward", dinp, inp);
  checks::same_shape(kDev, "gelu_backward", dout, inp);
  cuda::gelu_backward(st(), arr(dinp), arr(inp), arr(dout), inp.numel());
}

void CudaDevice::softmax_cross_entropy_forward(const Tensor& losses, const Tensor& probs,
                                               const Tensor& logits, const Tensor& targets) {
  checks::same_shape(kDev, "softmax_cross_entropy_forward", probs, logits);
  const int64_t V = logits.dim(-1), N = rows_of(logits);
  if (targets.dtype() != DType::i32 || targets.numel() != N || losses.numel() != N) {
    fail(kDev, "softmax_cross_entropy_forward",
         "logits " + logits.describe() + ", targets " + targets.describe() + ", losses " +
             losses.describe());
  }
  cuda::softmax_cross_entropy_forward(st(), arr(losses), arr(probs), arr(logits),
                                      targets.data_as<int32_t>(), N, V, err_ + 3 * kTargetSlot);
  flag_limit_[kTargetSlot] = V;
  flags_pending_ = true;
}

void CudaDevice::softmax_cross_entropy_backward(const Tensor& dlogits, const Tensor& probs,
                                                const Tensor& targets, double dloss) {
  checks::same_shape(kDev, "softmax_cross_entropy_backward", dlogits, probs);
  const int64_t V = probs.dim(-1), N = rows_of(probs);
  if (targets.dtype() != DType::i32 || targets.numel() != N) {
    fail(kDev, "softmax_cross_entropy_backward", targets.describe());
  }
  cuda::softmax_cross_entropy_backward(st(), arr(dlogits), arr(probs), targets.data_as<int32_t>(),
                                       N, V, dloss);
}

void CudaDevice::linear_cross_entropy_forward(const Tensor& losses, const Tensor& x, const Tensor& w,
                                              const Tensor& targets) {
  linear_cross_entropy_forward_in_place(
      *this, kDev, losses, x, w, targets, [&](const Tensor& lc, const Tensor& scores, const Tensor& tc) {
        cuda::linear_xent_forward_rows(st(), arr(lc), arr(scores), tc.data_as<int32_t>(), scores.dim(0),
                                       scores.dim(1), err_ + 3 * kTargetSlot);
      });
  flag_limit_[kTargetSlot] = w.dim(0);
  flags_pending_ = true;
}

void CudaDevice::linear_cross_entropy_backward(const Tensor& dx, const Tensor& dw, const Tensor& x, const Tensor& w,
                                               const Tensor& targets, double dloss) {
  linear_cross_entropy_backward_in_place(*this, kDev, dx, dw, x, w, targets,
                                         [&](const Tensor& scores, const Tensor& tc) {
                                           cuda::linear_xent_backward_rows(st(), arr(scores), tc.data_as<int32_t>(),
                                                                           scores.dim(0), scores.dim(1), dloss);
                                         });
}

void CudaDevice::adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                       const AdamWStep& step) {
  for (const Tensor* t : {&param, &grad, &m, &v}) {
    if (t->dtype() != DType::f32 || t->numel() != param.numel()) {
      fail(kDev, "adamw",
           "f32 tensors of one numel: param " + param.describe() + ", got " + t->describe());
    }
  }
  if (step.step < 1) fail(kDev, "adamw", "step must be >= 1, got " + std::to_string(step.step));
  cuda::adamw(st(), param.data_as<float>(), grad.data_as<float>(), m.data_as<float>(),
              v.data_as<float>(), param.numel(), adamw_constants(step));
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda_dev
