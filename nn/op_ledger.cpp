// The roofline ledger: each op's cost as the cuda device's kernels incur it (nn/op_ledger.h).
#include "nn/op_ledger.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <utility>

namespace ferry::nn {

namespace {

double bytes_of(const Tensor& t) {
  return t.defined() ? static_cast<double>(t.numel()) * static_cast<double>(dtype_size(t.dtype())) : 0.0;
}
double rows_of(const Tensor& t) {
  return static_cast<double>(t.numel() / std::max<int64_t>(1, t.dim(-1)));
}

// The cuda device's two-pass column reduction (nn/cuda/column_reduce.cuh) at a GPU's 256
// threads: chunks of 256 rows, K f32 partials per column per chunk written and read back
// (f32 accumulation: the models' dtypes).
double column_partial_bytes(double rows, double cols, int K) {
  const double chunks = std::min(std::ceil(rows / 256.0), std::max(1.0, std::floor(1048576.0 / (K * cols))));
  return 2.0 * K * chunks * cols * 4.0;
}

OpCost memory_op(const char* op, int64_t launches, double bytes, double min_bytes) {
  OpCost c;
  c.op = op;
  c.launches = launches;
  c.bytes = bytes;
  c.min_bytes = min_bytes;
  return c;
}

// The embedding and norm backward kernels accumulate into a low-precision gradient through
// an f32 copy (CudaDevice::widen, then one rounding back): two more launches.
bool widens_gradient(const Tensor& g) {
  return is_low_precision(g.dtype());
}

}  // namespace

namespace op_cost {

OpCost cast(const Tensor& dst, const Tensor& src) {
  // Same dtype: a device-to-device copy (one memcpy).
  return memory_op("cast", 1, bytes_of(dst) + bytes_of(src), bytes_of(dst) + bytes_of(src));
}

OpCost fill(const Tensor& dst) {
  return memory_op("fill", dst.numel() > 0 ? 1 : 0, bytes_of(dst), bytes_of(dst));
}

OpCost gemm(const Tensor& c, const Tensor& a, bool ta, const Tensor& b, bool tb, double beta) {
  (void)tb;
  OpCost k;
  k.op = "gemm";
  k.work = Work::gemm;
  const double M = static_cast<double>(c.dim(0)), N = static_cast<double>(c.dim(1));
  const double K = static_cast<double>(ta ? a.dim(0) : a.dim(1));
  if (M == 0 || N == 0) return k;
  k.flops = 2.0 * M * N * K;
  const double cb = bytes_of(c);
  k.min_bytes = bytes_of(a) + bytes_of(b) + cb + (beta != 0 ? cb : 0.0);
  k.bytes = k.min_bytes;
  k.launches = 1;
  if (K == 0) return k;  // a fill or a scale of C
  // CudaDevice::gemm: operands of two types are widened to f32 scratch (a cast each, the
  // scratch read by cuBLAS); a C of another type than the operands (other than f32 for
  // 16-bit operands) goes through f32 scratch, read in when beta != 0, rounded back after.
  DType A = a.dtype(), B = b.dtype();
  if (A != B) {
    for (const Tensor* t : {&a, &b}) {
      if (t->dtype() != DType::f32) {
        k.launches += 1;
        k.bytes += bytes_of(*t) + 3.0 * static_cast<double>(t->numel()) * 4.0;  // read, write f32, read f32
        k.bytes -= bytes_of(*t);  // cuBLAS reads the f32 copy instead
        k.widened = true;
      }
    }
    A = B = DType::f32;
  }
  const bool direct = c.dtype() == A || (is_low_precision(A) && c.dtype() == DType::f32);
  if (!direct) {
    k.launches += beta != 0 ? 2 : 1;
    k.bytes += 2.0 * static_cast<double>(c.numel()) * 4.0 + (beta != 0 ? cb + static_cast<double>(c.numel()) * 4.0 : 0.0);
    k.widened = true;
  }
  k.low_precision = is_low_precision(A);
  return k;
}

OpCost gemm_cols(const Tensor& c, int64_t M, int64_t N, int64_t K, const Tensor& a, const Tensor& b, double beta) {
  OpCost k;
  k.op = "gemm_cols";
  k.work = Work::gemm;
  if (M == 0 || N == 0) return k;
  const double m = static_cast<double>(M), n = static_cast<double>(N), kk = static_cast<double>(K);
  k.flops = 2.0 * m * n * kk;
  const double cb = m * n * static_cast<double>(dtype_size(c.dtype()));
  k.min_bytes = m * kk * static_cast<double>(dtype_size(a.dtype())) + bytes_of(b) + cb + (beta != 0 ? cb : 0.0);
  k.bytes = k.min_bytes;
  k.launches = 1;
  k.low_precision = is_low_precision(a.dtype());
  return k;
}

OpCost linear_forward(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& pre) {
  OpCost k = gemm(out, x, false, w, true, 0.0);
  k.op = "linear_forward";
  // The epilogue reads the bias and writes the pre-activation beside the output.
  k.bytes += bytes_of(bias) + bytes_of(pre);
  k.min_bytes = k.bytes;
  return k;
}

OpCost add_bias(const Tensor& out, const Tensor& bias) {
  const double b = 2.0 * bytes_of(out) + bytes_of(bias);
  return memory_op("add_bias", 1, b, b);
}

OpCost bias_backward(const Tensor& dbias, const Tensor& dout) {
  const double rows = rows_of(dout), cols = static_cast<double>(dout.dim(-1));
  const double min = bytes_of(dout) + 2.0 * bytes_of(dbias);
  return memory_op("bias_backward", 2, min + column_partial_bytes(rows, cols, 1), min);
}

OpCost add(const Tensor& out, const Tensor& a, const Tensor& b) {
  const double x = bytes_of(out) + bytes_of(a) + bytes_of(b);
  return memory_op("add", 1, x, x);
}

OpCost accumulate(const Tensor& dst, const Tensor& src) {
  const double x = 2.0 * bytes_of(dst) + bytes_of(src);
  return memory_op("accumulate", 1, x, x);
}

OpCost sum_squares(const Tensor& x, bool to_device) {
  // Block partials, one summing kernel, then one 8-byte copy (to the host or to `out`).
  OpCost c = memory_op(to_device ? "sum_squares_to" : "sum_squares", 3, bytes_of(x), bytes_of(x));
  c.flops = 2.0 * static_cast<double>(x.numel());
  return c;
}

OpCost scale(const Tensor& x) {
  return memory_op("scale", 1, 2.0 * bytes_of(x), 2.0 * bytes_of(x));
}

OpCost dropout_rows(const Tensor& out, const Tensor& in, double p) {
  const double x = bytes_of(out) + bytes_of(in);
  if (p == 0.0) {
    OpCost c = memory_op("copy", out.data() == in.data() ? 0 : 1, x, x);
    if (c.launches == 0) c.bytes = c.min_bytes = 0;
    return c;
  }
  return memory_op("dropout_rows", out.numel() > 0 ? 1 : 0, x, x);
}

OpCost nf4_dequantize(const Tensor& panel, const Nf4Layout& l) {
  const double x = bytes_of(panel) + static_cast<double>(l.rect_bytes(panel.dim(0), panel.dim(1)));
  return memory_op("nf4_dequantize", panel.numel() > 0 ? 1 : 0, x, x);
}

OpCost embedding_forward(const Tensor& out, const Tensor& tokens) {
  // A row of wte and one of wpe read per token (the gathers; wte and wpe have out's
  // dtype), the output written.
  const double x = bytes_of(tokens) + 3.0 * bytes_of(out);
  return memory_op("embedding_forward", 1, x, x);
}

OpCost embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,
                          int64_t T) {
  const double N = static_cast<double>(tokens.numel()), C = static_cast<double>(dout.dim(-1));
  // dwte: each token's row of dout added into its row of dwte (read and written); dwpe: the
  // column sums of dout as [N / T, T C] (two passes); a low-precision dwte through f32.
  const double min = bytes_of(tokens) + bytes_of(dout) + 2.0 * N * C * static_cast<double>(dtype_size(dwte.dtype())) +
                     2.0 * bytes_of(dwpe);
  // The wte kernel's blocks (up to 512) each scan every token id for the rows they own.
  const double scans = std::min(512.0, std::ceil(N / 16.0)) * bytes_of(tokens);
  double x = min + scans + bytes_of(dout) +
             column_partial_bytes(N / static_cast<double>(T), static_cast<double>(T) * C, 1);
  int64_t launches = 3;
  if (widens_gradient(dwte)) {
    launches += 2;
    x += 2.0 * (bytes_of(dwte) + static_cast<double>(dwte.numel()) * 4.0);
  }
  OpCost c = memory_op("embedding_backward", launches, x, min);
  c.widened = widens_gradient(dwte);
  return c;
}

OpCost layernorm_forward(const Tensor& out, const Tensor& inp, const Tensor& mean) {
  const double x = bytes_of(inp) + bytes_of(out) + 2.0 * bytes_of(mean) + 2.0 * 4.0 * static_cast<double>(inp.dim(-1));
  return memory_op("layernorm_forward", 1, x, x);
}

OpCost layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& mean) {
  const double rows = rows_of(dout), C = static_cast<double>(dout.dim(-1));
  // Floor: dout, inp, mean, rstd read once; dinp added into; dweight, dbias added into.
  const double min = 2.0 * bytes_of(dout) + 2.0 * bytes_of(mean) + 2.0 * bytes_of(dinp) + 4.0 * bytes_of(dweight);
  // The rows kernel reads dout and inp; the column pass reads them again, with its partials.
  const double x = min + 2.0 * bytes_of(dout) + column_partial_bytes(rows, C, 2) + 2.0 * bytes_of(mean);
  return memory_op("layernorm_backward", 3, x, min);
}

