// Attention backward (Device::attention_backward): D = rowsum(dO * O), then FlashAttention-2's
// two passes (dK and dV per key tile, dQ per query tile), in SIMT form for every dtype; where
// tensor cores can run (attention.cuh: use_tensor_cores) the launcher hands over to
// nn/cuda/attention_tc.cu.
#include "nn/cuda/attention.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

// Backward, dK and dV: one block per (key tile, key/value head, batch); each warp owns
// kRowsPerWarp keys and each lane a query of the current query tile. Over the group's query
// heads in order and the query tiles from the block's first key on: p = exp(scale q k - lse),
// ds = p (dO v - D) scale; dV += p dO, dK += ds q. Each key row is written once.
template <class A, class X, class Y, int P>
__global__ void flash_backward_kv_kernel(Arr dqkv, X dout, X qkv, Y lse, const A* D, AttnShape s,
                                         const int32_t* doc_start) {
  FERRY_DYNAMIC_SHARED(smem_raw);
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows = warps * kRowsPerWarp;  // keys per block
  const int pitch = static_cast<int>(s.hs) + 1, hs = static_cast<int>(s.hs);
  A* kt = reinterpret_cast<A*>(smem_raw);  // [rows][hs]   this block's keys
  A* vt = kt + rows * s.hs;                // [rows][hs]
  A* qs = vt + rows * s.hs;                // [kTile][hs + 1] the query tile
  A* gs = qs + kTile * pitch;                 // [kTile][hs + 1] its dO
  A* ps = gs + kTile * pitch;                 // [warps][kRowsPerWarp][kTile] p, then ds
  A* dss = ps + warps * kRowsPerWarp * kTile;
  const int64_t j0 = blockIdx.x * int64_t{rows}, kv = blockIdx.y, b = blockIdx.z;
  const A scale = A(1) / sqrt(static_cast<A>(s.hs));
  load_tile<A>(kt, static_cast<int>(s.hs), qkv, b * s.T, j0, rows, s.T, s.W, (s.NH + kv) * s.hs, s.hs);
  load_tile<A>(vt, static_cast<int>(s.hs), qkv, b * s.T, j0, rows, s.T, s.W, (s.NH + s.KVH + kv) * s.hs, s.hs);
  A gk[kRowsPerWarp][P], gv[kRowsPerWarp][P];
FERRY_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr)
FERRY_UNROLL
    for (int k = 0; k < P; ++k) gk[rr][k] = gv[rr][k] = 0;
  A* wp = ps + warp * kRowsPerWarp * kTile;
  A* wd = dss + warp * kRowsPerWarp * kTile;
  const A* k0 = kt + warp * kRowsPerWarp * s.hs;
  const A* v0 = vt + warp * kRowsPerWarp * s.hs;
  const int64_t jlast = imin(j0 + rows, s.T) - 1;
  for (int64_t h = kv * s.group; h < (kv + 1) * s.group; ++h) {
    for (int64_t i0 = j0 / kTile * kTile; i0 < s.T; i0 += kTile) {
      __syncthreads();  // the previous query tile has been read by every warp
      load_tile<A>(qs, pitch, qkv, b * s.T, i0, kTile, s.T, s.W, h * s.hs, s.hs);
      load_tile<A>(gs, pitch, dout, b * s.T, i0, kTile, s.T, s.C, h * s.hs, s.hs);
      __syncthreads();
      const int64_t i = i0 + lane;
      const bool in = i < s.T;
      const int64_t start = in ? first_key(doc_start, b, s.T, i) : s.T;
      const A L = in ? lse[(b * s.NH + h) * s.T + i] : A(0);
      const A Di = in ? D[(b * s.NH + h) * s.T + i] : A(0);
      A sc[kRowsPerWarp], dp[kRowsPerWarp];
FERRY_UNROLL
      for (int rr = 0; rr < kRowsPerWarp; ++rr) sc[rr] = dp[rr] = 0;
      const A* qrow = qs + lane * pitch;
      const A* grow = gs + lane * pitch;
      for (int d = 0; d < hs; ++d) {
        const A qd = qrow[d], gd = grow[d];
FERRY_UNROLL
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
          sc[rr] += qd * k0[rr * hs + d];
          dp[rr] += gd * v0[rr * hs + d];
        }
      }
FERRY_UNROLL
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const int64_t j = j0 + warp * kRowsPerWarp + rr;
        const bool visible = in && j <= jlast && j >= start && j <= i;
        const A p = visible ? exp(sc[rr] * scale - L) : A(0);
        wp[rr * kTile + lane] = p;
        wd[rr * kTile + lane] = p * (dp[rr] - Di) * scale;
      }
      __syncwarp();
      for (int c = 0; c < kTile; ++c) {
        A p[kRowsPerWarp], ds[kRowsPerWarp];
FERRY_UNROLL
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
          p[rr] = wp[rr * kTile + c];
          ds[rr] = wd[rr * kTile + c];
        }
