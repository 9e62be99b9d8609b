// What the attention kernel files share (nn/cuda/attention_forward.cu, attention_backward.cu):
// the SIMT kernels' layout (AttnShape, tiles, rows per warp, shared memory per block), tile
// loads, the shared-memory checks against the GPU, and the choice between the SIMT, the
// wmma tensor-core (nn/cuda/attention_wmma.cuh) and the mma.sync kernels
// (nn/cuda/attention_mma.cuh). Inline and templates, in
// ferry::nn::cuda::detail (nn/cuda/common.cuh says why).
#pragma once

#include "nn/cuda/common.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
namespace detail {

// ---- attention -----------------------------------------------------------------------------
// FlashAttention-2's algorithm in SIMT form (no tensor-core instructions, so the CPU
// emulation runs it as written): scores are made tile by tile and never stored.
// qkv rows: q (NH heads) | k (KVH heads) | v (KVH heads), hs channels each; W = (NH+2KVH) hs.
// Every kernel runs warps of 32 lanes, each warp owning kRowsPerWarp rows (query rows in
// forward and in the dQ pass, key rows in the dK/dV pass) and each lane one position of the
// other side's tile of 32 (a key, or a query): a lane's dot products read its row of the
// tile from shared memory (rows padded to hs + 1 words, so the 32 lanes hit 32 banks) and
// the warp's rows as broadcasts. Accumulators of the warp's rows live in registers, a lane
// owning channels lane, lane + 32, ... (hs <= kMaxHeadSize). The probabilities a warp
// shares between its lanes pass through a per-warp slice of shared memory (__syncwarp).
// Shared memory does not grow with T: long contexts need nothing more than more blocks.

inline constexpr int kRowsPerWarp = 4;
inline constexpr int kTile = 32;  // keys (forward, dQ) or queries (dK/dV) per tile: one per lane
inline constexpr int kMaxHeadSize = 256;

// Runs f(std::integral_constant<int, P>{}) with P = the channels per lane a head of hs
// needs (2, 4 or 8: heads up to 64, 128, 256): the accumulators are register arrays of P,
// and sizing them to the head keeps registers, and so occupancy, where small heads want them.
template <class F>
void by_lanes(int64_t hs, F&& f) {
  if (hs <= 64) {
    f(std::integral_constant<int, 2>{});
  } else if (hs <= 128) {
    f(std::integral_constant<int, 4>{});
  } else {
    f(std::integral_constant<int, 8>{});
  }
}

struct AttnShape {
  int64_t T, C, NH, KVH, hs, W, group;
};

inline AttnShape attn_shape(int64_t T, int64_t C, int64_t NH, int64_t KVH) {
  const int64_t hs = C / NH;
  return {T, C, NH, KVH, hs, (NH + 2 * KVH) * hs, NH / KVH};
}

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) {
  return a < b ? a : b;
}

__device__ __forceinline__ int64_t first_key(const int32_t* doc_start, int64_t b, int64_t T, int64_t i) {
  return doc_start ? doc_start[b * T + i] : 0;
}

// Loads rows [r0, r0 + n) of one head's columns of `src` (row stride `stride`, column
// offset `col`) into tile[n][pitch] as A; rows at or past T are zero. A warp per row, lanes
// over its channels: coalesced reads and no integer division (the index arithmetic of an
// idx / hs split cost more than the tile's dot products).

template <class A>
__device__ __forceinline__ A warp_max(A v) {
  for (int o = 16; o > 0; o >>= 1) {
    const A w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

template <class A, class X>
__device__ void load_tile(A* tile, int pitch, X src, int64_t row_base, int64_t r0, int n, int64_t T,
                          int64_t stride, int64_t col, int64_t hs) {
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = static_cast<int>(hs);
  for (int r = warp; r < n; r += warps) {
    const int64_t row = r0 + r;
    const int64_t at = (row_base + row) * stride + col;
    A* dst = tile + r * pitch;
    if (row < T) {
      for (int d = lane; d < h; d += 32) dst[d] = src[at + d];
    } else {
      for (int d = lane; d < h; d += 32) dst[d] = A(0);
    }
  }
}

// Shared memory per block, in elements of A, for `warps` warps at head size hs.
inline int64_t forward_shared(int64_t warps, int64_t hs) {
  const int64_t rows = warps * kRowsPerWarp;
  return rows * hs + kTile * (hs + 1) + kTile * hs + rows * kTile;
}
inline int64_t backward_kv_shared(int64_t warps, int64_t hs) {
  const int64_t rows = warps * kRowsPerWarp;
  return 2 * rows * hs + 2 * kTile * (hs + 1) + 2 * rows * kTile;
}
inline int64_t backward_q_shared(int64_t warps, int64_t hs) {
  const int64_t rows = warps * kRowsPerWarp;
  return 2 * rows * hs + 2 * kTile * (hs + 1) + rows * kTile;
}

// Past 48 KiB per block (static + dynamic) a kernel must opt in; the flash kernels' shared
// memory depends on the head size alone (about 42 KB at hs = 128 with f32, 4 warps).
inline constexpr size_t kDefaultSharedBytes = 48 * 1024;

// The current device's cudaDevAttrMaxSharedMemoryPerBlockOptin, queried once per device.
inline size_t shared_optin_limit() {
#ifdef FERRY_CUDA_EMULATION  // tests change the emulated GPU's limit between launches
  int current = 0, limit = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&current));
  FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, current));
  return static_cast<size_t>(limit);
