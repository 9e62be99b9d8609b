// Attention v2 forward on mma.sync (nn/cuda/attention_mma.cuh has the layout): FlashAttention-2's
// forward with the scores, probabilities and output rows in registers, and the check that
// says why the mma kernels cannot run (mma_attention_obstacle, nn/cuda_kernels.h).
#include "nn/cuda/attention_mma.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

// One block per (query rows, head, batch), the last rows (most key tiles) first. Per warp
// and key tile: S = Q K^T (Q's fragments loaded once), the causal and document mask on the
// tiles that need it, the online softmax per row (each row's 16 scores of a lane, then the
// 4 lanes of the row by shuffles), O = O alpha + P V with P from S's registers. The next
// tile's K and V load by cp.async while this one is computed.
template <class S, int HS>
__global__ void flash_forward_mma_kernel(S* out, float* lse, const S* qkv, AttnShape s, const int32_t* doc_start) {
#if FERRY_TC_ARCH
  FERRY_TC_SHARED(smem);
  constexpr int N = kMmaForwardTile, P = kMmaPitch<HS>;
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int rows = warps * kMmaRowsPerWarp;
  S* qs = reinterpret_cast<S*>(smem);
  // Buffer k of K at qs + (rows + k N) P, of V at qs + (rows + (2 + k) N) P: arithmetic, not
  // an array of pointers (indexed by the tile's parity it would live on the stack).
  auto kbuf = [&](int k) { return qs + (rows + k * N) * P; };
  auto vbuf = [&](int k) { return qs + (rows + (2 + k) * N) * P; };
  const int64_t i0 = (gridDim.x - 1 - blockIdx.x) * int64_t{rows}, h = blockIdx.y, b = blockIdx.z;
  const int64_t kv = h / s.group, iw = i0 + warp * kMmaRowsPerWarp;
  const int64_t kcol = (s.NH + kv) * HS, vcol = (s.NH + s.KVH + kv) * HS;
  const float scale = 1.0f / sqrtf(static_cast<float>(HS)), scale2 = scale * kLog2e;
  mma_load_rows<S, HS>(qs, qkv, b * s.T, i0, rows, s.T, s.W, h * HS);
  int64_t lo = i0;
  for (int r = 0; r < rows && i0 + r < s.T; ++r) lo = imin(lo, first_key(doc_start, b, s.T, i0 + r));
  const int64_t hi = imin(i0 + rows, s.T);
  const int tiles = static_cast<int>((hi - lo + N - 1) / N);
  mma_load_rows<S, HS>(kbuf(0), qkv, b * s.T, lo, N, s.T, s.W, kcol);
  mma_load_rows<S, HS>(vbuf(0), qkv, b * s.T, lo, N, s.T, s.W, vcol);
  cp_async_commit();
  // This lane's two rows (g and g + 8 of the warp's 16), their first visible keys, and the
  // warp's smallest and largest first key (warp-uniform: which tiles it skips or masks).
  const int64_t row[2] = {iw + g, iw + g + 8};
  int64_t start[2];
  FERRY_UNROLL
  for (int r = 0; r < 2; ++r) start[r] = row[r] < s.T ? first_key(doc_start, b, s.T, row[r]) : s.T;
  // Rows past T count as starting at T for the smallest, at 0 for the largest.
  int smin = static_cast<int>(imin(start[0], start[1]));
  int smax = static_cast<int>(row[0] < s.T ? start[0] : 0);
  if (row[1] < s.T && start[1] > smax) smax = static_cast<int>(start[1]);
  for (int o = 16; o > 0; o >>= 1) {
    const int a = __shfl_xor_sync(0xffffffffu, smin, o), c = __shfl_xor_sync(0xffffffffu, smax, o);
    smin = a < smin ? a : smin;
    smax = c > smax ? c : smax;
  }
  const bool live = iw < s.T;  // warp-uniform
  uint32_t qf[HS / 16][4];
  float o[HS / 8][4];
  mma_zero<HS / 8>(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int it = 0; it < tiles; ++it) {
    const int64_t j0 = lo + int64_t{it} * N;
    cp_async_wait<0>();
    __syncthreads();  // the tile landed for every thread; every warp is done with the other buffer
    if (it == 0 && live) {
      FERRY_UNROLL
      for (int kk = 0; kk < HS / 16; ++kk) mma_load_a<S, HS>(qf[kk], qs + warp * kMmaRowsPerWarp * P, kk * 16);
    }
    if (it + 1 < tiles) {
      const int nb = (it + 1) & 1;
      mma_load_rows<S, HS>(kbuf(nb), qkv, b * s.T, j0 + N, N, s.T, s.W, kcol);
      mma_load_rows<S, HS>(vbuf(nb), qkv, b * s.T, j0 + N, N, s.T, s.W, vcol);
      cp_async_commit();
    }
    // Warp-uniform skips: rows past T, rows all before the tile, a tile before every row's document.
    if (!live || iw + kMmaRowsPerWarp - 1 < j0 || j0 + N <= smin) continue;
    float sc[N / 8][4];
    mma_zero<N / 8>(sc);
    mma_rows_times_tile_t<S, HS, N>(
        sc,
        [&](uint32_t(&a)[4], int kk) {
          FERRY_UNROLL
          for (int e = 0; e < 4; ++e) a[e] = qf[kk][e];
        },
        kbuf(it & 1));
    // Only a tile that reaches past the warp's first row (the diagonal, and keys past T
    // with it) or starts before a row's document start is masked.
    if (j0 + N - 1 > iw || j0 < smax) {
      FERRY_UNROLL
      for (int n = 0; n < N / 8; ++n) {
        FERRY_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          const int64_t j = j0 + n * 8 + 2 * t + (e & 1);
          if (!(row[r] < s.T && j <= row[r] && j >= start[r])) sc[n][e] = -INFINITY;
        }
      }
    }
    FERRY_UNROLL
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
      FERRY_UNROLL
      for (int n = 0; n < N / 8; ++n) mx = fmaxf(mx, fmaxf(sc[n][2 * r], sc[n][2 * r + 1]));
      mx = quad_max(mx);
      const float mnew = fmaxf(m[r], mx);
      // A row that has seen no key yet keeps -inf: exponents against 0 then give 0, not NaN.
      const float base = mnew == -INFINITY ? 0.0f : mnew * scale2;
      const float alpha = exp2f(m[r] * scale2 - base);
      m[r] = mnew;
      float sum = 0.0f;
      FERRY_UNROLL
      for (int n = 0; n < N / 8; ++n) {
        FERRY_UNROLL
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          sc[n][e] = exp2f(sc[n][e] * scale2 - base);
          sum += sc[n][e];
        }
      }
      l[r] = l[r] * alpha + sum;  // this lane's share of the row; the quad's summed at the end
      FERRY_UNROLL
      for (int d = 0; d < HS / 8; ++d) {
        o[d][2 * r] *= alpha;
        o[d][2 * r + 1] *= alpha;
      }
    }
    mma_p_times_tile<S, HS, N>(o, sc, vbuf(it & 1));
  }
  FERRY_UNROLL
  for (int r = 0; r < 2; ++r) l[r] = quad_sum(l[r]);
  if (!live) return;  // after the last barrier: nothing below meets the block
  FERRY_UNROLL
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= s.T) continue;
    const float inv = 1.0f / l[r];
    S* dst = out + (b * s.T + row[r]) * s.C + h * HS + 2 * t;
    FERRY_UNROLL
    for (int d = 0; d < HS / 8; ++d) store2(dst + d * 8, pack2<S>(o[d][2 * r] * inv, o[d][2 * r + 1] * inv));
    if (t == 0) lse[(b * s.NH + h) * s.T + row[r]] = m[r] * scale + logf(l[r]);
  }
