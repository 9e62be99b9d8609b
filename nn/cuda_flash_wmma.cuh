// Attention on tensor cores: FlashAttention-2's forward and the two-pass backward of the SIMT
// kernels above (nn/cuda_kernels.cu), with every tile product a 16x16x16 warp matrix
// multiply (nvcuda::wmma: bf16 or f16 operands, f32 accumulation). Included by
// nn/cuda_kernels.cu inside its anonymous namespace, after the SIMT attention it shares
// AttnShape, first_key and the launch checks with; the CPU emulation runs it through
// testing/emu_wmma.h.
//
// Layout: each warp owns 16 rows (queries in forward and dQ, keys in dK/dV), so a block
// of W warps owns 16 W rows; the other side comes in tiles of kTcTile = 64 positions. Q, K,
// V and dO tiles sit in shared memory in the storage type, rows padded from the head size
// hs to hp = hs rounded up to 16 (zeros: they add nothing to a dot product) plus 8
// elements of pitch (bank spread; rows stay 32-byte aligned, as wmma's loads need). Per
// warp: the scores of its 16 rows x 64 (f32), the probabilities rounded to the storage
// type for the next product, and its output or gradient rows (f32, hp wide), which
// wmma loads as the accumulator, adds a tile's product to and stores back. The softmax
// and the masks (causal, documents) are SIMT: two lanes per row, 32 columns each.
// Fragments are touched only through load/store/mma, never by element, because which
// lane holds which element is unspecified. Results differ from the SIMT kernels' at the
// rounding of the probabilities to bf16/f16 before P V, dS K and dS^T Q, as
// FlashAttention's do. Needs compute capability 8.0 (bf16 wmma): the launcher checks.

#ifdef FERRY_CUDA_EMULATION
#define FERRY_TC_SHARED(name) FERRY_DYNAMIC_SHARED(name)
#define FERRY_TC_ARCH 1
#else
// wmma's loads and stores need 256-bit aligned addresses: the carve-up below keeps every
// buffer at a multiple of 32 bytes from this base.
#define FERRY_TC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define FERRY_TC_ARCH 1
#else
#define FERRY_TC_ARCH 0
#endif
#endif

namespace wmma = nvcuda::wmma;

constexpr int kTcTile = 64;       // positions of the other side per tile
constexpr int kTcMaxHead = 128;   // hp at most: shared memory (the dK/dV pass needs 187 KiB there at 4 warps)
constexpr int kTcRowsPerWarp = 16;

__host__ __device__ constexpr int64_t tc_pad(int64_t hs) {
  return (hs + 15) / 16 * 16;
}

// Bump allocation of dynamic shared memory in bytes, each piece 32-byte aligned. The same
// sequence of take() calls gives the host its size and the kernel its offsets.
struct TcCarve {
  int64_t at = 0;
  __host__ __device__ int64_t take(int64_t bytes) {
    const int64_t o = at;
    at += (bytes + 31) / 32 * 32;
    return o;
  }
};

// Pitches, in elements: storage-type tiles (ld), f32 rows hp wide (ldf), scores (lds) and
// probabilities (ldp) 64 wide.
struct TcPitch {
  int ld, ldf, lds, ldp;
};
__host__ __device__ inline TcPitch tc_pitch(int64_t hp) {
  return {static_cast<int>(hp) + 8, static_cast<int>(hp) + 4, kTcTile + 4, kTcTile + 8};
}

struct TcForwardLayout {
  int64_t q, k, v, s, p, o, stats, bytes;
};
__host__ __device__ inline TcForwardLayout tc_forward_layout(int warps, int64_t hp, int64_t elem) {
  const TcPitch P = tc_pitch(hp);
  const int64_t rows = int64_t{kTcRowsPerWarp} * warps;
  TcCarve c;
  TcForwardLayout L{};
  L.q = c.take(rows * P.ld * elem);
  L.k = c.take(kTcTile * P.ld * elem);
  L.v = c.take(kTcTile * P.ld * elem);
  L.s = c.take(rows * P.lds * 4);
  L.p = c.take(rows * P.ldp * elem);
  L.o = c.take(rows * P.ldf * 4);
  L.stats = c.take(rows * 3 * 4);  // per row: running max, running sum, this tile's rescale
  L.bytes = c.at;
  return L;
}