OpCost rmsnorm_forward(const Tensor& out, const Tensor& inp, const Tensor& rstd) {
  const double x = bytes_of(inp) + bytes_of(out) + bytes_of(rstd) + 4.0 * static_cast<double>(inp.dim(-1));
  return memory_op("rmsnorm_forward", 1, x, x);
}

OpCost rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& rstd) {
  const double rows = rows_of(dout), C = static_cast<double>(dout.dim(-1));
  const double min = 2.0 * bytes_of(dout) + bytes_of(rstd) + 2.0 * bytes_of(dinp) + 2.0 * bytes_of(dweight);
  const double x = min + 2.0 * bytes_of(dout) + column_partial_bytes(rows, C, 1) + bytes_of(rstd);
  return memory_op("rmsnorm_backward", 3, x, min);
}

namespace {
// Causal score count per (batch, head): T (T + 1) / 2.
double causal_scores(double T) {
  return T * (T + 1.0) / 2.0;
}
}  // namespace

OpCost attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t n_head, int64_t n_kv_head) {
  (void)n_kv_head;
  OpCost c;
  c.op = "attention_forward";
  c.work = Work::attention_forward;
  c.launches = 1;
  const double B = static_cast<double>(qkv.dim(0)), T = static_cast<double>(qkv.dim(1));
  const int64_t hs = out.dim(-1) / n_head;
  c.flops = 4.0 * static_cast<double>(hs) * B * static_cast<double>(n_head) * causal_scores(T);
  c.min_bytes = c.bytes = bytes_of(qkv) + bytes_of(out) + bytes_of(lse);
  c.head_dim = hs;
  c.T = qkv.dim(1);
  return c;
}