#else
  __trap();  // unreachable: the launcher asks for 8.0 code (mma_attention_obstacle)
#endif
}

}  // namespace

const char* mma_attention_obstacle(DType act, DType stats, int64_t hs) {
  if (act != DType::bf16 && act != DType::f16) return "bf16 or f16 activations";
  if (stats != DType::f32) return "f32 statistics";
  if (hs != 64 && hs != 128) return "a head size of 64 or 128";
  if (compute_major() < 8) return "a GPU of compute capability 8.0 or above";
  // A build for older GPUs compiles the kernels' bodies out (they trap): 8.0 code or nothing.
  cudaFuncAttributes attr{};
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&attr, flash_forward_mma_kernel<__nv_bfloat16, 64>));
  if (attr.ptxVersion < 80) return "a build with kernels for compute capability 8.0 or above (CMAKE_CUDA_ARCHITECTURES)";
  for (MmaPass p : {MmaPass::forward, MmaPass::kv, MmaPass::q}) {
    if (mma_warps(p, hs) == 0) return "more shared memory per block than this GPU has";
  }
  return nullptr;
}

namespace detail {

void attention_forward_mma(cudaStream_t st, Arr out, Arr lse, Arr qkv, const AttnShape& sh, int64_t B,
                           const int32_t* doc_start) {
  by_half(qkv.dtype, [&](auto tag) {
    using S = decltype(tag);
    by_mma_head(sh.hs, [&](auto head) {
      constexpr int HS = decltype(head)::value;
      auto& k = flash_forward_mma_kernel<S, HS>;
      const int w = mma_warps(MmaPass::forward, HS), rows = w * kMmaRowsPerWarp;
      const SharedFit fit =
          fit_shared(k, static_cast<size_t>(mma_shared_bytes(MmaPass::forward, w, HS)), "attention_forward", sh);
      opt_in_shared(k, fit);
      const dim3 grid(static_cast<unsigned>((sh.T + rows - 1) / rows), static_cast<unsigned>(sh.NH),
                      static_cast<unsigned>(B));
      FERRY_LAUNCH(k, grid, w * 32, fit.dynamic, st, static_cast<S*>(out.p), static_cast<float*>(lse.p),
                   static_cast<const S*>(qkv.p), sh, doc_start);
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

}  // namespace detail
FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