struct TcBackwardLayout {
  int64_t own0, own1, oth0, oth1, rowstats, s, dp, p, ds, acc0, acc1, bytes;
};
// kv: the dK/dV pass (own rows: K, V; other: Q, dO tiles, with their lse, D and document
// starts; two accumulators dK, dV); else the dQ pass (own rows: Q, dO; other: K, V; dQ).
__host__ __device__ inline TcBackwardLayout tc_backward_layout(bool kv, int warps, int64_t hp, int64_t elem) {
  const TcPitch P = tc_pitch(hp);
  const int64_t rows = int64_t{kTcRowsPerWarp} * warps;
  TcCarve c;
  TcBackwardLayout L{};
  L.own0 = c.take(rows * P.ld * elem);
  L.own1 = c.take(rows * P.ld * elem);
  L.oth0 = c.take(kTcTile * P.ld * elem);
  L.oth1 = c.take(kTcTile * P.ld * elem);
  L.rowstats = kv ? c.take(kTcTile * (4 + 4 + 8)) : -1;  // -1: the pass has none
  L.s = c.take(rows * P.lds * 4);
  L.dp = c.take(rows * P.lds * 4);
  L.p = kv ? c.take(rows * P.ldp * elem) : -1;
  L.ds = c.take(rows * P.ldp * elem);
  L.acc0 = c.take(rows * P.ldf * 4);
  L.acc1 = kv ? c.take(rows * P.ldf * 4) : -1;
  L.bytes = c.at;
  return L;
}

// A backward pass's shared memory as pointers: the block's own rows and the other side's
// tile (storage type), and this warp's slices (wrow = its first row in the block).
template <class S>
struct TcBackwardSmem {
  S *own0, *own1, *oth0, *oth1;
  float* rowstats;  // dK/dV pass only
  float *s, *dp;    // the warp's scores and dO V^T products, f32
  S *p, *ds;        // rounded for the next products (p: dK/dV pass only)
  float *acc0, *acc1;  // the warp's gradient rows (acc1: dK/dV pass only)
  __device__ TcBackwardSmem(unsigned char* smem, const TcBackwardLayout& L, const TcPitch& P, int wrow)
      : own0(at<S>(smem, L.own0, 0)),
        own1(at<S>(smem, L.own1, 0)),
        oth0(at<S>(smem, L.oth0, 0)),
        oth1(at<S>(smem, L.oth1, 0)),
        rowstats(at<float>(smem, L.rowstats, 0)),
        s(at<float>(smem, L.s, wrow * P.lds)),
        dp(at<float>(smem, L.dp, wrow * P.lds)),
        p(at<S>(smem, L.p, wrow * P.ldp)),
        ds(at<S>(smem, L.ds, wrow * P.ldp)),
        acc0(at<float>(smem, L.acc0, wrow * P.ldf)),
        acc1(at<float>(smem, L.acc1, wrow * P.ldf)) {}
  // The piece at byte `offset`, `skip` elements in; null for a piece the pass lacks (-1).
  template <class T>
  __device__ static T* at(unsigned char* smem, int64_t offset, int skip) {
    return offset < 0 ? nullptr : reinterpret_cast<T*>(smem + offset) + skip;
  }
};

template <class S>
__device__ S tc_zero() {
  return Narrow<S>::to(0.0f);
}

// 16 bytes, 8 elements of a 16-bit type: the unit of the tile loads where rows allow it.
struct alignas(16) Chunk16 {
  uint32_t w[4];
};

__device__ __forceinline__ void copy16(void* dst, const void* src) {
#ifdef FERRY_CUDA_EMULATION
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % 16 != 0) {
    throw std::logic_error("cuda emulation: a 16-byte copy at an address not 16-byte aligned (a GPU faults)");
  }
  std::memcpy(dst, src, 16);  // g++: no type punning through Chunk16
