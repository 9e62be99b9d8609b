// The CPU device's attention: FlashAttention-2's algorithm over row-major arrays, so no
// [T, T] tensor exists at any point. Memory: per thread one query tile, one key/value tile
// and a kQueryTile x kKeyTile score tile (about 80 KB at head size 64: L2-resident); per
// call, backward adds one value per (batch, head, position).
//
// Forward, per (batch, head, query tile): the tile's scores against each key tile in the
// causal (and document) range are made with one small GEMM, turned into probabilities with
// an online softmax (running max m and sum l per row; the partial output rescaled by
// exp(m_old - m_new) when the max grows), and multiplied into the output with a second GEMM.
// lse = m + log(l) is kept per row.
// Backward recomputes P = exp(scale q k^T - lse) tile by tile, with D = rowsum(dO * O):
//   pass 1, per (batch, key/value head, key tile), over the group's query heads in order:
//     dV += P^T dO, dS = P * (dO V^T - D) * scale, dK += dS^T Q;
//   pass 2, per (batch, head, query tile): dQ += dS K.
// Each output tile is written by exactly one task in a fixed order (no atomics, no
// reduction across threads), so results are bit-identical whatever the thread count.
// Pass 2 recomputes S and dP: seven tile GEMMs per pair of tiles instead of FlashAttention-2's
// five, the price of determinism without atomics.
// Element types: float and double (the device widens bf16/f16 to f32 around the call).
// Tasks are spread over OpenMP threads with dynamic scheduling (causal tiles differ in work);
// Eigen runs single-threaded inside them (it does not nest into an active parallel region).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <Eigen/Core>

#include "nn/cpu_kernels.h"

namespace ferry::nn::cpu {

constexpr int64_t kQueryTile = 64;
constexpr int64_t kKeyTile = 64;

namespace flash {

// The row-major matrix and strided-map types of the other CPU kernels (nn/cpu_kernels.h).
template <class T>
using Mat = RowMat<T>;
template <class T>
using Map = MatMap<T>;
template <class T>
using CMap = ConstMatMap<T>;

struct Shape {
  int64_t B, T, C, NH, KVH, hs, W, group;
  Shape(int64_t b, int64_t t, int64_t c, int64_t nh, int64_t kvh)
      : B(b), T(t), C(c), NH(nh), KVH(kvh), hs(c / nh), W((nh + 2 * kvh) * (c / nh)), group(nh / kvh) {}
};

// The first key row i may see: its document's start (0 without documents).
inline int64_t first_key(const int32_t* doc_start, int64_t b, int64_t T, int64_t i) {
  return doc_start ? doc_start[b * T + i] : 0;
}

// The key range [lo, hi) that rows [i0, i0 + rows) of batch b see, together.
inline std::pair<int64_t, int64_t> key_range(const int32_t* doc_start, int64_t b, int64_t T, int64_t i0,
                                             int64_t rows) {
  int64_t lo = i0;
  for (int64_t r = 0; r < rows; ++r) lo = std::min(lo, first_key(doc_start, b, T, i0 + r));
  return {lo, i0 + rows};
}

// P[r, c] = exp(S[r, c] - lse_r) where key j0 + c is visible to query i0 + r, else 0.
template <class T>
void probabilities(Mat<T>& S, int64_t rows, int64_t cols, int64_t i0, int64_t j0, const T* lse,
                   const int32_t* doc_start, int64_t b, int64_t Tn) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    const int64_t lo = std::clamp<int64_t>(first_key(doc_start, b, Tn, i) - j0, 0, cols);
    const int64_t hi = std::clamp<int64_t>(i + 1 - j0, 0, cols);
    auto row = S.row(r);
    if (hi > lo) row.segment(lo, hi - lo) = (row.segment(lo, hi - lo).array() - lse[r]).exp().matrix();
    row.head(lo).setZero();
    if (hi < cols) row.segment(std::max(hi, lo), cols - std::max(hi, lo)).setZero();
  }
}

// Backward's recomputation for a query tile (Q, dO: rows x hs) against a key tile (K, V:
// cols x hs), into the top-left rows x cols of P and dS: P = exp(scale q k^T - lse) where
// visible, dS = P * (dO v^T - D) * scale.
template <class T>
void recompute(Mat<T>& P, Mat<T>& dS, const CMap<T>& Q, const CMap<T>& K, const CMap<T>& V, const CMap<T>& dO,
               const T* lse, const T* D, T scale, int64_t i0, int64_t j0, const int32_t* doc_start, int64_t b,
               int64_t Tn) {
  const int64_t rows = Q.rows(), cols = K.rows();
  auto Pt = P.topLeftCorner(rows, cols);
  Pt.noalias() = scale * (Q * K.transpose());
  probabilities(P, rows, cols, i0, j0, lse, doc_start, b, Tn);
  auto dSt = dS.topLeftCorner(rows, cols);
  dSt.noalias() = dO * V.transpose();
  for (int64_t r = 0; r < rows; ++r)
    dSt.row(r) = (Pt.row(r).array() * (dSt.row(r).array() - D[r]) * scale).matrix();
}

}  // namespace flash

