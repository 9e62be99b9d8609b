// Attention v2, the pieces its kernels share: FlashAttention-2 with every tile product an
// mma.sync m16n8k16 (nn/cuda/mma.cuh) whose accumulators stay in registers. The forward
// (nn/cuda/attention_mma.cu) and the backward's dK/dV and dQ passes
// (attention_mma_backward.cu) keep the contract of the other kernels (lse, documents,
// grouped-query heads, every output row written by one block, no atomics).
// Included after nn/cuda/attention.cuh, inside nothing (it opens its own namespaces).
//
// Layout: a block of W warps (attention's block size, halved while its shared memory does
// not fit the GPU) owns 16 W rows of one side (queries in forward and dQ, keys in dK/dV),
// 16 per warp; the other side streams through shared memory in tiles of N positions, two
// buffers filled by cp.async while the warps compute on the other. Tiles are rows of the
// head (HS channels, 64 or 128: a template) at a pitch of HS + 8 elements: consecutive rows
// start 16 bytes apart modulo 128, so the 8 row addresses of an ldmatrix hit 8 different
// 16-byte bank groups (no conflicts) and every row stays 16-byte aligned for cp.async.
// Products (per warp, 16 own rows):
// - rows x tile^T (S = Q K^T, dP = dO V^T, S^T = K Q^T, dP^T = V dO^T): A from the own rows
//   (registers, or ldmatrix per 16 channels), B from the tile's rows by plain ldmatrix (a
//   tile row is a column of B);
// - P x tile (O += P V, dV += P^T dO, dK += dS^T Q, dQ += dS K): A is the accumulator of the
//   first product, rounded to 16 bits in registers (its layout is the A fragment's), B from
//   the tile's rows by ldmatrix .trans.
#pragma once

#include "nn/cuda/attention.cuh"
#include "nn/cuda/mma.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
namespace detail {

inline constexpr int kMmaRowsPerWarp = 16;

template <int HS>
inline constexpr int kMmaPitch = HS + 8;

// Positions of the other side per tile: forward's keys (64), the dK/dV pass's queries and
// the dQ pass's keys (64 at head size 64, 32 at 128, where the dK and dV accumulators
// already take 128 registers a lane).
inline constexpr int kMmaForwardTile = 64;
template <int HS>
inline constexpr int kMmaBackwardTile = HS <= 64 ? 64 : 32;

enum class MmaPass { forward, kv, q };

// Dynamic shared memory of a pass in bytes (16-bit activations): the own rows (forward: Q;
// dK/dV: K and V; dQ: Q and dO), two buffers of the tile's rows (forward: K and V; dK/dV: Q
// and dO; dQ: K and V), and for dK/dV two buffers of the tile's lse, D and document starts.
inline int64_t mma_shared_bytes(MmaPass pass, int warps, int64_t hs) {
  const int64_t pitch = hs + 8, rows = int64_t{kMmaRowsPerWarp} * warps;
  const int64_t tile = pass == MmaPass::forward ? kMmaForwardTile : (hs <= 64 ? 64 : 32);
  const int64_t own = (pass == MmaPass::forward ? 1 : 2) * rows * pitch * 2;
  const int64_t stream = 2 * 2 * tile * pitch * 2;
  const int64_t stats = pass == MmaPass::kv ? 2 * tile * 3 * 4 : 0;
  return own + stream + stats;
}

// Warps per block of a pass: attention's block size halved until it fits the GPU; 0 when
// not even one warp does.
inline int mma_warps(MmaPass pass, int64_t hs) {
  const size_t limit = shared_optin_limit();
  for (int w = attn_threads() / 32; w >= 1; w /= 2) {
    if (static_cast<size_t>(mma_shared_bytes(pass, w, hs)) <= limit) return w;
  }
  return 0;
}

// Rows [r0, r0 + n) of one head's HS channels of src (row stride `stride`, column `col`)
// into tile[n][HS + 8] by cp.async, 16 bytes a thread at a time, consecutive threads along
// a row; rows at or past T land as zeros. The caller commits the group.
template <class S, int HS>
__device__ __forceinline__ void mma_load_rows(S* tile, const S* src, int64_t row_base, int64_t r0, int n, int64_t T,
                                              int64_t stride, int64_t col) {
  constexpr int kChunks = HS / 8;
  for (int c = threadIdx.x; c < n * kChunks; c += blockDim.x) {
    const int r = c / kChunks, k = (c - r * kChunks) * 8;
    const bool valid = r0 + r < T;
    const S* from = valid ? src + (row_base + r0 + r) * stride + col + k : src;
    cp_async_16(tile + r * kMmaPitch<HS> + k, from, valid);
  }
}

// The A fragment of channels [k0, k0 + 16) of the 16 rows at `rows` (pitch HS + 8).
template <class S, int HS>
__device__ __forceinline__ void mma_load_a(uint32_t (&a)[4], const S* rows, int k0) {
  const int lane = threadIdx.x & 31;
  ldmatrix_x4(a, rows + (lane & 15) * kMmaPitch<HS> + k0 + (lane >> 4) * 8);
}

// acc[N/8][4] += A tile^T: A the warp's 16 rows of HS channels, a(frag, kk) giving the A
// fragment of channels 16 kk..; tile: N rows of HS channels (pitch HS + 8). One ldmatrix_x4
// gives the B fragments of two 8-column blocks: lanes 0-7 rows n..n+7 at channels k..k+7,
// 8-15 the same rows at k+8.., 16-23 rows n+8.. at k.., 24-31 rows n+8.. at k+8...
template <class S, int HS, int N, class AFrag>
__device__ __forceinline__ void mma_rows_times_tile_t(float (&acc)[N / 8][4], AFrag&& a_frag, const S* tile) {
  const int lane = threadIdx.x & 31;
  const S* base = tile + ((lane & 7) + (lane >> 4) * 8) * kMmaPitch<HS> + ((lane >> 3) & 1) * 8;
  FERRY_UNROLL
  for (int kk = 0; kk < HS / 16; ++kk) {
    uint32_t a[4];
    a_frag(a, kk);
    FERRY_UNROLL
    for (int np = 0; np < N / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, base + np * 16 * kMmaPitch<HS> + kk * 16);
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      mma_m16n8k16<S>(acc[2 * np], a, b0, acc[2 * np]);
      mma_m16n8k16<S>(acc[2 * np + 1], a, b1, acc[2 * np + 1]);
    }
  }
}

