// The attention kernels ferry ran before the flash kernels (nn/cpu_attention.h): the whole
// [B, NH, T, T] probability tensor is formed and kept. Quadratic in T, simple, and checked
// against finite differences: the reference the flash kernels of every device are tested
// against (values, gradients, grouped-query heads, documents).
#pragma once

#include <cmath>
#include <cstdint>

#include <Eigen/Core>

#include "nn/cpu_kernels.h"

namespace ferry::testing::reference {

using nn::cpu::ConstMatMap;
using nn::cpu::MatMap;
using nn::cpu::RowMat;

// One (batch, head) pair per task. Each writes disjoint slices of out/att (forward) and of
// dqkv (backward), so the tasks never collide. The products inside run single-threaded
// (Eigen does not nest into an active OpenMP region).
// qkv rows hold q (NH heads), then k and v (KVH heads each), hs channels per head; query
// head h attends with key/value head h / (NH / KVH) (grouped-query attention; KVH = NH is
// multi-head attention, the GPT-2 layout [q | k | v] of C each).
// doc_start (nullable, [B*T]): row t of batch b attends to [doc_start[b*T+t], t] only.
template <class T>
void attention_forward(T* out, T* att, const T* qkv, int64_t B, int64_t T_, int64_t C, int64_t NH,
                       int64_t KVH, const int32_t* doc_start = nullptr) {
  const int64_t hs = C / NH, W = (NH + 2 * KVH) * hs, group = NH / KVH;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH, kv = h / group;
    const T* row = qkv + b * T_ * W;
    ConstMatMap<T> Q(row + h * hs, T_, hs, Eigen::OuterStride<>(W));
    ConstMatMap<T> K(row + (NH + kv) * hs, T_, hs, Eigen::OuterStride<>(W));
    ConstMatMap<T> Vm(row + (NH + KVH + kv) * hs, T_, hs, Eigen::OuterStride<>(W));
    MatMap<T> P(att + bh * T_ * T_, T_, T_, Eigen::OuterStride<>(T_));
    P.noalias() = scale * (Q * K.transpose());
    for (int64_t i = 0; i < T_; ++i) {
      // Softmax over the causal prefix [j0, i] (j0 = 0 without documents); Eigen's exp is
      // vectorized, std::exp is not.
      const int64_t j0 = doc_start ? doc_start[b * T_ + i] : 0;
      auto prefix = P.row(i).segment(j0, i + 1 - j0).array();
      prefix = (prefix - prefix.maxCoeff()).exp();
      prefix /= prefix.sum();
      P.row(i).head(j0).setZero();
      P.row(i).tail(T_ - i - 1).setZero();
    }
    MatMap<T> O(out + b * T_ * C + h * hs, T_, hs, Eigen::OuterStride<>(C));
    O.noalias() = P * Vm;
  }
}

// Parallel over (batch, key/value head): the query heads of a group add into the same dK
// and dV, in head order.
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t B, int64_t T_, int64_t C,
                        int64_t NH, int64_t KVH) {
  const int64_t hs = C / NH, W = (NH + 2 * KVH) * hs, group = NH / KVH;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int64_t bk = 0; bk < B * KVH; ++bk) {
    const int64_t b = bk / KVH, kv = bk % KVH;
    const T* row = qkv + b * T_ * W;
    T* drow = dqkv + b * T_ * W;
    ConstMatMap<T> K(row + (NH + kv) * hs, T_, hs, Eigen::OuterStride<>(W));
    ConstMatMap<T> Vm(row + (NH + KVH + kv) * hs, T_, hs, Eigen::OuterStride<>(W));
    MatMap<T> dK(drow + (NH + kv) * hs, T_, hs, Eigen::OuterStride<>(W));
    MatMap<T> dV(drow + (NH + KVH + kv) * hs, T_, hs, Eigen::OuterStride<>(W));
    for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
      ConstMatMap<T> Q(row + h * hs, T_, hs, Eigen::OuterStride<>(W));
      MatMap<T> dQ(drow + h * hs, T_, hs, Eigen::OuterStride<>(W));
      ConstMatMap<T> P(att + (b * NH + h) * T_ * T_, T_, T_, Eigen::OuterStride<>(T_));
      ConstMatMap<T> dO(dout + b * T_ * C + h * hs, T_, hs, Eigen::OuterStride<>(C));
      RowMat<T> dS = dO * Vm.transpose();  // dP, then turned into dS in place
      for (int64_t i = 0; i < T_; ++i) {
        T dot = 0;
        for (int64_t j = 0; j <= i; ++j) dot += P(i, j) * dS(i, j);
        for (int64_t j = 0; j <= i; ++j) dS(i, j) = P(i, j) * (dS(i, j) - dot) * scale;
        for (int64_t j = i + 1; j < T_; ++j) dS(i, j) = 0;
      }
      dV.noalias() += P.transpose() * dO;
      dQ.noalias() += dS * K;
      dK.noalias() += dS.transpose() * Q;
    }
  }
}

}  // namespace ferry::testing::reference
