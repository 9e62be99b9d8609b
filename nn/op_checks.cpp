#include "nn/op_checks.h"

#include "nn/nf4_matmul.h"

#include <cstdint>
#include <stdexcept>

namespace ferry::nn::checks {

void fail(const char* device, const char* op, const std::string& what) {
  throw std::invalid_argument(std::string(device) + "." + op + ": " + what);
}

void same_shape(const char* device, const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) fail(device, op, a.describe() + " vs " + b.describe());
}

GemmDims gemm(const char* device, const Tensor& c, const Tensor& a, bool ta, const Tensor& b,
              bool tb) {
  if (a.ndim() != 2 || b.ndim() != 2 || c.ndim() != 2) {
    fail(device, "gemm",
         "needs 2-D tensors: c " + c.describe() + ", a " + a.describe() + ", b " + b.describe());
  }
  GemmDims d;
  d.M = ta ? a.dim(1) : a.dim(0);
  d.K = ta ? a.dim(0) : a.dim(1);
  const int64_t Kb = tb ? b.dim(1) : b.dim(0);
  d.N = tb ? b.dim(0) : b.dim(1);
  if (d.K != Kb || c.dim(0) != d.M || c.dim(1) != d.N) {
    std::string what = "shapes do not chain: c " + c.describe();
    what.append(" = op(a ").append(a.describe()).append(ta ? ")^T" : ")");
    what.append(" @ op(b ").append(b.describe()).append(tb ? ")^T" : ")");
    fail(device, "gemm", what);
  }
  return d;
}

GemmDims gemm_cols(const char* device, const Tensor& c, int64_t c_col, int64_t c_cols, const Tensor& a,
                   int64_t a_col, int64_t a_cols, bool ta, const Tensor& b, bool tb) {
  if (a.ndim() != 2 || b.ndim() != 2 || c.ndim() != 2) {
    fail(device, "gemm_cols", "needs 2-D tensors: c " + c.describe() + ", a " + a.describe() + ", b " + b.describe());
  }
  auto window = [&](const char* name, const Tensor& t, int64_t col, int64_t cols) {
    if (col < 0 || cols < 0 || col + cols > t.dim(1)) {
      fail(device, "gemm_cols", std::string("columns [") + std::to_string(col) + ", " + std::to_string(col + cols) +
                                    ") of " + name + " " + t.describe());
    }
  };
  window("c", c, c_col, c_cols);
  window("a", a, a_col, a_cols);
  GemmDims d;
  d.M = ta ? a_cols : a.dim(0);
  d.K = ta ? a.dim(0) : a_cols;
  const int64_t Kb = tb ? b.dim(1) : b.dim(0);
  d.N = tb ? b.dim(0) : b.dim(1);
  if (d.K != Kb || c.dim(0) != d.M || c_cols != d.N) {
    fail(device, "gemm_cols",
         "shapes do not chain: c " + c.describe() + " columns " + std::to_string(c_cols) + " = op(a " + a.describe() +
             " columns " + std::to_string(a_cols) + (ta ? ")^T" : ")") + " @ op(b " + b.describe() + (tb ? ")^T" : ")"));
  }
  return d;
}

int64_t attention(const char* device, const char* op, const Tensor& out, const Tensor& lse,
                  const Tensor& qkv, int64_t n_head, int64_t n_kv_head) {
  if (qkv.ndim() != 3) fail(device, op, "qkv must be [B,T,(NH+2KVH)*hs], got " + qkv.describe());
  const int64_t B = qkv.dim(0), T = qkv.dim(1);
  if (n_head <= 0 || n_kv_head <= 0 || n_head % n_kv_head != 0 ||
      qkv.dim(2) % (n_head + 2 * n_kv_head) != 0) {
    fail(device, op,
         "qkv " + qkv.describe() + " does not split into " + std::to_string(n_head) +
             " query and " + std::to_string(n_kv_head) +
             " key/value heads (n_head a multiple of n_kv_head)");
  }
  const int64_t C = qkv.dim(2) / (n_head + 2 * n_kv_head) * n_head;
  const DType stats = qkv.dtype() == DType::f64 ? DType::f64 : DType::f32;
  if (out.numel() != B * T * C || lse.numel() != B * n_head * T || lse.dtype() != stats) {
    fail(device, op,
         "out " + out.describe() + ", lse " + lse.describe() + " (" + std::string(dtype_name(stats)) + " [B,NH,T]), qkv " +
             qkv.describe());
  }
  return C;
}

void rope(const char* device, const char* op, const Tensor& a, const Tensor& b, int64_t T,
          int64_t heads, int64_t hd) {
  const int64_t width = a.dim(-1);
  if (a.numel() != b.numel() || a.dtype() != b.dtype() || b.dim(-1) != width || heads < 1 ||
      hd < 2 || hd % 2 != 0 || heads * hd > width || T < 1 || rows_of(a) % T != 0) {
    fail(device, op,
         a.describe() + " and " + b.describe() + " with T=" + std::to_string(T) +
             ", heads=" + std::to_string(heads) + ", head_dim=" + std::to_string(hd) +
             " (rows a multiple of T, an even head size, heads within a row)");
  }
}

