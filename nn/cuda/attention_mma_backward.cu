// Attention v2 backward on mma.sync (nn/cuda/attention_mma.cuh has the layout): the SIMT and
// wmma kernels' three passes (D = rowsum(dO * O); dK and dV per key rows; dQ per query
// rows) with every product an mma m16n8k16 and the scores, probabilities, dS and the
// gradient rows in registers.
#include "nn/cuda/attention_mma.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

// dK and dV: one block per (key rows, key/value head, batch). Per warp (16 keys) and query
// tile of the group's heads in order, from the block's first key on: S^T = K Q^T, dP^T =
// V dO^T, P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - D) scale; dV += P^T dO, dK +=
// dS^T Q with P^T and dS^T from registers. The next tile's Q, dO (cp.async) and its lse, D
// and document starts (plain loads) fill the other buffers meanwhile.
template <class S, int HS>
__global__ void flash_backward_kv_mma_kernel(Arr dqkv, const S* dout, const S* qkv, const float* lse, const float* D,
                                             AttnShape s, const int32_t* doc_start) {
#if FERRY_TC_ARCH
  FERRY_TC_SHARED(smem);
  constexpr int N = kMmaBackwardTile<HS>, P = kMmaPitch<HS>;
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int rows = warps * kMmaRowsPerWarp;
  S* ks = reinterpret_cast<S*>(smem);
  S* vs = ks + rows * P;
  S* tiles = vs + rows * P;
  auto qbuf = [&](int k) { return tiles + k * N * P; };
  auto gbuf = [&](int k) { return tiles + (2 + k) * N * P; };
  float* stats = reinterpret_cast<float*>(tiles + 4 * N * P);  // per buffer: lse[N], D[N], starts[N]
  auto lbuf = [&](int k) { return stats + k * 3 * N; };
  auto dbuf = [&](int k) { return stats + k * 3 * N + N; };
  auto sbuf = [&](int k) { return reinterpret_cast<int32_t*>(stats + k * 3 * N + 2 * N); };
  const int64_t j0 = blockIdx.x * int64_t{rows}, kv = blockIdx.y, b = blockIdx.z;
  const int64_t jw = j0 + warp * kMmaRowsPerWarp;
  const float scale = 1.0f / sqrtf(static_cast<float>(HS)), scale2 = scale * kLog2e;
  mma_load_rows<S, HS>(ks, qkv, b * s.T, j0, rows, s.T, s.W, (s.NH + kv) * HS);
  mma_load_rows<S, HS>(vs, qkv, b * s.T, j0, rows, s.T, s.W, (s.NH + s.KVH + kv) * HS);
  const int per_head = static_cast<int>((s.T - j0 + N - 1) / N), total = per_head * static_cast<int>(s.group);
  // Tile `it`: query head kv group + it / per_head, queries from j0 + (it % per_head) N.
  auto head_of = [&](int it) { return kv * s.group + it / per_head; };
  auto first_of = [&](int it) { return j0 + int64_t{it % per_head} * N; };
  auto load = [&](int it) {
    const int k = it & 1;
    const int64_t h = head_of(it), i0 = first_of(it);
    mma_load_rows<S, HS>(qbuf(k), qkv, b * s.T, i0, N, s.T, s.W, h * HS);
    mma_load_rows<S, HS>(gbuf(k), dout, b * s.T, i0, N, s.T, s.C, h * HS);
    for (int c = threadIdx.x; c < N; c += blockDim.x) {
      const int64_t i = i0 + c;
      const bool in = i < s.T;
      lbuf(k)[c] = in ? lse[(b * s.NH + h) * s.T + i] : 0.0f;
      dbuf(k)[c] = in ? D[(b * s.NH + h) * s.T + i] : 0.0f;
      sbuf(k)[c] = static_cast<int32_t>(in ? first_key(doc_start, b, s.T, i) : s.T);
    }
  };
  load(0);
  cp_async_commit();
  const int64_t key[2] = {jw + g, jw + g + 8};
  const bool live = jw < s.T;  // warp-uniform
  float dk[HS / 8][4], dv[HS / 8][4];
  mma_zero<HS / 8>(dk);
  mma_zero<HS / 8>(dv);
  for (int it = 0; it < total; ++it) {
    cp_async_wait<0>();
    __syncthreads();  // tile `it` landed for every thread; every warp is done with the other buffers
    if (it + 1 < total) {
      load(it + 1);
      cp_async_commit();
    }
    const int64_t i0 = first_of(it);
    if (!live || i0 + N - 1 < jw) continue;  // warp-uniform: every query before every key
    const int k = it & 1;
    const S* qb = qbuf(k);
    const S* gb = gbuf(k);
    const float* L = lbuf(k);
    const float* Dt = dbuf(k);
    const int32_t* starts = sbuf(k);
    float sc[N / 8][4], dp[N / 8][4];
    mma_zero<N / 8>(sc);
    mma_zero<N / 8>(dp);
    mma_rows_times_tile_t<S, HS, N>(
        sc, [&](uint32_t(&a)[4], int kk) { mma_load_a<S, HS>(a, ks + warp * kMmaRowsPerWarp * P, kk * 16); }, qb);
    mma_rows_times_tile_t<S, HS, N>(
        dp, [&](uint32_t(&a)[4], int kk) { mma_load_a<S, HS>(a, vs + warp * kMmaRowsPerWarp * P, kk * 16); }, gb);
    // Masked where a query may precede a key of the warp, where queries pass T, or with documents.
    const bool edge = doc_start != nullptr || i0 < jw + kMmaRowsPerWarp - 1 || i0 + N > s.T;
    FERRY_UNROLL
    for (int n = 0; n < N / 8; ++n) {
      FERRY_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int q = n * 8 + 2 * t + (e & 1);
        const int64_t i = i0 + q, j = key[e >> 1];
        const bool visible = !edge || (i < s.T && j <= i && j >= starts[q]);
        const float p = visible ? exp2f(sc[n][e] * scale2 - L[q] * kLog2e) : 0.0f;
        sc[n][e] = p;
        dp[n][e] = p * (dp[n][e] - Dt[q]) * scale;
      }
    }
    mma_p_times_tile<S, HS, N>(dv, sc, gb);
    mma_p_times_tile<S, HS, N>(dk, dp, qb);
  }
  if (!live) return;
  mma_add_rows<HS>(dqkv, dk, jw, s.T, b * s.T, s.W, (s.NH + kv) * HS);
  mma_add_rows<HS>(dqkv, dv, jw, s.T, b * s.T, s.W, (s.NH + s.KVH + kv) * HS);