// acc[HS/8][4] += P tile: P the warp's 16 x N accumulator (p[N/8][4]), rounded to S here
// (two 8-column blocks side by side are one A fragment); tile: N rows of HS channels.
// ldmatrix .trans: lanes 0-7 rows k..k+7 at channels d..d+7, 8-15 rows k+8.. at d.., 16-23
// rows k.. at d+8.., 24-31 rows k+8.. at d+8...
template <class S, int HS, int N>
__device__ __forceinline__ void mma_p_times_tile(float (&acc)[HS / 8][4], const float (&p)[N / 8][4], const S* tile) {
  const int lane = threadIdx.x & 31;
  const S* base = tile + ((lane & 7) + ((lane >> 3) & 1) * 8) * kMmaPitch<HS> + (lane >> 4) * 8;
  FERRY_UNROLL
  for (int kk = 0; kk < N / 16; ++kk) {
    const uint32_t a[4] = {pack2<S>(p[2 * kk][0], p[2 * kk][1]), pack2<S>(p[2 * kk][2], p[2 * kk][3]),
                           pack2<S>(p[2 * kk + 1][0], p[2 * kk + 1][1]), pack2<S>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
    FERRY_UNROLL
    for (int dp = 0; dp < HS / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, base + kk * 16 * kMmaPitch<HS> + dp * 16);
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      mma_m16n8k16<S>(acc[2 * dp], a, b0, acc[2 * dp]);
      mma_m16n8k16<S>(acc[2 * dp + 1], a, b1, acc[2 * dp + 1]);
    }
  }
}

template <int N>
__device__ __forceinline__ void mma_zero(float (&acc)[N][4]) {
  FERRY_UNROLL
  for (int n = 0; n < N; ++n) {
    FERRY_UNROLL
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
  }
}

// A warp's 16 x HS accumulator (rows row0 + g and row0 + g + 8) added into dqkv at column
// col, rows at or past T skipped. Element-wise through ld/st: once per block, and dqkv may
// be any dtype.
template <int HS>
__device__ __forceinline__ void mma_add_rows(Arr dqkv, const float (&acc)[HS / 8][4], int64_t row0, int64_t T,
                                             int64_t row_base, int64_t W, int64_t col) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  FERRY_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int64_t row = row0 + g + 8 * half;
    if (row >= T) continue;
    FERRY_UNROLL
    for (int d = 0; d < HS / 8; ++d) {
      FERRY_UNROLL
      for (int e = 0; e < 2; ++e) {
        const int64_t at = (row_base + row) * W + col + d * 8 + 2 * t + e;
        st<float>(dqkv, at, ld<float>(dqkv, at) + acc[d][2 * half + e]);
      }
    }
  }
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Two 16-bit elements packed by pack2, stored at p (4-byte aligned).
template <class S>
__device__ __forceinline__ void store2(S* p, uint32_t v) {
#ifdef FERRY_CUDA_EMULATION
  std::memcpy(p, &v, 4);
#else
  *reinterpret_cast<uint32_t*>(p) = v;
#endif
}

// Runs f(std::integral_constant<int, HS>{}) for the head size hs (64 or 128: what
// mma_attention_obstacle lets through).
template <class F>
void by_mma_head(int64_t hs, F&& f) {
  if (hs == 64) {
    f(std::integral_constant<int, 64>{});
  } else {
    f(std::integral_constant<int, 128>{});
  }
}

inline constexpr float kLog2e = 1.4426950408889634f;

}  // namespace detail
FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
