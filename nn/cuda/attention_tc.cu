// Attention on tensor cores (wmma, bf16/f16 activations, f32 statistics): the kernels of
// nn/cuda/attention_wmma.cuh's layout and the two launch paths the attention launchers hand
// over to once use_tensor_cores (nn/cuda/attention.cuh) has said yes, and the check that
// says why they cannot run (tensor_core_attention_obstacle, nn/cuda_kernels.h). A file of
// its own: the SIMT and tensor-core instantiations compile side by side.
#include "nn/cuda/attention.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

// Forward: one block per (query rows, head, batch), largest first.
template <class S>
__global__ void flash_forward_tc_kernel(Arr out, Operand<float, float> lse, const S* qkv, AttnShape s,
                                        const int32_t* doc_start) {
#if FERRY_TC_ARCH
  FERRY_TC_SHARED(smem);
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows = warps * kTcRowsPerWarp, hs = static_cast<int>(s.hs), hp = static_cast<int>(tc_pad(s.hs));
  const TcPitch P = tc_pitch(hp);
  const TcForwardLayout L = tc_forward_layout(warps, hp, sizeof(S));
  S* qs = reinterpret_cast<S*>(smem + L.q);
  S* ks = reinterpret_cast<S*>(smem + L.k);
  S* vs = reinterpret_cast<S*>(smem + L.v);
  float* sw = reinterpret_cast<float*>(smem + L.s) + warp * kTcRowsPerWarp * P.lds;
  S* pw = reinterpret_cast<S*>(smem + L.p) + warp * kTcRowsPerWarp * P.ldp;
  float* ow = reinterpret_cast<float*>(smem + L.o) + warp * kTcRowsPerWarp * P.ldf;
  float* mw = reinterpret_cast<float*>(smem + L.stats) + warp * kTcRowsPerWarp * 3;
  float* lw = mw + kTcRowsPerWarp;
  float* aw = lw + kTcRowsPerWarp;
  const int64_t i0 = (gridDim.x - 1 - blockIdx.x) * int64_t{rows}, h = blockIdx.y, b = blockIdx.z;
  const int64_t kv = h / s.group, iw = i0 + warp * kTcRowsPerWarp;
  const float scale = 1.0f / sqrt(static_cast<float>(s.hs));
  tc_load_rows(qs, P.ld, qkv, b * s.T, i0, rows, s.T, s.W, h * s.hs, hs, hp);
  for (int e = lane; e < kTcRowsPerWarp * P.ldf; e += 32) ow[e] = 0;
  if (lane < kTcRowsPerWarp) {
    mw[lane] = -INFINITY;
    lw[lane] = 0;
  }
  int64_t lo = i0;
  for (int r = 0; r < rows && i0 + r < s.T; ++r) lo = imin(lo, first_key(doc_start, b, s.T, i0 + r));
  const int64_t hi = imin(i0 + rows, s.T);
  const int r = lane >> 1, half = lane & 1;  // this lane's row and half of the tile in the softmax
  const int64_t i = iw + r;
  const int64_t start = i < s.T ? first_key(doc_start, b, s.T, i) : s.T;
  for (int64_t j0 = lo; j0 < hi; j0 += kTcTile) {
    __syncthreads();  // every warp is done with the previous tile
    tc_load_rows(ks, P.ld, qkv, b * s.T, j0, kTcTile, s.T, s.W, (s.NH + kv) * s.hs, hs, hp);
    tc_load_rows(vs, P.ld, qkv, b * s.T, j0, kTcTile, s.T, s.W, (s.NH + s.KVH + kv) * s.hs, hs, hp);
    __syncthreads();
    // Warp-uniform: rows all past T or all before the tile see none of it.
    if (iw >= s.T || iw + kTcRowsPerWarp - 1 < j0) continue;
    tc_rows_times_tile_t(sw, P.lds, qs + warp * kTcRowsPerWarp * P.ld, ks, P.ld, hp);
    __syncwarp();
    float* srow = sw + r * P.lds + half * 32;
    float mx = -INFINITY;
    for (int c = 0; c < 32; ++c) {
      const int64_t j = j0 + half * 32 + c;
      const float v = i < s.T && j >= start && j <= i ? srow[c] * scale : -INFINITY;
      srow[c] = v;
      mx = v > mx ? v : mx;
    }
    const float other = __shfl_xor_sync(0xffffffffu, mx, 1);
    mx = other > mx ? other : mx;
    const float mold = mw[r];
    const float mnew = mx > mold ? mx : mold;
    const float alpha = mnew == -INFINITY ? 1.0f : exp(mold - mnew);
    float sum = 0;
    S* prow = pw + r * P.ldp + half * 32;
    for (int c = 0; c < 32; ++c) {
      const float p = srow[c] == -INFINITY ? 0.0f : exp(srow[c] - mnew);
      prow[c] = Narrow<S>::to(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    __syncwarp();  // both lanes of a row have read its running max
    if (half == 0) {
      mw[r] = mnew;
      lw[r] = lw[r] * alpha + sum;
      aw[r] = alpha;
    }
    __syncwarp();
    for (int rr = 0; rr < kTcRowsPerWarp; ++rr) {
      const float a = aw[rr];
      for (int d = lane; d < hp; d += 32) ow[rr * P.ldf + d] *= a;
    }
    __syncwarp();
    tc_accumulate(ow, P.ldf, pw, P.ldp, vs, P.ld, hp);
    __syncwarp();
  }
  __syncwarp();
  for (int rr = 0; rr < kTcRowsPerWarp && iw + rr < s.T; ++rr) {
    const float l = lw[rr];
    for (int d = lane; d < hs; d += 32) st<float>(out, (b * s.T + iw + rr) * s.C + h * s.hs + d, ow[rr * P.ldf + d] / l);
    if (lane == 0) lse.set((b * s.NH + h) * s.T + iw + rr, mw[rr] + log(l));
  }
#else
  __trap();
#endif
}

// Backward, dK and dV: one block per (key rows, key/value head, batch). Over the group's
// query heads in order and the query tiles from the block's first key on: S^T = K Q^T,
// dP^T = V dO^T, p = exp(scale s - lse), ds = p (dp - D) scale; dV += P^T dO, dK += dS^T Q.
template <class S>
__global__ void flash_backward_kv_tc_kernel(Arr dqkv, const S* dout, const S* qkv, const float* lse, const float* D,
                                            AttnShape s, const int32_t* doc_start) {
#if FERRY_TC_ARCH
  FERRY_TC_SHARED(smem);
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows = warps * kTcRowsPerWarp, hs = static_cast<int>(s.hs), hp = static_cast<int>(tc_pad(s.hs));
  const TcPitch P = tc_pitch(hp);
  const int wrow = warp * kTcRowsPerWarp;
  const TcBackwardSmem<S> m(smem, tc_backward_layout(true, warps, hp, sizeof(S)), P, wrow);
  S *kb = m.own0, *vb = m.own1, *qs = m.oth0, *gs = m.oth1, *pw = m.p, *dsw = m.ds;
  float *sw = m.s, *dpw = m.dp, *dkw = m.acc0, *dvw = m.acc1;
  float* Ls = m.rowstats;
  float* Ds = Ls + kTcTile;
  int64_t* starts = reinterpret_cast<int64_t*>(Ds + kTcTile);
  const int64_t j0 = blockIdx.x * int64_t{rows}, kv = blockIdx.y, b = blockIdx.z, jw = j0 + wrow;
  const float scale = 1.0f / sqrt(static_cast<float>(s.hs));
  tc_load_rows(kb, P.ld, qkv, b * s.T, j0, rows, s.T, s.W, (s.NH + kv) * s.hs, hs, hp);
  tc_load_rows(vb, P.ld, qkv, b * s.T, j0, rows, s.T, s.W, (s.NH + s.KVH + kv) * s.hs, hs, hp);
  for (int e = lane; e < kTcRowsPerWarp * P.ldf; e += 32) dkw[e] = dvw[e] = 0;
  const int r = lane >> 1, half = lane & 1;
  const int64_t j = jw + r;
  for (int64_t h = kv * s.group; h < (kv + 1) * s.group; ++h) {
    for (int64_t i0 = j0; i0 < s.T; i0 += kTcTile) {
      __syncthreads();
      tc_load_rows(qs, P.ld, qkv, b * s.T, i0, kTcTile, s.T, s.W, h * s.hs, hs, hp);
      tc_load_rows(gs, P.ld, dout, b * s.T, i0, kTcTile, s.T, s.C, h * s.hs, hs, hp);
      for (int t = threadIdx.x; t < kTcTile; t += blockDim.x) {
        const int64_t i = i0 + t;
        const bool in = i < s.T;
        Ls[t] = in ? lse[(b * s.NH + h) * s.T + i] : 0.0f;
        Ds[t] = in ? D[(b * s.NH + h) * s.T + i] : 0.0f;
        starts[t] = in ? first_key(doc_start, b, s.T, i) : s.T;
      }
      __syncthreads();
      if (jw >= s.T || i0 + kTcTile - 1 < jw) continue;  // warp-uniform: no key of the warp is seen
      tc_rows_times_tile_t(sw, P.lds, kb + wrow * P.ld, qs, P.ld, hp);
      tc_rows_times_tile_t(dpw, P.lds, vb + wrow * P.ld, gs, P.ld, hp);
      __syncwarp();
      for (int c = 0; c < 32; ++c) {
        const int q = half * 32 + c;
        const int64_t i = i0 + q;
        const bool visible = i < s.T && j < s.T && j >= starts[q] && j <= i;
        const float p = visible ? exp(sw[r * P.lds + q] * scale - Ls[q]) : 0.0f;
        pw[r * P.ldp + q] = Narrow<S>::to(p);
        dsw[r * P.ldp + q] = Narrow<S>::to(p * (dpw[r * P.lds + q] - Ds[q]) * scale);
      }
      __syncwarp();
      tc_accumulate(dvw, P.ldf, pw, P.ldp, gs, P.ld, hp);
      tc_accumulate(dkw, P.ldf, dsw, P.ldp, qs, P.ld, hp);
      __syncwarp();
    }
  }
  __syncwarp();
  tc_add_rows(dqkv, dkw, P.ldf, jw, s.T, b * s.T, s.W, (s.NH + kv) * s.hs, hs);
  tc_add_rows(dqkv, dvw, P.ldf, jw, s.T, b * s.T, s.W, (s.NH + s.KVH + kv) * s.hs, hs);
#else
  __trap();
#endif
}

// Backward, dQ: one block per (query rows, head, batch), largest first: S = Q K^T,
// dP = dO V^T, ds as above; dQ += dS K.
template <class S>
__global__ void flash_backward_q_tc_kernel(Arr dqkv, const S* dout, const S* qkv, const float* lse, const float* D,
                                           AttnShape s, const int32_t* doc_start) {
#if FERRY_TC_ARCH
  FERRY_TC_SHARED(smem);
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows = warps * kTcRowsPerWarp, hs = static_cast<int>(s.hs), hp = static_cast<int>(tc_pad(s.hs));
  const TcPitch P = tc_pitch(hp);
  const int wrow = warp * kTcRowsPerWarp;
  const TcBackwardSmem<S> m(smem, tc_backward_layout(false, warps, hp, sizeof(S)), P, wrow);
  S *qt = m.own0, *gt = m.own1, *ks = m.oth0, *vs = m.oth1, *dsw = m.ds;
  float *sw = m.s, *dpw = m.dp, *dqw = m.acc0;
  const int64_t i0 = (gridDim.x - 1 - blockIdx.x) * int64_t{rows}, h = blockIdx.y, b = blockIdx.z;
  const int64_t kv = h / s.group, iw = i0 + wrow;
  const float scale = 1.0f / sqrt(static_cast<float>(s.hs));
  tc_load_rows(qt, P.ld, qkv, b * s.T, i0, rows, s.T, s.W, h * s.hs, hs, hp);
  tc_load_rows(gt, P.ld, dout, b * s.T, i0, rows, s.T, s.C, h * s.hs, hs, hp);
  for (int e = lane; e < kTcRowsPerWarp * P.ldf; e += 32) dqw[e] = 0;
  int64_t lo = i0;
  for (int rr = 0; rr < rows && i0 + rr < s.T; ++rr) lo = imin(lo, first_key(doc_start, b, s.T, i0 + rr));
  const int64_t hi = imin(i0 + rows, s.T);
  const int r = lane >> 1, half = lane & 1;
  const int64_t i = iw + r;
  const bool in = i < s.T;
  const int64_t start = in ? first_key(doc_start, b, s.T, i) : s.T;
  const float Li = in ? lse[(b * s.NH + h) * s.T + i] : 0.0f;
  const float Di = in ? D[(b * s.NH + h) * s.T + i] : 0.0f;
  for (int64_t j0 = lo; j0 < hi; j0 += kTcTile) {
    __syncthreads();
    tc_load_rows(ks, P.ld, qkv, b * s.T, j0, kTcTile, s.T, s.W, (s.NH + kv) * s.hs, hs, hp);
    tc_load_rows(vs, P.ld, qkv, b * s.T, j0, kTcTile, s.T, s.W, (s.NH + s.KVH + kv) * s.hs, hs, hp);
    __syncthreads();
    if (iw >= s.T || iw + kTcRowsPerWarp - 1 < j0) continue;
    tc_rows_times_tile_t(sw, P.lds, qt + wrow * P.ld, ks, P.ld, hp);
    tc_rows_times_tile_t(dpw, P.lds, gt + wrow * P.ld, vs, P.ld, hp);
    __syncwarp();
    for (int c = 0; c < 32; ++c) {
      const int q = half * 32 + c;
      const int64_t j = j0 + q;
      const bool visible = in && j >= start && j <= i;
      const float p = visible ? exp(sw[r * P.lds + q] * scale - Li) : 0.0f;
      dsw[r * P.ldp + q] = Narrow<S>::to(p * (dpw[r * P.lds + q] - Di) * scale);
    }
    __syncwarp();
    tc_accumulate(dqw, P.ldf, dsw, P.ldp, ks, P.ld, hp);
    __syncwarp();
  }
  __syncwarp();
  tc_add_rows(dqkv, dqw, P.ldf, iw, s.T, b * s.T, s.W, h * s.hs, hs);
#else
  __trap();  // unreachable: the launcher asks for 8.0 code (tensor_core_attention_obstacle)
#endif
}

}  // namespace

const char* tensor_core_attention_obstacle(DType act, DType stats, int64_t hs) {
  if (act != DType::bf16 && act != DType::f16) return "bf16 or f16 activations";
  if (stats != DType::f32) return "f32 statistics";
  if (tc_pad(hs) > kTcMaxHead) return "a head size of at most 128";
  if (compute_major() < 8) return "a GPU of compute capability 8.0 or above";
  // A build for older GPUs (CMAKE_CUDA_ARCHITECTURES below 80) compiles the kernels' bodies
  // out; run through the PTX JIT on a newer GPU they would trap: what runs here must be 8.0 code.
  cudaFuncAttributes attr{};
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&attr, flash_forward_tc_kernel<__nv_bfloat16>));
  if (attr.ptxVersion < 80) return "a build with kernels for compute capability 8.0 or above (CMAKE_CUDA_ARCHITECTURES)";
  for (TcPass p : {TcPass::forward, TcPass::kv, TcPass::q}) {
    if (tc_warps(p, hs) == 0) return "more shared memory per block than this GPU has";
  }
  return nullptr;
}

