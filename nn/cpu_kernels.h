// The CPU device's kernels: plain C++ over raw row-major arrays, templated on the element
// type (float for training, double for the gradient checks). OpenMP spreads rows over
// threads. Every reduction runs in a fixed order that does not depend on the thread
// count's scheduling, so two runs of the same config are bit-identical.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <Eigen/Core>

#include "nn/dtype.h"

namespace ferry::nn::cpu {

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MatMap = Eigen::Map<RowMat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using ConstMatMap = Eigen::Map<const RowMat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

// Columns are reduced in blocks of this many so that a row's slice stays in one cache line
// pair while the rows are walked in order.
constexpr int64_t kColumnBlock = 32;

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t N,
                       int64_t T_, int64_t C, int64_t V) {
  for (int64_t n = 0; n < N; ++n) {
    if (tokens[n] < 0 || tokens[n] >= V) {
      throw std::out_of_range("embedding_forward: token " + std::to_string(tokens[n]) +
                              " at position " + std::to_string(n) + " is outside the vocabulary [0, " +
                              std::to_string(V) + ")");
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* e = wte + static_cast<int64_t>(tokens[n]) * C;
    const T* p = wpe + (n % T_) * C;
    T* o = out + n * C;
    for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t N,
                        int64_t T_, int64_t C) {
  // Rows sharing a token add into the same dwte row: kept serial over rows (in order), and
  // parallel over channel blocks, which never collide.
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kColumnBlock) {
    const int64_t c1 = std::min(C, c0 + kColumnBlock);
    for (int64_t n = 0; n < N; ++n) {
      T* e = dwte + static_cast<int64_t>(tokens[n]) * C;
      T* p = dwpe + (n % T_) * C;
      const T* d = dout + n * C;
      for (int64_t c = c0; c < c1; ++c) {
        e[c] += d[c];
        p[c] += d[c];
      }
    }
  }
}

constexpr double kLayerNormEps = 1e-5;

template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int64_t N,
                       int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T m = 0;
    for (int64_t c = 0; c < C; ++c) m += x[c];
    m /= static_cast<T>(C);
    T v = 0;
    for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= static_cast<T>(C);
    const T s = T(1) / std::sqrt(v + static_cast<T>(kLayerNormEps));
    T* o = out + n * C;
    for (int64_t c = 0; c < C; ++c) o[c] = (x[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <class T>
void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w,
                        const T* mean, const T* rstd, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    const T* d = dout + n * C;
    const T m = mean[n], s = rstd[n];
    T dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int64_t c = 0; c < C; ++c) {
      const T norm = (x[c] - m) * s;
      const T dnorm = w[c] * d[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= static_cast<T>(C);
    dnorm_norm_mean /= static_cast<T>(C);
    T* di = dinp + n * C;
    for (int64_t c = 0; c < C; ++c) {
      const T norm = (x[c] - m) * s;
      const T dnorm = w[c] * d[c];
      di[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kColumnBlock) {
    const int64_t c1 = std::min(C, c0 + kColumnBlock);
    for (int64_t n = 0; n < N; ++n) {
      const T* x = inp + n * C;
      const T* d = dout + n * C;
      for (int64_t c = c0; c < c1; ++c) {
        dw[c] += (x[c] - mean[n]) * rstd[n] * d[c];
        db[c] += d[c];
      }
    }
  }
}

template <class T>
void gemm(T* c, const T* a, const T* b, int64_t M, int64_t N, int64_t K, bool ta, bool tb,
          T alpha, T beta) {
  // Row-major A is [M,K], or [K,M] when transposed; likewise B [K,N] or [N,K].
  ConstMatMap<T> A(a, ta ? K : M, ta ? M : K, Eigen::OuterStride<>(ta ? M : K));
  ConstMatMap<T> B(b, tb ? N : K, tb ? K : N, Eigen::OuterStride<>(tb ? K : N));
  MatMap<T> Cm(c, M, N, Eigen::OuterStride<>(N));
  auto run = [&](const auto& opA, const auto& opB) {
    if (beta == T(0)) {
      Cm.noalias() = alpha * (opA * opB);
    } else {
      if (beta != T(1)) Cm *= beta;
      Cm.noalias() += alpha * (opA * opB);
    }
  };
  if (!ta && !tb) run(A, B);
  if (!ta && tb) run(A, B.transpose());
  if (ta && !tb) run(A.transpose(), B);
  if (ta && tb) run(A.transpose(), B.transpose());
}

// gemm on column windows: C is [M,N] with row stride ldc, A [M,K] (or [K,M] when
// transposed) with row stride lda, B contiguous.
template <class T>
void gemm_strided(T* c, int64_t ldc, const T* a, int64_t lda, const T* b, int64_t M, int64_t N, int64_t K, bool ta,
                  bool tb, T alpha, T beta) {
  ConstMatMap<T> A(a, ta ? K : M, ta ? M : K, Eigen::OuterStride<>(lda));
  ConstMatMap<T> B(b, tb ? N : K, tb ? K : N, Eigen::OuterStride<>(tb ? K : N));
  MatMap<T> Cm(c, M, N, Eigen::OuterStride<>(ldc));
  auto run = [&](const auto& opA, const auto& opB) {
    if (beta == T(0)) {
      Cm.noalias() = alpha * (opA * opB);
    } else {
      if (beta != T(1)) Cm *= beta;
      Cm.noalias() += alpha * (opA * opB);
    }
  };
  if (!ta && !tb) run(A, B);
  if (!ta && tb) run(A, B.transpose());
  if (ta && !tb) run(A.transpose(), B);
  if (ta && tb) run(A.transpose(), B.transpose());
}

template <class T>
void add_bias(T* out, const T* bias, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    T* o = out + n * C;
    for (int64_t c = 0; c < C; ++c) o[c] += bias[c];
  }
}

template <class T>
void bias_backward(T* dbias, const T* dout, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kColumnBlock) {
    const int64_t c1 = std::min(C, c0 + kColumnBlock);
    for (int64_t n = 0; n < N; ++n) {
      const T* d = dout + n * C;
      for (int64_t c = c0; c < c1; ++c) dbias[c] += d[c];
    }
  }
}

// GELU works on chunks through Eigen array expressions: Eigen's tanh is vectorized
// (std::tanh is a scalar libm call, which made GELU a quarter of a tiny model's step).
constexpr int64_t kElementChunk = 4096;
constexpr double kGeluK = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluC = 0.044715;

template <class T>
void gelu_forward(T* out, const T* inp, int64_t N) {
  using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
#pragma omp parallel for schedule(static)
  for (int64_t i0 = 0; i0 < N; i0 += kElementChunk) {
    const int64_t n = std::min(kElementChunk, N - i0);
    Eigen::Map<const Arr> x(inp + i0, n);
    Eigen::Map<Arr> y(out + i0, n);
    y = T(0.5) * x * (T(1) + (T(kGeluK) * (x + T(kGeluC) * x.cube())).tanh());
  }
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t N) {
  using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
#pragma omp parallel for schedule(static)
  for (int64_t i0 = 0; i0 < N; i0 += kElementChunk) {
    const int64_t n = std::min(kElementChunk, N - i0);
    Eigen::Map<const Arr> x(inp + i0, n), d(dout + i0, n);
    Eigen::Map<Arr> dx(dinp + i0, n);
    const Arr th = (T(kGeluK) * (x + T(kGeluC) * x.cube())).tanh();
    dx += d * (T(0.5) * (T(1) + th) +
               T(0.5) * x * (T(1) - th.square()) * T(kGeluK) * (T(1) + T(3 * kGeluC) * x.square()));
  }
}

template <class T>
void softmax_cross_entropy_forward(T* losses, T* probs, const T* logits, const int32_t* targets,
                                   int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] != kIgnoreTarget && (targets[n] < 0 || targets[n] >= V)) {
      throw std::out_of_range("softmax_cross_entropy: target " + std::to_string(targets[n]) +
                              " at row " + std::to_string(n) + " is outside [0, " +
                              std::to_string(V) + ")");
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * V;
    T* p = probs + n * V;
    using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
    Eigen::Map<const Arr> lr(l, V);
    Eigen::Map<Arr> pr(p, V);
    const T mx = lr.maxCoeff();
    pr = (lr - mx).exp();
    const T sum = pr.sum();
    pr /= sum;
    // log-sum-exp form: exact even where probs[target] underflows.
    losses[n] = targets[n] == kIgnoreTarget ? T(0) : std::log(sum) - (l[targets[n]] - mx);
  }
}

template <class T>
void softmax_cross_entropy_backward(T* dlogits, const T* probs, const int32_t* targets,
                                    int64_t N, int64_t V, T dloss) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == kIgnoreTarget) continue;
    T* d = dlogits + n * V;
    const T* p = probs + n * V;
    for (int64_t v = 0; v < V; ++v) d[v] += dloss * p[v];
    d[targets[n]] -= dloss;
  }
}

}  // namespace ferry::nn::cpu