OpCost attention_backward(const Tensor& dqkv, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                          int64_t n_head, int64_t n_kv_head) {
  (void)n_kv_head;
  OpCost c;
  c.op = "attention_backward";
  c.work = Work::attention_backward;
  c.launches = 3;  // rowsum(dout * out), the dK/dV pass, the dQ pass
  const double B = static_cast<double>(qkv.dim(0)), T = static_cast<double>(qkv.dim(1));
  const int64_t hs = out.dim(-1) / n_head;
  c.flops = 2.5 * 4.0 * static_cast<double>(hs) * B * static_cast<double>(n_head) * causal_scores(T);
  // Floor: q, k, v, out, dout, lse read, dqkv added into.
  c.min_bytes = bytes_of(qkv) + 2.0 * bytes_of(out) + bytes_of(lse) + 2.0 * bytes_of(dqkv);
  // The rowsum pass reads out and dout and writes D (f32, like lse); both passes read q,
  // k, v, dout, lse and D.
  c.bytes = c.min_bytes + 2.0 * bytes_of(out) + 2.0 * bytes_of(lse) + bytes_of(qkv) + bytes_of(out) + bytes_of(lse);
  c.head_dim = hs;
  c.T = qkv.dim(1);
  return c;
}

OpCost swiglu_forward(const Tensor& out, const Tensor& gate_up) {
  const double x = bytes_of(out) + bytes_of(gate_up);
  return memory_op("swiglu_forward", 1, x, x);
}