namespace detail {

void attention_forward_tc(cudaStream_t st, Arr out, Arr lse, Arr qkv, const AttnShape& sh, int64_t B,
                          const int32_t* doc_start) {
  by_half(qkv.dtype, [&](auto tag) {
    using S = decltype(tag);
    auto& k = flash_forward_tc_kernel<S>;
    const int w = tc_warps(TcPass::forward, sh.hs), tc_rows = w * kTcRowsPerWarp;
    const SharedFit fit =
        fit_shared(k, static_cast<size_t>(tc_shared_bytes(TcPass::forward, w, sh.hs)), "attention_forward", sh);
    opt_in_shared(k, fit);
    const dim3 grid(static_cast<unsigned>((sh.T + tc_rows - 1) / tc_rows), static_cast<unsigned>(sh.NH),
                    static_cast<unsigned>(B));
    FERRY_LAUNCH(k, grid, w * 32, fit.dynamic, st, out, Operand<float, float>(lse),
                 static_cast<const S*>(qkv.p), sh, doc_start);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void attention_backward_tc(cudaStream_t st, Arr dqkv, Arr dout, Arr qkv, Arr out, Arr lse, const AttnShape& sh,
                           int64_t B, const int32_t* doc_start, void* rowdot) {
  by_half(qkv.dtype, [&](auto tag) {
    using S = decltype(tag);
    using X = Operand<float, S>;
    auto& kv_kernel = flash_backward_kv_tc_kernel<S>;
    auto& q_kernel = flash_backward_q_tc_kernel<S>;
    const int w_kv = tc_warps(TcPass::kv, sh.hs), w_q = tc_warps(TcPass::q, sh.hs);
    // Both checked before the first launch: a failure leaves dqkv untouched.
    const SharedFit fit_kv = fit_shared(kv_kernel, static_cast<size_t>(tc_shared_bytes(TcPass::kv, w_kv, sh.hs)),
                                        "attention_backward", sh);
    const SharedFit fit_q = fit_shared(q_kernel, static_cast<size_t>(tc_shared_bytes(TcPass::q, w_q, sh.hs)),
                                       "attention_backward", sh);
    opt_in_shared(kv_kernel, fit_kv);
    opt_in_shared(q_kernel, fit_q);
    float* D = static_cast<float*>(rowdot);
    launch_rowdot<float, X>(st, D, dout, out, sh, B);
    auto tiles = [&sh](int w) { return static_cast<unsigned>((sh.T + w * kTcRowsPerWarp - 1) / (w * kTcRowsPerWarp)); };
    const S* q = static_cast<const S*>(qkv.p);
    const S* g = static_cast<const S*>(dout.p);
    const float* L = static_cast<const float*>(lse.p);
    FERRY_LAUNCH(kv_kernel, dim3(tiles(w_kv), static_cast<unsigned>(sh.KVH), static_cast<unsigned>(B)), w_kv * 32,
                 fit_kv.dynamic, st, dqkv, g, q, L, static_cast<const float*>(D), sh, doc_start);
    FERRY_CUDA_CHECK_LAUNCH();
    FERRY_LAUNCH(q_kernel, dim3(tiles(w_q), static_cast<unsigned>(sh.NH), static_cast<unsigned>(B)), w_q * 32,
                 fit_q.dynamic, st, dqkv, g, q, L, static_cast<const float*>(D), sh, doc_start);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

}  // namespace detail
FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