#else
  *static_cast<Chunk16*>(dst) = *static_cast<const Chunk16*>(src);
#endif
}

// Rows [r0, r0 + n) of one head's columns of src (row stride `stride`, column offset col)
// into tile[n][ld] unchanged; channels hs..hp and rows at or past T are zero. Where every
// row's head starts 16-byte aligned (hs, stride and col multiples of 8, src aligned), the
// block's threads copy 16 bytes each, consecutive threads along a row: a warp moves 512
// bytes per instruction instead of 64. Otherwise a warp per row, lanes over its channels.
template <class S>
__device__ void tc_load_rows(S* tile, int ld, const S* src, int64_t row_base, int64_t r0, int n, int64_t T,
                             int64_t stride, int64_t col, int hs, int hp) {
  const bool vec = hs % 8 == 0 && stride % 8 == 0 && col % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;
  if (vec) {
    const int per_row = hp / 8, chunks = n * per_row;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
      const int r = c / per_row, k = (c - r * per_row) * 8;
      const int64_t row = r0 + r;
      S* dst = tile + r * ld + k;
      if (row < T && k < hs) {
        copy16(dst, src + (row_base + row) * stride + col + k);
      } else {
        const Chunk16 zero{};
        copy16(dst, &zero);
      }
    }
    return;
  }
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int r = warp; r < n; r += warps) {
    const int64_t row = r0 + r;
    S* dst = tile + r * ld;
    if (row < T) {
      const S* from = src + (row_base + row) * stride + col;
      for (int d = lane; d < hp; d += 32) dst[d] = d < hs ? from[d] : tc_zero<S>();
    } else {
      for (int d = lane; d < hp; d += 32) dst[d] = tc_zero<S>();
    }
  }
}

// out[16][64] (f32, pitch ldo) = a[16][hp] b^T, b's 64 rows of hp at pitch ld (both
// storage-type tiles, row-major): the scores of a warp's rows against a tile.
template <class S>
__device__ void tc_rows_times_tile_t(float* out, int ldo, const S* a, const S* b, int ld, int hp) {
  for (int n = 0; n < kTcTile; n += 16) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int d = 0; d < hp; d += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, S, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, S, wmma::col_major> fb;  // b^T: column n is b's row n
      wmma::load_matrix_sync(fa, a + d, ld);
      wmma::load_matrix_sync(fb, b + n * ld + d, ld);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n, acc, ldo, wmma::mem_row_major);
  }
}

// acc[16][hp] (f32, pitch ldf) += p[16][64] (pitch ldp) b[64][hp] (pitch ld).
template <class S>
__device__ void tc_accumulate(float* acc, int ldf, const S* p, int ldp, const S* b, int ld, int hp) {
  for (int c = 0; c < hp; c += 16) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::load_matrix_sync(fc, acc + c, ldf, wmma::mem_row_major);
    for (int k = 0; k < kTcTile; k += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, S, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, S, wmma::row_major> fb;
      wmma::load_matrix_sync(fa, p + k, ldp);
      wmma::load_matrix_sync(fb, b + k * ld + c, ld);
      wmma::mma_sync(fc, fa, fb, fc);
    }
    wmma::store_matrix_sync(acc + c, fc, ldf, wmma::mem_row_major);
  }
}

// A warp's 16 accumulator rows (pitch ldf) added into dqkv: row base + r at column col.
__device__ inline void tc_add_rows(Arr dqkv, const float* acc, int ldf, int64_t row0, int64_t T, int64_t row_base,
                                   int64_t W, int64_t col, int hs) {
  const int lane = threadIdx.x & 31;
  for (int r = 0; r < kTcRowsPerWarp && row0 + r < T; ++r) {
    for (int d = lane; d < hs; d += 32) {
      const int64_t at = (row_base + row0 + r) * W + col + d;
      st<float>(dqkv, at, ld<float>(dqkv, at) + acc[r * ldf + d]);
    }
  }
}

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
