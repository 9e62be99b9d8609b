// Per-head RMSNorm of the queries and keys inside a packed qkv (Qwen3's q_norm and k_norm),
// composed of the device's existing ops, so that every device computes it with kernels it
// already has and the CPU device stays its oracle.
//
// qkv [N, (NH+2KVH)*hd] holds, per row, NH query heads, then KVH key heads, then KVH value
// heads of hd values each. Forward replaces every query head q by rmsnorm(q) * q_norm and
// every key head k by rmsnorm(k) * k_norm (each over its hd values, eps as given); value
// heads are left as they are. Why composed: the rmsnorm kernel normalises rows of a
// contiguous [rows, hd] tensor, and the heads to normalise are not contiguous (values sit
// between a row's keys and the next row's queries). So the q and k heads are gathered into
// contiguous blocks with embedding_forward (token ids = the head rows' indices, a position
// table of zeros: out = row + 0, exact), normalised there, and gathered back with the value
// heads. A permutation's backward is the inverse permutation: backward gathers too (no
// scatter-add), and every step is exact except the rmsnorm kernels themselves.
//
// Threads and lifetime: as the model that owns it (one host thread issues its ops). The
// index tensors are rebuilt when N changes. Saved tensors live until backward drops them.
#pragma once

#include <cstdint>

#include "nn/device.h"
#include "nn/tensor.h"

namespace ferry::nn {

class HeadNorm {
 public:
  struct Saved {
    Tensor pre;   // [N*(NH+KVH), hd]: the q heads, then the k heads, before the norm
    Tensor rstd;  // [N*(NH+KVH)], statistics dtype
  };

  HeadNorm() = default;
  // `stats`: the dtype of rstd (Model::stat_dtype of `dtype`).
  HeadNorm(Device& device, DType dtype, DType stats, int64_t n_head, int64_t n_kv_head, int64_t head_dim, double eps);

  // qkv [N, W] in place; q_norm and k_norm [hd]. Fills `saved` for backward.
  void forward(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, Saved& saved);
  // dqkv [N, W] in place: the gradient with respect to forward's output comes in, the
  // gradient with respect to its input goes out. dq_norm and dk_norm [hd] are added to.
  void backward(const Tensor& dqkv, const Tensor& dq_norm, const Tensor& dk_norm, const Tensor& q_norm,
                const Tensor& k_norm, const Saved& saved);

 private:
  void prepare(int64_t N);  // the index tensors and the zero position row for N rows of qkv

  Device* dev_ = nullptr;
  DType dtype_ = DType::f32, stats_ = DType::f32;
  int64_t nh_ = 0, kvh_ = 0, hd_ = 0;
  double eps_ = 0;
  int64_t n_ = -1;  // the N the indices were built for
  Tensor gather_qk_;  // i32 [N*(NH+KVH)]: qkv head row of each q, then each k head
  Tensor scatter_;    // i32 [N*(NH+2KVH)]: for each qkv head row, its row in [normed q | normed k | qkv]
  Tensor zero_row_;   // [1, hd] of zeros: embedding_forward's position table
};

}  // namespace ferry::nn