OpCost swiglu_backward(const Tensor& dgate_up, const Tensor& dout) {
  const double x = bytes_of(dgate_up) + bytes_of(dout) + 2.0 * bytes_of(dgate_up);  // gate_up, dgate_up added into
  return memory_op("swiglu_backward", 1, x, x);
}

OpCost rope(const Tensor& out, const Tensor& inp, int64_t heads, int64_t head_dim, bool backward) {
  (void)heads;
  (void)head_dim;
  // Forward writes out (may be inp); backward adds into dinp (read and written).
  const double x = bytes_of(inp) + bytes_of(out) * (backward ? 2.0 : 1.0);
  return memory_op(backward ? "rope_backward" : "rope_forward", 1, x, x);
}

OpCost gelu_forward(const Tensor& out, const Tensor& inp) {
  const double x = bytes_of(out) + bytes_of(inp);
  return memory_op("gelu_forward", 1, x, x);
}

OpCost gelu_backward(const Tensor& dinp) {
  const double x = 4.0 * bytes_of(dinp);  // inp, dout read; dinp added into
  return memory_op("gelu_backward", 1, x, x);
}

OpCost softmax_cross_entropy_forward(const Tensor& losses, const Tensor& probs, const Tensor& logits) {
  const double x = bytes_of(logits) + bytes_of(probs) + bytes_of(losses);
  // The floor of the op as specified stores probs; a fused head does not (nn/op_ledger.h).
  return memory_op("softmax_cross_entropy_forward", 1, x, x);
}

OpCost softmax_cross_entropy_backward(const Tensor& dlogits, const Tensor& probs) {
  const double x = bytes_of(probs) + 2.0 * bytes_of(dlogits);
  return memory_op("softmax_cross_entropy_backward", 1, x, x);
}

OpCost linear_xent_forward_rows(const Tensor& losses, const Tensor& scores) {
  // One pass: the row's max and sum of exponentials together (nn/cuda/linear_xent.cu).
  const double x = bytes_of(scores) + bytes_of(losses);
  return memory_op("linear_xent_forward_rows", 1, x, x);
}

OpCost linear_xent_backward_rows(const Tensor& scores) {
  // The stats pass, then the pass that writes the gradient over the scores.
  return memory_op("linear_xent_backward_rows", 1, 3.0 * bytes_of(scores), 2.0 * bytes_of(scores));
}

OpCost adamw(const Tensor& param) {
  // f32 param, m, v read and written, grad read: 28 bytes per parameter.
  const double x = 7.0 * bytes_of(param);
  OpCost c = memory_op("adamw", 1, x, x);
  c.flops = 15.0 * static_cast<double>(param.numel());
  return c;
}

}  // namespace op_cost

// ---- rates ---------------------------------------------------------------------------------------

