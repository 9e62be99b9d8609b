// Attention on tensor cores, the pieces the kernels share: FlashAttention-2's forward
// (nn/cuda/attention_forward.cu) and the two-pass backward (attention_backward.cu) of the
// SIMT kernels, with every tile product a 16x16x16 warp matrix multiply (nvcuda::wmma:
// bf16 or f16 operands, f32 accumulation). Included by nn/cuda/attention.cuh inside
// ferry::nn::cuda::detail, after the SIMT layout it shares AttnShape and first_key with;
// the CPU emulation runs it through testing/emu_wmma.h.
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

inline constexpr int kTcTile = 64;       // positions of the other side per tile
inline constexpr int kTcMaxHead = 128;   // hp at most: shared memory (the dK/dV pass needs 187 KiB there at 4 warps)
inline constexpr int kTcRowsPerWarp = 16;

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