void doc_start(const char* device, const char* op, const Tensor& doc_start, const Tensor& qkv) {
  if (!doc_start.defined()) return;
  if (doc_start.dtype() != DType::i32 || qkv.ndim() != 3 || doc_start.numel() != qkv.dim(0) * qkv.dim(1)) {
    fail(device, op, "doc_start " + doc_start.describe() + " must be i32 with one entry per row of qkv " + qkv.describe());
  }
}

void dropout_rows(const char* device, const Tensor& out, const Tensor& in, double p, int64_t row0) {
  const char* op = "dropout_rows";
  if (out.ndim() != 2 || out.shape() != in.shape() || out.dtype() != in.dtype() || in.dtype() == DType::i32) {
    fail(device, op, "needs 2-D [N, C] tensors of one shape and one floating dtype: out " + out.describe() +
                         ", in " + in.describe());
  }
  if (!(p >= 0.0 && p < 1.0)) fail(device, op, "p must be in [0, 1), got " + std::to_string(p));
  if (row0 < 0) fail(device, op, "row0 must be >= 0, got " + std::to_string(row0));
  const auto* o = static_cast<const unsigned char*>(out.data());
  const auto* i = static_cast<const unsigned char*>(in.data());
  if (o != i && o < i + in.nbytes() && i < o + out.nbytes()) {
    fail(device, op, "out and in overlap without being the same tensor: out " + out.describe() + ", in " +
                         in.describe());
  }
}

void nf4_dequantize(const char* device, const Tensor& panel, const Tensor& blob, const Nf4Layout& l, int64_t r0,
                    int64_t c0) {
  const char* op = "nf4_dequantize";
  if (panel.ndim() != 2 || panel.dtype() == DType::i32) {
    fail(device, op, "needs a 2-D floating panel, got " + panel.describe());
  }
  if (!blob.defined() || static_cast<int64_t>(blob.nbytes()) < l.bytes) {
    fail(device, op, "the blob " + (blob.defined() ? blob.describe() : std::string("(none)")) + " holds fewer than " +
                         std::to_string(l.bytes) + " bytes");
  }
  if (reinterpret_cast<uintptr_t>(blob.data()) % 16 != 0) {
    fail(device, op, "the blob must start on a 16-byte boundary (its floats are loaded in place)");
  }
  if (r0 < 0 || c0 < 0 || r0 + panel.dim(0) > l.rows || c0 + panel.dim(1) > l.cols) {
    fail(device, op, "panel " + panel.describe() + " at row " + std::to_string(r0) + ", column " +
                         std::to_string(c0) + " outside the [" + std::to_string(l.rows) + ", " +
                         std::to_string(l.cols) + "] matrix");
  }
}

Nf4GemmDims nf4_gemm(const char* device, const Tensor& c, int64_t c_col, const Tensor& a, int64_t a_col,
                     const std::vector<Nf4Weight>& pieces, bool trans_w) {
  const char* op = "nf4_gemm";
  if (pieces.empty()) fail(device, op, "needs at least one NF4 piece");
  const int64_t in = pieces.front().layout.cols;
  int64_t R = 0;
  for (const Nf4Weight& p : pieces) {
    if (p.row0 != R || p.layout.cols != in) {  // the kernels find a row's piece by this order
      fail(device, op, "the pieces must cover W's rows in order with one row length (a piece at row " +
                           std::to_string(p.row0) + " after " + std::to_string(R) + ")");
    }
    if (static_cast<int64_t>(p.blob.nbytes()) < p.layout.bytes) {
      fail(device, op, "a blob of " + p.blob.describe() + " is shorter than its layout's " +
                           std::to_string(p.layout.bytes) + " bytes");
    }
    R += p.layout.rows;
  }
  Nf4GemmDims d;
  d.K = trans_w ? in : R;
  d.N = trans_w ? R : in;
  d.c_from = trans_w ? c_col : 0;
  d.a_from = trans_w ? 0 : a_col;
  if (a.ndim() != 2 || c.ndim() != 2 || a.dim(0) != c.dim(0) || d.c_from < 0 || d.a_from < 0 ||
      d.c_from + d.N > c.dim(1) || d.a_from + d.K > a.dim(1) || (trans_w && a.dim(1) != d.K) ||
      (!trans_w && c.dim(1) != d.N)) {
    fail(device, op, "shapes do not chain: c " + c.describe() + " columns from " + std::to_string(d.c_from) + ", a " +
                         a.describe() + " columns from " + std::to_string(d.a_from) + ", W [" + std::to_string(R) +
                         ", " + std::to_string(in) + "]" + (trans_w ? "^T" : ""));
  }
  d.M = a.dim(0);
  return d;
}

}  // namespace ferry::nn::checks