#else
  __trap();  // unreachable: the launcher asks for 8.0 code (mma_attention_obstacle)
#endif
}

// dQ: one block per (query rows, head, batch), the last rows first. Per warp (16 queries)
// and key tile: S = Q K^T, dP = dO V^T, dS = P (dP - D) scale, dQ += dS K.
template <class S, int HS>
__global__ void flash_backward_q_mma_kernel(Arr dqkv, const S* dout, const S* qkv, const float* lse, const float* D,
                                            AttnShape s, const int32_t* doc_start) {
#if FERRY_TC_ARCH
  FERRY_TC_SHARED(smem);
  constexpr int N = kMmaBackwardTile<HS>, P = kMmaPitch<HS>;
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int rows = warps * kMmaRowsPerWarp;
  S* qs = reinterpret_cast<S*>(smem);
  S* gs = qs + rows * P;
  S* tiles = gs + rows * P;
  auto kbuf = [&](int k) { return tiles + k * N * P; };
  auto vbuf = [&](int k) { return tiles + (2 + k) * N * P; };
  const int64_t i0 = (gridDim.x - 1 - blockIdx.x) * int64_t{rows}, h = blockIdx.y, b = blockIdx.z;
  const int64_t kv = h / s.group, iw = i0 + warp * kMmaRowsPerWarp;
  const int64_t kcol = (s.NH + kv) * HS, vcol = (s.NH + s.KVH + kv) * HS;
  const float scale = 1.0f / sqrtf(static_cast<float>(HS)), scale2 = scale * kLog2e;
  mma_load_rows<S, HS>(qs, qkv, b * s.T, i0, rows, s.T, s.W, h * HS);
  mma_load_rows<S, HS>(gs, dout, b * s.T, i0, rows, s.T, s.C, h * HS);
  int64_t lo = i0;
  for (int r = 0; r < rows && i0 + r < s.T; ++r) lo = imin(lo, first_key(doc_start, b, s.T, i0 + r));
  const int64_t hi = imin(i0 + rows, s.T);
  const int tiles_n = static_cast<int>((hi - lo + N - 1) / N);
  mma_load_rows<S, HS>(kbuf(0), qkv, b * s.T, lo, N, s.T, s.W, kcol);
  mma_load_rows<S, HS>(vbuf(0), qkv, b * s.T, lo, N, s.T, s.W, vcol);
  cp_async_commit();
  const int64_t row[2] = {iw + g, iw + g + 8};
  int64_t start[2];
  float Li[2], Di[2];
  FERRY_UNROLL
  for (int r = 0; r < 2; ++r) {
    const bool in = row[r] < s.T;
    start[r] = in ? first_key(doc_start, b, s.T, row[r]) : s.T;
    Li[r] = in ? lse[(b * s.NH + h) * s.T + row[r]] * kLog2e : 0.0f;
    Di[r] = in ? D[(b * s.NH + h) * s.T + row[r]] : 0.0f;
  }
  int smin = static_cast<int>(imin(start[0], start[1]));
  int smax = static_cast<int>(row[0] < s.T ? start[0] : 0);
  if (row[1] < s.T && start[1] > smax) smax = static_cast<int>(start[1]);
  for (int o = 16; o > 0; o >>= 1) {
    const int a = __shfl_xor_sync(0xffffffffu, smin, o), c = __shfl_xor_sync(0xffffffffu, smax, o);
    smin = a < smin ? a : smin;
    smax = c > smax ? c : smax;
  }
  const bool live = iw < s.T;  // warp-uniform
  float dq[HS / 8][4];
  mma_zero<HS / 8>(dq);
  for (int it = 0; it < tiles_n; ++it) {
    const int64_t j0 = lo + int64_t{it} * N;
    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < tiles_n) {
      const int nb = (it + 1) & 1;
      mma_load_rows<S, HS>(kbuf(nb), qkv, b * s.T, j0 + N, N, s.T, s.W, kcol);
      mma_load_rows<S, HS>(vbuf(nb), qkv, b * s.T, j0 + N, N, s.T, s.W, vcol);
      cp_async_commit();
    }
    if (!live || iw + kMmaRowsPerWarp - 1 < j0 || j0 + N <= smin) continue;
    float sc[N / 8][4], dp[N / 8][4];
    mma_zero<N / 8>(sc);
    mma_zero<N / 8>(dp);
    mma_rows_times_tile_t<S, HS, N>(
        sc, [&](uint32_t(&a)[4], int kk) { mma_load_a<S, HS>(a, qs + warp * kMmaRowsPerWarp * P, kk * 16); },
        kbuf(it & 1));
    mma_rows_times_tile_t<S, HS, N>(
        dp, [&](uint32_t(&a)[4], int kk) { mma_load_a<S, HS>(a, gs + warp * kMmaRowsPerWarp * P, kk * 16); },
        vbuf(it & 1));
    const bool edge = j0 + N - 1 > iw || j0 < smax;
    FERRY_UNROLL
    for (int n = 0; n < N / 8; ++n) {
      FERRY_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int64_t j = j0 + n * 8 + 2 * t + (e & 1);
        const bool visible = !edge || (row[r] < s.T && j <= row[r] && j >= start[r]);
        const float p = visible ? exp2f(sc[n][e] * scale2 - Li[r]) : 0.0f;
        dp[n][e] = p * (dp[n][e] - Di[r]) * scale;
      }
    }
    mma_p_times_tile<S, HS, N>(dq, dp, kbuf(it & 1));
  }
  if (!live) return;
  mma_add_rows<HS>(dqkv, dq, iw, s.T, b * s.T, s.W, h * HS);