// out[B,T,C], lse[B,NH,T] from qkv[B,T,W]; doc_start nullable ([B*T], each in [0, t]).
template <class T>
void flash_attention_forward(T* out, T* lse, const T* qkv, int64_t B, int64_t T_, int64_t C, int64_t NH,
                             int64_t KVH, const int32_t* doc_start) {
  using namespace flash;
  const Shape s(B, T_, C, NH, KVH);
  const T scale = T(1) / std::sqrt(static_cast<T>(s.hs));
  const int64_t tiles = (T_ + kQueryTile - 1) / kQueryTile;
#pragma omp parallel
  {
    Mat<T> S(kQueryTile, kKeyTile), O(kQueryTile, s.hs);
    std::vector<T> m(kQueryTile), l(kQueryTile);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < B * NH * tiles; ++task) {
      // Largest tiles first: with causal masking the last query tiles have the most keys.
      const int64_t qt = tiles - 1 - task % tiles, bh = task / tiles, b = bh / NH, h = bh % NH, kv = h / s.group;
      const int64_t i0 = qt * kQueryTile, rows = std::min(kQueryTile, T_ - i0);
      const T* base = qkv + b * T_ * s.W;
      CMap<T> Q(base + i0 * s.W + h * s.hs, rows, s.hs, Eigen::OuterStride<>(s.W));
      O.topRows(rows).setZero();
      std::fill(m.begin(), m.end(), -std::numeric_limits<T>::infinity());
      std::fill(l.begin(), l.end(), T(0));
      const auto [lo, hi] = key_range(doc_start, b, T_, i0, rows);
      for (int64_t j0 = lo; j0 < hi; j0 += kKeyTile) {
        const int64_t cols = std::min(kKeyTile, hi - j0);
        CMap<T> K(base + j0 * s.W + (NH + kv) * s.hs, cols, s.hs, Eigen::OuterStride<>(s.W));
        CMap<T> V(base + j0 * s.W + (NH + KVH + kv) * s.hs, cols, s.hs, Eigen::OuterStride<>(s.W));
        auto St = S.topLeftCorner(rows, cols);
        St.noalias() = Q * K.transpose();
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          const int64_t a = std::clamp<int64_t>(first_key(doc_start, b, T_, i) - j0, 0, cols);
          const int64_t e = std::clamp<int64_t>(i + 1 - j0, 0, cols);
          auto row = St.row(r);
          if (e <= a) {  // no visible key in this tile: the row's state is unchanged
            row.setZero();
            continue;
          }
          auto seg = row.segment(a, e - a).array();
          seg *= scale;
          const T mx = std::max(m[r], seg.maxCoeff());
          const T alpha = std::exp(m[r] - mx);  // 0 on the first visible tile (m = -inf)
          seg = (seg - mx).exp();
          l[r] = l[r] * alpha + seg.sum();
          m[r] = mx;
          row.head(a).setZero();
          row.tail(cols - e).setZero();
          O.row(r) *= alpha;
        }
        O.topRows(rows).noalias() += St * V;
      }
      Map<T> Out(out + (b * T_ + i0) * C + h * s.hs, rows, s.hs, Eigen::OuterStride<>(C));
      T* L = lse + (b * NH + h) * T_ + i0;
      for (int64_t r = 0; r < rows; ++r) {
        Out.row(r) = O.row(r) / l[r];
        L[r] = m[r] + std::log(l[r]);
      }
    }
  }
}

// dqkv += d(attention)/d(qkv) . dout; out and lse from the forward.
template <class T>
void flash_attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse, int64_t B,
                              int64_t T_, int64_t C, int64_t NH, int64_t KVH, const int32_t* doc_start) {
  using namespace flash;
  const Shape s(B, T_, C, NH, KVH);
  const T scale = T(1) / std::sqrt(static_cast<T>(s.hs));
  // D = rowsum(dO * O) per (batch, head, position).
  std::vector<T> D(static_cast<size_t>(B * NH * T_));
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    const int64_t b = bt / T_, t = bt % T_;
    for (int64_t h = 0; h < NH; ++h) {
      const T* o = out + bt * C + h * s.hs;
      const T* g = dout + bt * C + h * s.hs;
      T acc = 0;
      for (int64_t d = 0; d < s.hs; ++d) acc += o[d] * g[d];
      D[static_cast<size_t>((b * NH + h) * T_ + t)] = acc;
    }
  }
  const int64_t qtiles = (T_ + kQueryTile - 1) / kQueryTile, ktiles = (T_ + kKeyTile - 1) / kKeyTile;
  // Pass 1: dK, dV per key tile.