namespace {

// FlashAttention-2 on an H100 SXM5, TFLOP/s by context (512 ... 16k), as Shah et al. publish
// it in the FlashAttention-3 paper (arXiv 2407.08608, figures 5 and 6): forward causal, and
// backward (the paper plots backward without the causal mask only).
struct Fa2Curve {
  int64_t hs;
  std::array<double, 6> forward_causal, backward;
};
constexpr std::array<int64_t, 6> kFa2Contexts = {512, 1024, 2048, 4096, 8192, 16384};
constexpr std::array<Fa2Curve, 2> kFa2 = {{
    {64, {180, 229, 262, 284, 295, 299}, {198, 238, 264, 279, 287, 291}},
    {128, {191, 260, 298, 319, 333, 335}, {214, 260, 291, 310, 318, 322}},
}};

double fa2_h100(bool backward, int64_t hs, int64_t T) {
  const Fa2Curve& c = hs <= 64 ? kFa2[0] : kFa2[1];
  const auto& v = backward ? c.backward : c.forward_causal;
  size_t i = 0;
  while (i + 1 < kFa2Contexts.size() && kFa2Contexts[i + 1] <= T) ++i;  // the published context at or below T
  return v[i] * 1e12;
}

GpuRates hopper_rates(const std::string& gpu, double hbm_bytes_per_s, const std::string& hbm_source, Rate gemm_bf16,
                      AttentionKernel attention) {
  GpuRates r;
  r.gpu = gpu;
  r.attention = attention == AttentionKernel::automatic ? AttentionKernel::mma : attention;  // auto's choice on Hopper
  r.gemm_bf16 = gemm_bf16;
  r.gemm_f32 = {50e12, "assumption: 75% of the 67 TFLOP/s fp32 datasheet rate (ferry's fp32 GEMMs use no TF32)"};
  r.memory = {0.85 * hbm_bytes_per_s, "85% of " + hbm_source};
  r.launch = {2e-6, "assumption: 2 us between back-to-back kernels on one stream"};
  return r;
}

}  // namespace

namespace {

// Attention kernels timed on an H200 (2026-11-27, `ferry bench attention --device cuda --bf16`
// in benchmarks/gpu_check.sh: 12 heads of 64, 8,192 tokens per call, bf16), TFLOP/s counted
// causal (nn/op_ledger.h), by context. The H100 has the same multiprocessors and clocks, and
// these kernels are bound by them, not by HBM: the same figures serve it.
struct MeasuredCurve {
  std::array<int64_t, 4> T;
  std::array<double, 4> forward, backward;
};
constexpr MeasuredCurve kMmaH200 = {{256, 1024, 4096, 8192}, {53.7, 99.1, 136.1, 147.4}, {23.2, 49.1, 69.8, 77.1}};
constexpr MeasuredCurve kWmmaH200 = {{256, 1024, 4096, 8192}, {14.1, 21.1, 24.9, 26.2}, {6.0, 11.6, 16.0, 18.0}};
constexpr MeasuredCurve kSimtH200 = {{256, 1024, 4096, 8192}, {4.7, 5.7, 6.4, 6.6}, {4.8, 6.2, 6.9, 7.1}};

// Linear in log2(T) between the measured contexts, flat outside them.
double at_context(const MeasuredCurve& c, bool backward, int64_t T) {
  const auto& v = backward ? c.backward : c.forward;
  if (T <= c.T.front()) return v.front() * 1e12;
  for (size_t i = 0; i + 1 < c.T.size(); ++i) {
    if (T <= c.T[i + 1]) {
      const double a = std::log2(static_cast<double>(c.T[i])), b = std::log2(static_cast<double>(c.T[i + 1]));
      const double f = (std::log2(static_cast<double>(T)) - a) / (b - a);
      return (v[i] + f * (v[i + 1] - v[i])) * 1e12;
    }
  }
  return v.back() * 1e12;
}

}  // namespace