#else
  __trap();
#endif
}

}  // namespace

namespace detail {

void attention_backward_mma(cudaStream_t st, Arr dqkv, Arr dout, Arr qkv, Arr out, Arr lse, const AttnShape& sh,
                            int64_t B, const int32_t* doc_start, void* rowdot) {
  by_half(qkv.dtype, [&](auto tag) {
    using S = decltype(tag);
    using X = Operand<float, S>;
    by_mma_head(sh.hs, [&](auto head) {
      constexpr int HS = decltype(head)::value;
      auto& kv_kernel = flash_backward_kv_mma_kernel<S, HS>;
      auto& q_kernel = flash_backward_q_mma_kernel<S, HS>;
      const int w_kv = mma_warps(MmaPass::kv, HS), w_q = mma_warps(MmaPass::q, HS);
      // Both checked before the first launch: a failure leaves dqkv untouched.
      const SharedFit fit_kv = fit_shared(kv_kernel, static_cast<size_t>(mma_shared_bytes(MmaPass::kv, w_kv, HS)),
                                          "attention_backward", sh);
      const SharedFit fit_q = fit_shared(q_kernel, static_cast<size_t>(mma_shared_bytes(MmaPass::q, w_q, HS)),
                                         "attention_backward", sh);
      opt_in_shared(kv_kernel, fit_kv);
      opt_in_shared(q_kernel, fit_q);
      float* Dp = static_cast<float*>(rowdot);
      launch_rowdot<float, X>(st, Dp, dout, out, sh, B);
      auto blocks = [&sh](int w) {
        return static_cast<unsigned>((sh.T + w * kMmaRowsPerWarp - 1) / (w * kMmaRowsPerWarp));
      };
      const S* q = static_cast<const S*>(qkv.p);
      const S* g = static_cast<const S*>(dout.p);
      const float* L = static_cast<const float*>(lse.p);
      FERRY_LAUNCH(kv_kernel, dim3(blocks(w_kv), static_cast<unsigned>(sh.KVH), static_cast<unsigned>(B)), w_kv * 32,
                   fit_kv.dynamic, st, dqkv, g, q, L, static_cast<const float*>(Dp), sh, doc_start);
      FERRY_CUDA_CHECK_LAUNCH();
      FERRY_LAUNCH(q_kernel, dim3(blocks(w_q), static_cast<unsigned>(sh.NH), static_cast<unsigned>(B)), w_q * 32,
                   fit_q.dynamic, st, dqkv, g, q, L, static_cast<const float*>(Dp), sh, doc_start);
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

}  // namespace detail
FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