#else
  constexpr int kDevices = 64;
  static std::atomic<int> limits[kDevices];  // 0: not queried yet
  int device = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&device));
  std::atomic<int>* slot = device >= 0 && device < kDevices ? &limits[device] : nullptr;
  int v = slot != nullptr ? slot->load(std::memory_order_relaxed) : 0;
  if (v == 0) {
    FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (slot != nullptr) slot->store(v, std::memory_order_relaxed);
  }
  return static_cast<size_t>(v);
#endif
}

struct SharedFit {
  size_t dynamic, total;  // bytes: dynamic, and static + dynamic
};

// Checks one launch's shared memory against the device; throws std::invalid_argument
// naming the op, the head size, the bytes and the limit when it cannot fit.
template <class K>
SharedFit fit_shared(K kernel, size_t dynamic, const char* op, const AttnShape& s) {
  if (s.hs > kMaxHeadSize) {
    throw std::invalid_argument(std::string(op) + ": head size " + std::to_string(s.hs) +
                                " is above the attention kernels' limit of " +
                                std::to_string(kMaxHeadSize));
  }
  cudaFuncAttributes attr{};
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  const SharedFit fit{dynamic, attr.sharedSizeBytes + dynamic};
  const size_t limit = shared_optin_limit();
  if (fit.total > limit) {
    throw std::invalid_argument(
        std::string(op) + ": head size " + std::to_string(s.hs) + " needs " + std::to_string(fit.total) +
        " bytes of shared memory per block (static + dynamic), more than this GPU's limit of " +
        std::to_string(limit) + " bytes (cudaDevAttrMaxSharedMemoryPerBlockOptin)");
  }
  return fit;
}

// Opts the kernel in to its dynamic size when static + dynamic passes the default 48 KiB.
template <class K>
void opt_in_shared(K kernel, const SharedFit& fit) {
  if (fit.total > kDefaultSharedBytes) {
    FERRY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(fit.dynamic)));
  }
}

#include "nn/cuda/attention_wmma.cuh"

// Which kernels a launch runs: `kernel` resolved against the operands (the activations
// `acts`, the statistics `lse`) and the GPU. automatic: mma where it can run, else the wmma
// tensor-core kernels, else SIMT; mma or tensor_cores asked where they cannot run is
// std::invalid_argument naming the op and what they need.
enum class AttnPath { simt, wmma, mma };

inline AttnPath attention_path(AttentionKernel kernel, std::initializer_list<Arr> acts, Arr lse, int64_t hs,
                               const char* op) {
  if (kernel == AttentionKernel::simt) return AttnPath::simt;
  const DType t = acts.begin()->dtype;
  const bool same = std::all_of(acts.begin(), acts.end(), [t](const Arr& a) { return a.dtype == t; });
  auto refuse = [&](const char* name, const char* why) {
    throw std::invalid_argument(std::string(op) + ": device.attention_kernel is " + name + ", which needs " + why +
                                " (here: activations " + std::string(dtype_name(t)) + ", statistics " +
                                std::string(dtype_name(lse.dtype)) + ", head size " + std::to_string(hs) + ")");
  };
  if (kernel == AttentionKernel::mma || kernel == AttentionKernel::automatic) {
    const char* why = same ? mma_attention_obstacle(t, lse.dtype, hs) : "activations of one dtype, bf16 or f16";
    // cp.async moves 16 bytes: every row of every head must start 16-byte aligned (head
    // sizes of 64 and 128 give that wherever the tensor itself is aligned).
    const bool aligned = std::all_of(acts.begin(), acts.end(),
                                     [](const Arr& a) { return reinterpret_cast<uintptr_t>(a.p) % 16 == 0; });
    if (why == nullptr && !aligned) why = "activations at 16-byte aligned addresses";
    if (why == nullptr) return AttnPath::mma;
    if (kernel == AttentionKernel::mma) refuse("mma", why);
  }
  const char* why = same ? tensor_core_attention_obstacle(t, lse.dtype, hs) : "activations of one dtype, bf16 or f16";
  if (why == nullptr) return AttnPath::wmma;
  if (kernel == AttentionKernel::tensor_cores) refuse("tensor_cores", why);
  return AttnPath::simt;
}