FERRY_UNROLL
        for (int k = 0; k < P; ++k) {
          const int d = lane + 32 * k;
          if (d < hs) {
            const A qd = qs[c * pitch + d], gd = gs[c * pitch + d];
FERRY_UNROLL
            for (int rr = 0; rr < kRowsPerWarp; ++rr) {
              gv[rr][k] += p[rr] * gd;
              gk[rr][k] += ds[rr] * qd;
            }
          }
        }
      }
      __syncwarp();
    }
  }
FERRY_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t j = j0 + warp * kRowsPerWarp + rr;
    if (j >= s.T) continue;
FERRY_UNROLL
    for (int k = 0; k < P; ++k) {
      const int d = lane + 32 * k;
      if (d >= hs) continue;
      const int64_t k_at = (b * s.T + j) * s.W + (s.NH + kv) * s.hs + d;
      const int64_t v_at = (b * s.T + j) * s.W + (s.NH + s.KVH + kv) * s.hs + d;
      st<A>(dqkv, k_at, ld<A>(dqkv, k_at) + gk[rr][k]);
      st<A>(dqkv, v_at, ld<A>(dqkv, v_at) + gv[rr][k]);
    }
  }
}

// Backward, dQ: one block per (query tile, head, batch), largest first; each warp owns
// kRowsPerWarp queries and each lane a key of the current key tile: dQ += ds k.
template <class A, class X, class Y, int P>
__global__ void flash_backward_q_kernel(Arr dqkv, X dout, X qkv, Y lse, const A* D, AttnShape s,
                                        const int32_t* doc_start) {
  FERRY_DYNAMIC_SHARED(smem_raw);
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows = warps * kRowsPerWarp;
  const int pitch = static_cast<int>(s.hs) + 1, hs = static_cast<int>(s.hs);
  A* qt = reinterpret_cast<A*>(smem_raw);  // [rows][hs]
  A* gt = qt + rows * s.hs;                // [rows][hs]  dO
  A* ks = gt + rows * s.hs;                // [kTile][hs + 1]
  A* vs = ks + kTile * pitch;                 // [kTile][hs + 1]
  A* dss = vs + kTile * pitch;                // [warps][kRowsPerWarp][kTile]
  const int64_t tiles = gridDim.x;
  const int64_t i0 = (tiles - 1 - blockIdx.x) * rows, h = blockIdx.y, b = blockIdx.z, kv = h / s.group;
  const A scale = A(1) / sqrt(static_cast<A>(s.hs));
  load_tile<A>(qt, static_cast<int>(s.hs), qkv, b * s.T, i0, rows, s.T, s.W, h * s.hs, s.hs);
  load_tile<A>(gt, static_cast<int>(s.hs), dout, b * s.T, i0, rows, s.T, s.C, h * s.hs, s.hs);
  int64_t lo = i0;
  for (int r = 0; r < rows && i0 + r < s.T; ++r) lo = imin(lo, first_key(doc_start, b, s.T, i0 + r));
  const int64_t hi = imin(i0 + rows, s.T);
  A g[kRowsPerWarp][P], L[kRowsPerWarp], Di[kRowsPerWarp];
  int64_t start[kRowsPerWarp];
FERRY_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    const bool in = i < s.T;
    start[rr] = in ? first_key(doc_start, b, s.T, i) : s.T;
    L[rr] = in ? lse[(b * s.NH + h) * s.T + i] : A(0);
    Di[rr] = in ? D[(b * s.NH + h) * s.T + i] : A(0);
FERRY_UNROLL
    for (int k = 0; k < P; ++k) g[rr][k] = 0;
  }
  A* wd = dss + warp * kRowsPerWarp * kTile;
  const A* q0 = qt + warp * kRowsPerWarp * s.hs;
  const A* g0 = gt + warp * kRowsPerWarp * s.hs;
  for (int64_t j0 = lo / kTile * kTile; j0 < hi; j0 += kTile) {
    __syncthreads();
    load_tile<A>(ks, pitch, qkv, b * s.T, j0, kTile, s.T, s.W, (s.NH + kv) * s.hs, s.hs);
    load_tile<A>(vs, pitch, qkv, b * s.T, j0, kTile, s.T, s.W, (s.NH + s.KVH + kv) * s.hs, s.hs);
    __syncthreads();
    A sc[kRowsPerWarp], dp[kRowsPerWarp];
FERRY_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) sc[rr] = dp[rr] = 0;
    const A* krow = ks + lane * pitch;
    const A* vrow = vs + lane * pitch;
    for (int d = 0; d < hs; ++d) {
      const A kd = krow[d], vd = vrow[d];
FERRY_UNROLL
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        sc[rr] += q0[rr * hs + d] * kd;
        dp[rr] += g0[rr * hs + d] * vd;
      }
    }
    const int64_t j = j0 + lane;