#pragma omp parallel
  {
    Mat<T> P(kQueryTile, kKeyTile), dS(kQueryTile, kKeyTile), dK(kKeyTile, s.hs), dV(kKeyTile, s.hs);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < B * KVH * ktiles; ++task) {
      const int64_t kt = task % ktiles, bk = task / ktiles, b = bk / KVH, kv = bk % KVH;
      const int64_t j0 = kt * kKeyTile, cols = std::min(kKeyTile, T_ - j0);
      const T* base = qkv + b * T_ * s.W;
      CMap<T> K(base + j0 * s.W + (NH + kv) * s.hs, cols, s.hs, Eigen::OuterStride<>(s.W));
      CMap<T> V(base + j0 * s.W + (NH + KVH + kv) * s.hs, cols, s.hs, Eigen::OuterStride<>(s.W));
      dK.topRows(cols).setZero();
      dV.topRows(cols).setZero();
      for (int64_t h = kv * s.group; h < (kv + 1) * s.group; ++h) {
        for (int64_t i0 = j0 / kQueryTile * kQueryTile; i0 < T_; i0 += kQueryTile) {
          const int64_t rows = std::min(kQueryTile, T_ - i0);
          // Skip query tiles that see none of these keys (documents that start after them).
          if (key_range(doc_start, b, T_, i0, rows).first >= j0 + cols) continue;
          CMap<T> Q(base + i0 * s.W + h * s.hs, rows, s.hs, Eigen::OuterStride<>(s.W));
          CMap<T> dO(dout + (b * T_ + i0) * C + h * s.hs, rows, s.hs, Eigen::OuterStride<>(C));
          const T* L = lse + (b * NH + h) * T_ + i0;
          const T* Dr = D.data() + (b * NH + h) * T_ + i0;
          recompute(P, dS, Q, K, V, dO, L, Dr, scale, i0, j0, doc_start, b, T_);
          auto Pt = P.topLeftCorner(rows, cols);
          auto dSt = dS.topLeftCorner(rows, cols);
          dV.topRows(cols).noalias() += Pt.transpose() * dO;
          dK.topRows(cols).noalias() += dSt.transpose() * Q;
        }
      }
      Map<T> gK(dqkv + (b * T_ + j0) * s.W + (NH + kv) * s.hs, cols, s.hs, Eigen::OuterStride<>(s.W));
      Map<T> gV(dqkv + (b * T_ + j0) * s.W + (NH + KVH + kv) * s.hs, cols, s.hs, Eigen::OuterStride<>(s.W));
      gK += dK.topRows(cols);
      gV += dV.topRows(cols);
    }
  }
  // Pass 2: dQ per query tile.
#pragma omp parallel
  {
    Mat<T> P(kQueryTile, kKeyTile), dS(kQueryTile, kKeyTile), dQ(kQueryTile, s.hs);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < B * NH * qtiles; ++task) {
      const int64_t qt = qtiles - 1 - task % qtiles, bh = task / qtiles, b = bh / NH, h = bh % NH, kv = h / s.group;
      const int64_t i0 = qt * kQueryTile, rows = std::min(kQueryTile, T_ - i0);
      const T* base = qkv + b * T_ * s.W;
      CMap<T> Q(base + i0 * s.W + h * s.hs, rows, s.hs, Eigen::OuterStride<>(s.W));
      CMap<T> dO(dout + (b * T_ + i0) * C + h * s.hs, rows, s.hs, Eigen::OuterStride<>(C));
      const T* L = lse + (b * NH + h) * T_ + i0;
      const T* Dr = D.data() + (b * NH + h) * T_ + i0;
      dQ.topRows(rows).setZero();
      const auto [lo, hi] = key_range(doc_start, b, T_, i0, rows);
      // Key tiles aligned as in pass 1, so each (query, key) pair is cut the same way.
      for (int64_t j0 = lo / kKeyTile * kKeyTile; j0 < hi; j0 += kKeyTile) {
        const int64_t cols = std::min(kKeyTile, T_ - j0);
        CMap<T> K(base + j0 * s.W + (NH + kv) * s.hs, cols, s.hs, Eigen::OuterStride<>(s.W));
        CMap<T> V(base + j0 * s.W + (NH + KVH + kv) * s.hs, cols, s.hs, Eigen::OuterStride<>(s.W));
        recompute(P, dS, Q, K, V, dO, L, Dr, scale, i0, j0, doc_start, b, T_);
        dQ.topRows(rows).noalias() += dS.topLeftCorner(rows, cols) * K;
      }
      Map<T> gQ(dqkv + (b * T_ + i0) * s.W + h * s.hs, rows, s.hs, Eigen::OuterStride<>(s.W));
      gQ += dQ.topRows(rows);
    }
  }
}

}  // namespace ferry::nn::cpu