// Runs f(S{}) with S the 16-bit storage type of dtype t (bf16 or f16).
template <class F>
void by_half(DType t, F&& f) {
  if (t == DType::bf16) {
    f(__nv_bfloat16{});
  } else {
    f(__half{});
  }
}

enum class TcPass { forward, kv, q };

inline int64_t tc_shared_bytes(TcPass pass, int warps, int64_t hs) {
  const int64_t hp = tc_pad(hs), elem = 2;  // bf16 and f16 alike
  return pass == TcPass::forward ? tc_forward_layout(warps, hp, elem).bytes
                                 : tc_backward_layout(pass == TcPass::kv, warps, hp, elem).bytes;
}

// Warps per block of a tensor-core pass: the attention kernels' block size, halved until
// its shared memory fits the GPU (an A100's 163 KB takes the dK/dV pass at head size 128
// with 2 warps); 0 when not even one warp fits.
inline int tc_warps(TcPass pass, int64_t hs) {
  const size_t limit = shared_optin_limit();
  for (int w = attn_threads() / 32; w >= 1; w /= 2) {
    if (static_cast<size_t>(tc_shared_bytes(pass, w, hs)) <= limit) return w;
  }
  return 0;
}

// The tensor-core paths (nn/cuda/attention_tc.cu), entered by the attention launchers once
// use_tensor_cores said yes: every shared-memory check runs before the first launch that
// writes out or dqkv. rowdot: device float[B * NH * T] scratch for D = rowsum(dout * out).
void attention_forward_tc(cudaStream_t st, Arr out, Arr lse, Arr qkv, const AttnShape& sh, int64_t B,
                          const int32_t* doc_start);
void attention_backward_tc(cudaStream_t st, Arr dqkv, Arr dout, Arr qkv, Arr out, Arr lse, const AttnShape& sh,
                           int64_t B, const int32_t* doc_start, void* rowdot);
// The mma.sync paths (nn/cuda/attention_mma.cu, attention_mma_backward.cu), entered once
// attention_path said mma; the same contract.
void attention_forward_mma(cudaStream_t st, Arr out, Arr lse, Arr qkv, const AttnShape& sh, int64_t B,
                           const int32_t* doc_start);
void attention_backward_mma(cudaStream_t st, Arr dqkv, Arr dout, Arr qkv, Arr out, Arr lse, const AttnShape& sh,
                            int64_t B, const int32_t* doc_start, void* rowdot);

}  // namespace detail

// Kernels the SIMT and the tensor-core backward both launch: TU-local templates, instantiated
// in each file that uses them.
namespace {
using namespace detail;

// Backward, D = rowsum(dO * O) per (batch, head, position): one thread each, adding the
// head's channels in order, in 16-byte vectors where the head size, the row width and the
// operands allow (the same sum: the bits do not depend on the path). Element by element it
// took 56 us per layer at GPT-2 124M's bench shape on an H200 (8192 rows of 12 heads of 64:
// 25 MB read, about 6 us at HBM speed; docs/design/measured.md).
template <class A, class X>
__global__ void flash_rowdot_kernel(A* D, X dout, X out, AttnShape s, int64_t B, bool vectors) {
  constexpr int W = X::kWidth;
  FERRY_FOR_EACH(n, B * s.T * s.NH) {
    const int64_t h = n % s.NH, bt = n / s.NH, b = bt / s.T, t = bt % s.T;
    const int64_t at = bt * s.C + h * s.hs;
    A acc = 0;
    if (vectors) {
      for (int64_t j = 0; j < s.hs / W; ++j) {
        A g[W], o[W];
        dout.template load<W>(at / W + j, g);
        out.template load<W>(at / W + j, o);
        FERRY_UNROLL
        for (int k = 0; k < W; ++k) acc += g[k] * o[k];
      }
    } else {
      for (int64_t d = 0; d < s.hs; ++d) acc += dout[at + d] * out[at + d];
    }
    D[(b * s.NH + h) * s.T + t] = acc;
  }
}

// Launches flash_rowdot_kernel on dout and out ([B T, C] in X's storage) into D.
template <class A, class X>
void launch_rowdot(cudaStream_t st, A* D, const Arr& dout, const Arr& out, const AttnShape& sh, int64_t B) {
  constexpr int W = X::kWidth;
  const bool vectors = W > 1 && sh.hs % W == 0 && sh.C % W == 0 && vector_chunks<X>(sh.C, {dout.p, out.p}) > 0;
  auto& kernel = flash_rowdot_kernel<A, X>;  // a reference: FERRY_LAUNCH takes its address
  FERRY_LAUNCH(kernel, grid_for(B * sh.T * sh.NH), block_threads(), 0, st, D, X(dout), X(out), sh, B, vectors);
  FERRY_CUDA_CHECK_LAUNCH();
}

}  // namespace
FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
