#include "nn/qk_norm.h"

#include <cstdint>
#include <stdexcept>
#include <vector>


namespace ferry::nn {

HeadNorm::HeadNorm(Device& device, DType dtype, DType stats, int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                   double eps)
    : dev_(&device), dtype_(dtype), stats_(stats), nh_(n_head), kvh_(n_kv_head), hd_(head_dim), eps_(eps) {
  if (n_head < 1 || n_kv_head < 1 || head_dim < 1) throw std::invalid_argument("HeadNorm: heads and head size must be >= 1");
}

void HeadNorm::prepare(int64_t N) {
  if (N == n_) return;
  const int64_t qk = nh_ + kvh_, heads = nh_ + 2 * kvh_;
  if (N * heads > INT32_MAX) throw std::invalid_argument("HeadNorm: more head rows than an i32 index holds");
  // Gathered block order: all N*NH query heads (row n, head h at n*NH + h), then all N*KVH key heads.
  std::vector<int32_t> gather(static_cast<size_t>(N * qk)), scatter(static_cast<size_t>(N * heads));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < heads; ++j) {
      const int64_t row = n * heads + j;  // this head's row in qkv viewed as [N*heads, hd]
      int64_t at;                         // its row in [normed q | normed k | qkv]
      if (j < nh_) {
        at = n * nh_ + j;
      } else if (j < qk) {
        at = N * nh_ + n * kvh_ + (j - nh_);
      } else {
        at = N * qk + row;  // a value head: taken from qkv itself
      }
      scatter[static_cast<size_t>(row)] = static_cast<int32_t>(at);
      if (j < qk) gather[static_cast<size_t>(at)] = static_cast<int32_t>(row);
    }
  }
  gather_qk_ = Tensor::empty(*dev_, DType::i32, {N * qk});
  scatter_ = Tensor::empty(*dev_, DType::i32, {N * heads});
  dev_->copy_from_host(gather_qk_, gather.data());
  dev_->copy_from_host(scatter_, scatter.data());
  zero_row_ = Tensor::empty(*dev_, dtype_, {1, hd_});
  dev_->fill(zero_row_, 0.0);
  n_ = N;
}

void HeadNorm::forward(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, Saved& saved) {
  const int64_t heads = nh_ + 2 * kvh_, qk = nh_ + kvh_;
  if (qkv.ndim() != 2 || qkv.dim(1) != heads * hd_) {
    throw std::invalid_argument("HeadNorm::forward: qkv " + qkv.describe() + " is not [N, (NH+2KVH)*hd]");
  }
  const int64_t N = qkv.dim(0);
  prepare(N);
  const Tensor rows = qkv.reshape({N * heads, hd_});
  saved.pre = Tensor::empty(*dev_, dtype_, {N * qk, hd_});
  saved.rstd = Tensor::empty(*dev_, stats_, {N * qk});
  dev_->embedding_forward(saved.pre, gather_qk_, rows, zero_row_, 1);
  // [normed q | normed k | qkv]: the source of the gather back.
  const Tensor table = Tensor::empty(*dev_, dtype_, {N * qk + N * heads, hd_});
  dev_->rmsnorm_forward(table.view(0, {N * nh_, hd_}), saved.rstd.view(0, {N * nh_}), saved.pre.view(0, {N * nh_, hd_}),
                        q_norm, eps_);
  dev_->rmsnorm_forward(table.view(N * nh_ * hd_, {N * kvh_, hd_}), saved.rstd.view(N * nh_, {N * kvh_}),
                        saved.pre.view(N * nh_ * hd_, {N * kvh_, hd_}), k_norm, eps_);
  dev_->copy(table.view(N * qk * hd_, {N * heads, hd_}), rows);
  dev_->embedding_forward(rows, scatter_, table, zero_row_, 1);
}

void HeadNorm::backward(const Tensor& dqkv, const Tensor& dq_norm, const Tensor& dk_norm, const Tensor& q_norm,
                        const Tensor& k_norm, const Saved& saved) {
  const int64_t heads = nh_ + 2 * kvh_, qk = nh_ + kvh_;
  const int64_t N = dqkv.dim(0);
  if (!saved.pre.defined() || saved.pre.dim(0) != N * qk) throw std::logic_error("HeadNorm::backward without its forward");
  prepare(N);
  const Tensor drows = dqkv.reshape({N * heads, hd_});
  const Tensor dnormed = Tensor::empty(*dev_, dtype_, {N * qk, hd_});
  dev_->embedding_forward(dnormed, gather_qk_, drows, zero_row_, 1);
  const Tensor table = Tensor::empty(*dev_, dtype_, {N * qk + N * heads, hd_});
  const Tensor dpre = table.view(0, {N * qk, hd_});
  dev_->fill(dpre, 0.0);
  dev_->rmsnorm_backward(dpre.view(0, {N * nh_, hd_}), dq_norm, dnormed.view(0, {N * nh_, hd_}),
                         saved.pre.view(0, {N * nh_, hd_}), q_norm, saved.rstd.view(0, {N * nh_}));
  dev_->rmsnorm_backward(dpre.view(N * nh_ * hd_, {N * kvh_, hd_}), dk_norm, dnormed.view(N * nh_ * hd_, {N * kvh_, hd_}),
                         saved.pre.view(N * nh_ * hd_, {N * kvh_, hd_}), k_norm, saved.rstd.view(N * nh_, {N * kvh_}));
  dev_->copy(table.view(N * qk * hd_, {N * heads, hd_}), drows);
  dev_->embedding_forward(drows, scatter_, table, zero_row_, 1);
}

}  // namespace ferry::nn
