// Argument checks shared by the devices: the shapes an op accepts, whatever computes it.
// Errors: std::invalid_argument naming the device and op ("cuda.gemm: ...") and the
// tensors involved. Dtypes are each device's business (the CPU device wants one dtype per
// op after widening; the CUDA device mixes bf16 activations with f32 gradients in-kernel).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/nf4_blob.h"
#include "nn/tensor.h"

namespace ferry::nn {
struct Nf4Weight;  // nn/nf4_matmul.h
}  // namespace ferry::nn

namespace ferry::nn::checks {

[[noreturn]] void fail(const char* device, const char* op, const std::string& what);

// Rows of a tensor seen as a matrix whose last dimension is the row length.
inline int64_t rows_of(const Tensor& t) {
  return t.numel() / t.dim(-1);
}

void same_shape(const char* device, const char* op, const Tensor& a,
                const Tensor& b);  // shape only

struct GemmDims {
  int64_t M = 0, N = 0, K = 0;
};
// c[M,N] = op(a) @ op(b) with 2-D operands whose inner dimensions chain.
GemmDims gemm(const char* device, const Tensor& c, const Tensor& a, bool trans_a, const Tensor& b,
              bool trans_b);

// gemm_cols: the windows inside their 2-D tensors, then the product's dimensions.
GemmDims gemm_cols(const char* device, const Tensor& c, int64_t c_col, int64_t c_cols, const Tensor& a,
                   int64_t a_col, int64_t a_cols, bool trans_a, const Tensor& b, bool trans_b);

// Returns the channels C of out (n_head * head size); n_kv_head already defaulted. lse is
// [B,NH,T] in the statistics dtype (f64 when qkv is f64, else f32).
int64_t attention(const char* device, const char* op, const Tensor& out, const Tensor& lse,
                  const Tensor& qkv, int64_t n_head, int64_t n_kv_head);

// An optional document-start tensor of attention_forward: i32, one entry per (batch, position).
void doc_start(const char* device, const char* op, const Tensor& doc_start, const Tensor& qkv);

void rope(const char* device, const char* op, const Tensor& a, const Tensor& b, int64_t T,
          int64_t heads, int64_t head_dim);

// dropout_rows: out and in 2-D, one shape and one floating dtype, the same tensor or apart
// (no partial overlap); 0 <= p < 1 (NaN refused); row0 >= 0.
void dropout_rows(const char* device, const Tensor& out, const Tensor& in, double p, int64_t row0);
// nf4_dequantize: a 2-D floating panel, a blob of at least l.bytes, the rectangle inside l.
void nf4_dequantize(const char* device, const Tensor& panel, const Tensor& blob, const Nf4Layout& l, int64_t r0,
                    int64_t c0);
// nf4_gemm (DeviceOps::nf4_gemm): pieces that tile W's rows in order with one row length,
// each blob at least its layout's bytes; a and c 2-D with
// as many rows; trans_w: W^T's N = R columns inside c from c_col, a's width W's row length
// in; else W's K = R rows inside a's columns from a_col, c's width in. Returns the product's
// M, N, K and where in c and a it starts.
struct Nf4GemmDims {
  int64_t M = 0, N = 0, K = 0, c_from = 0, a_from = 0;
};
Nf4GemmDims nf4_gemm(const char* device, const Tensor& c, int64_t c_col, const Tensor& a, int64_t a_col,
                     const std::vector<Nf4Weight>& pieces, bool trans_w);

}  // namespace ferry::nn::checks