FERRY_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t i = i0 + warp * kRowsPerWarp + rr;
      const bool visible = i < s.T && j >= start[rr] && j <= i;
      const A p = visible ? exp(sc[rr] * scale - L[rr]) : A(0);
      wd[rr * kTile + lane] = p * (dp[rr] - Di[rr]) * scale;
    }
    __syncwarp();
    for (int c = 0; c < kTile; ++c) {
      A ds[kRowsPerWarp];
FERRY_UNROLL
      for (int rr = 0; rr < kRowsPerWarp; ++rr) ds[rr] = wd[rr * kTile + c];
FERRY_UNROLL
      for (int k = 0; k < P; ++k) {
        const int d = lane + 32 * k;
        if (d < hs) {
          const A kd = ks[c * pitch + d];
FERRY_UNROLL
          for (int rr = 0; rr < kRowsPerWarp; ++rr) g[rr][k] += ds[rr] * kd;
        }
      }
    }
    __syncwarp();
  }
FERRY_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    if (i >= s.T) continue;
FERRY_UNROLL
    for (int k = 0; k < P; ++k) {
      const int d = lane + 32 * k;
      if (d >= hs) continue;
      const int64_t at = (b * s.T + i) * s.W + h * s.hs + d;
      st<A>(dqkv, at, ld<A>(dqkv, at) + g[rr][k]);
    }
  }
}

}  // namespace

void attention_backward(Stream s, Arr dqkv, Arr dout, Arr qkv, Arr out, Arr lse, int64_t B, int64_t T,
                        int64_t C, int64_t NH, int64_t KVH, const int32_t* doc_start, void* rowdot,
                        AttentionKernel kernel) {
  if (B * T == 0) return;
  const AttnShape sh = attn_shape(T, C, NH, KVH);
  const int threads = attn_threads(), warps = threads / 32, rows = warps * kRowsPerWarp;
  const AttnPath path = attention_path(kernel, {qkv, dout, out}, lse, sh.hs, "attention_backward");
  if (path == AttnPath::mma) {
    attention_backward_mma(as_stream(s), dqkv, dout, qkv, out, lse, sh, B, doc_start, rowdot);
    return;
  }
  if (path == AttnPath::wmma) {
    attention_backward_tc(as_stream(s), dqkv, dout, qkv, out, lse, sh, B, doc_start, rowdot);
    return;
  }
  by_acc(wide(dqkv, dout, qkv, out, lse), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({qkv, dout, out}, {lse}, [&](auto x, auto y) {
      using X = Operand<A, typename decltype(x)::type>;
      using Y = Operand<A, typename decltype(y)::type>;
      A* D = static_cast<A*>(rowdot);
      by_lanes(sh.hs, [&](auto lanes) {
        constexpr int P = decltype(lanes)::value;
        auto& kv_kernel = flash_backward_kv_kernel<A, X, Y, P>;
        auto& q_kernel = flash_backward_q_kernel<A, X, Y, P>;
        // Both checked before the first launch: a failure leaves dqkv untouched.
        const SharedFit fit_kv = fit_shared(
            kv_kernel, static_cast<size_t>(backward_kv_shared(warps, sh.hs)) * sizeof(A), "attention_backward", sh);
        const SharedFit fit_q = fit_shared(
            q_kernel, static_cast<size_t>(backward_q_shared(warps, sh.hs)) * sizeof(A), "attention_backward", sh);
        opt_in_shared(kv_kernel, fit_kv);
        opt_in_shared(q_kernel, fit_q);
        launch_rowdot<A, X>(as_stream(s), D, dout, out, sh, B);
        const unsigned tiles = static_cast<unsigned>((T + rows - 1) / rows);
        FERRY_LAUNCH(kv_kernel, dim3(tiles, static_cast<unsigned>(KVH), static_cast<unsigned>(B)), threads,
                     fit_kv.dynamic, as_stream(s), dqkv, X(dout), X(qkv), Y(lse), D, sh, doc_start);
        FERRY_CUDA_CHECK_LAUNCH();
        FERRY_LAUNCH(q_kernel, dim3(tiles, static_cast<unsigned>(NH), static_cast<unsigned>(B)), threads,
                     fit_q.dynamic, as_stream(s), dqkv, X(dout), X(qkv), Y(lse), D, sh, doc_start);
      });
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