Rate GpuRates::attention_rate(bool backward, int64_t hs, int64_t T) const {
  const std::string pass = backward ? "backward" : "forward";
  const MeasuredCurve* curve = attention == AttentionKernel::simt ? &kSimtH200
                               : attention == AttentionKernel::mma && (hs == 64 || hs == 128) ? &kMmaH200
                                                                                               : &kWmmaH200;
  const char* name = curve == &kSimtH200 ? "SIMT flash" : curve == &kMmaH200 ? "mma.sync" : "wmma tensor-core";
  if (hs <= 64) {
    return {at_context(*curve, backward, T), std::string("measured: the ") + name + " kernels' " + pass +
                                                 " on an H200, head size 64, interpolated at T " + std::to_string(T) +
                                                 " (docs/design/measured.md)"};
  }
  // Head size 128 has not been timed: the head-size-64 figure, scaled as FlashAttention-2's
  // published H100 curve scales from 64 to 128 at that context (an assumption, said so).
  const double scale = fa2_h100(backward, 128, T) / fa2_h100(backward, 64, T);
  return {at_context(*curve, backward, T) * scale,
          std::string("assumption: the ") + name + " kernels' " + pass +
              " measured at head size 64 on an H200, scaled to 128 as FlashAttention-2's H100 curve scales"};
}

GpuRates h100_rates(AttentionKernel attention) {
  return hopper_rates("H100 SXM 80 GB", 3.35e12, "the H100's 3.35 TB/s HBM3 (datasheet)",
                      {678e12, "measured: cuBLAS bf16 at GPT-2 124M's shapes on an H100, 2026-11-25"}, attention);
}

GpuRates h200_rates(AttentionKernel attention) {
  return hopper_rates("H200 141 GB", 4.8e12, "the H200's 4.8 TB/s HBM3e (datasheet)",
                      {748e12, "measured: cuBLAS bf16 at GPT-2 124M's shapes on an H200, 2026-11-27 (804 at Llama 1B's)"},
                      attention);
}

// ---- the ledger ------------------------------------------------------------------------------------

void OpLedger::add(const OpCost& c) {
  auto [it, fresh] = index_.try_emplace(c.op, lines_.size());
  if (fresh) {
    lines_.push_back({});
    lines_.back().op = c.op;
    lines_.back().work = c.work;
  }
  Line& l = lines_[it->second];
  l.calls += 1;
  l.launches += c.launches;
  l.widened += c.widened ? 1 : 0;
  l.flops += c.flops;
  l.bytes += c.bytes;
  l.min_bytes += c.min_bytes;
  calls_.push_back(c);
}

void OpLedger::clear() {
  lines_.clear();
  index_.clear();
  calls_.clear();
}

int64_t OpLedger::launches() const {
  int64_t n = 0;
  for (const Line& l : lines_) n += l.launches;
  return n;
}

int64_t OpLedger::widened() const {
  int64_t n = 0;
  for (const Line& l : lines_) n += l.widened;
  return n;
}

double OpLedger::flops() const {
  double f = 0;
  for (const Line& l : lines_) f += l.flops;
  return f;
}

double OpLedger::seconds(const OpCost& c, const GpuRates& r) {
  double compute = 0;
  switch (c.work) {
    case Work::gemm:
      compute = c.flops / (c.low_precision ? r.gemm_bf16.value : r.gemm_f32.value);
      break;
    case Work::attention_forward:
    case Work::attention_backward:
      compute = c.flops / r.attention_rate(c.work == Work::attention_backward, c.head_dim, c.T).value;
      break;
    case Work::memory:
      break;
  }
  return static_cast<double>(c.launches) * r.launch.value + std::max(compute, c.bytes / r.memory.value);
}

double OpLedger::predict(const GpuRates& r) {
  for (Line& l : lines_) l.seconds = 0;
  double total = 0;
  for (const OpCost& c : calls_) {
    const double s = seconds(c, r);
    lines_[index_.at(c.op)].seconds += s;
    total += s;
  }
  return total;
}

}  // namespace ferry::nn
