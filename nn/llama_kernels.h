// CPU kernels of the Llama-style layers: RMSNorm, SwiGLU and rotary position embeddings,
// forward and backward, templated on the element type like cpu_kernels.h (float for
// training, double for the gradient checks). Row-parallel with OpenMP; reductions over a
// row run in a fixed order, and the weight gradient of RMSNorm is reduced over rows in
// order per column block, so results do not depend on the thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <Eigen/Core>

#include "nn/cpu_kernels.h"
#include "nn/rope.h"

namespace ferry::nn::cpu {

// out[n,c] = inp[n,c] * rstd[n] * w[c], rstd[n] = 1 / sqrt(mean_c inp[n,c]^2 + eps).
template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* w, int64_t N, int64_t C, double eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += x[c] * x[c];
    const T r = T(1) / std::sqrt(ss / static_cast<T>(C) + static_cast<T>(eps));
    T* o = out + n * C;
    for (int64_t c = 0; c < C; ++c) o[c] = x[c] * r * w[c];
    rstd[n] = r;
  }
}

// dinp += r w d - x r^3 / C * sum_c(w d x); dw += sum_n x r d.
template <class T>
void rmsnorm_backward(T* dinp, T* dw, const T* dout, const T* inp, const T* w, const T* rstd, int64_t N,
                      int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    const T* d = dout + n * C;
    const T r = rstd[n];
    T wdx = 0;
    for (int64_t c = 0; c < C; ++c) wdx += w[c] * d[c] * x[c];
    const T k = r * r * r * wdx / static_cast<T>(C);
    T* di = dinp + n * C;
    for (int64_t c = 0; c < C; ++c) di[c] += r * w[c] * d[c] - x[c] * k;
  }
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kColumnBlock) {
    const int64_t c1 = std::min(C, c0 + kColumnBlock);
    for (int64_t n = 0; n < N; ++n) {
      const T* x = inp + n * C;
      const T* d = dout + n * C;
      for (int64_t c = c0; c < c1; ++c) dw[c] += x[c] * rstd[n] * d[c];
    }
  }
}

// SwiGLU's exponentials are Eigen's vectorized exp (pexp: AVX-512 here, within an ulp or
// two of std::exp), not libm's scalar expf: per element that was most of both kernels, 4-6%
// of a LoRA step on two cores (docs/design/measured.md). Every element goes through the
// same vector function (a row's tail padded into one packet), so its value depends on its
// inputs alone: never on N, H, its position, its address or the threads.
namespace swiglu_detail {
constexpr int64_t kChunk = 256;  // elements of sigmoid(g) kept on the stack at a time

// s[i] = 1 / (1 + exp(-g[i])) for i < m <= kChunk.
template <class T>
inline void sigmoid(const T* g, T* s, int64_t m) {
  using namespace Eigen::internal;
  using P = typename packet_traits<T>::type;
  constexpr int64_t L = packet_traits<T>::size;
  const P one = pset1<P>(T(1));
  const auto f = [&](const P& x) { return pdiv(one, padd(one, pexp(pnegate(x)))); };
  int64_t i = 0;
  for (; i + L <= m; i += L) pstoreu(s + i, f(ploadu<P>(g + i)));
  if (i < m) {
    T buf[L] = {};
    std::copy(g + i, g + m, buf);
    pstoreu(buf, f(ploadu<P>(buf)));
    std::copy(buf, buf + (m - i), s + i);
  }
}
}  // namespace swiglu_detail

// gate_up[N, 2H] holds gate | up per row; out[N, H] = silu(gate) * up.
template <class T>
void swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t H) {
  using swiglu_detail::kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    T s[kChunk];
    for (int64_t h0 = 0; h0 < H; h0 += kChunk) {
      const int64_t m = std::min(kChunk, H - h0);
      const T* g = gate_up + n * 2 * H + h0;
      const T* u = g + H;
      T* o = out + n * H + h0;
      swiglu_detail::sigmoid(g, s, m);
      for (int64_t h = 0; h < m; ++h) o[h] = g[h] * s[h] * u[h];
    }
  }
}

// dgate += d up s (1 + g (1 - s)), dup += d g s, s = sigmoid(g).
template <class T>
void swiglu_backward(T* dgate_up, const T* gate_up, const T* dout, int64_t N, int64_t H) {
  using swiglu_detail::kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    T s[kChunk];
    for (int64_t h0 = 0; h0 < H; h0 += kChunk) {
      const int64_t m = std::min(kChunk, H - h0);
      const T* g = gate_up + n * 2 * H + h0;
      const T* u = g + H;
      const T* d = dout + n * H + h0;
      T* dg = dgate_up + n * 2 * H + h0;
      T* du = dg + H;
      swiglu_detail::sigmoid(g, s, m);
      for (int64_t h = 0; h < m; ++h) {
        dg[h] += d[h] * u[h] * s[h] * (T(1) + g[h] * (T(1) - s[h]));
        du[h] += d[h] * g[h] * s[h];
      }
    }
  }
}

// Rotary position embedding (the Hugging Face Llama convention: the two halves of each
// head are rotated together): for row n (position n % T), head h, i < hd/2, angle
// a = pos * rope.inv_freq(i, hd) (theta^(-2i/hd) unless scaled): out[i] = x[i] cos a - x[i+hd/2] sin a,
// out[i+hd/2] = x[i+hd/2] cos a + x[i] sin a. Rows of `width` >= heads * hd elements:
// the columns past the rotated heads (v in a qkv row) pass through unchanged. In place is
// allowed. inverse = true rotates by -a: the backward pass (dinp += R^T dout).
template <class T>
void rope_apply(T* out, const T* inp, int64_t N, int64_t T_, int64_t heads, int64_t hd, int64_t width, const Rope& rope,
                bool inverse, bool accumulate) {
  const int64_t half = hd / 2;
  // The angles depend only on (position, i): computed once per call for the T positions,
  // not for every row of the batch (the same expressions, so the same values).
  std::vector<T> cos_t(static_cast<size_t>(T_ * half)), sin_t(static_cast<size_t>(T_ * half));
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T_; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(t) * rope.inv_freq(i, hd);
      cos_t[static_cast<size_t>(t * half + i)] = static_cast<T>(std::cos(a));
      sin_t[static_cast<size_t>(t * half + i)] = static_cast<T>(inverse ? -std::sin(a) : std::sin(a));
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = heads * hd; c < width; ++c) {
      if (accumulate) {
        out[n * width + c] += inp[n * width + c];
      } else if (out != inp) {
        out[n * width + c] = inp[n * width + c];
      }
    }
    const T* cos_row = cos_t.data() + (n % T_) * half;
    const T* sin_row = sin_t.data() + (n % T_) * half;
    for (int64_t i = 0; i < half; ++i) {
      const T c = cos_row[i], s = sin_row[i];
      for (int64_t h = 0; h < heads; ++h) {
        const T* x = inp + n * width + h * hd;
        T* o = out + n * width + h * hd;
        const T x1 = x[i], x2 = x[i + half];
        const T y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
        if (accumulate) {
          o[i] += y1;
          o[i + half] += y2;
        } else {
          o[i] = y1;
          o[i + half] = y2;
        }
      }
    }
  }
}

}  // namespace ferry::nn::cpu
