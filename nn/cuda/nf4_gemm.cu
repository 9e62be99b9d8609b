// QLoRA's products on the GPU with W's NF4 pieces dequantized inside the GEMM's operand
// load (DeviceOps::nf4_gemm; device.nf4_gemm "fused"): no panel of W exists in global
// memory. A block computes a 64 x 64 tile of C with 4 warps of mma.sync m16n8k16 (each warp
// 32 x 32: 2 x 4 tiles of 16 x 8), stepping k by 32: the threads load A's 64 x 32 into shared
// memory and dequantize op(W)'s 32 x 64 there (nn/cuda/nf4.cuh: the same float32 roundings
// as the panels, then one rounding to the compute dtype), then every warp multiplies from
// shared memory through ldmatrix (the fragment layouts of nn/cuda/mma.cuh). The sums are fp32
// in the tensor cores' order, so C matches cuBLAS on the dequantized panel to the GEMM's
// rounding, not bit for bit. Its speed against the panels and cuBLAS is for a GPU to
// measure (benchmarks/gpu_check.sh); until then "panel" stays the default.
#include "nn/cuda/mma.cuh"
#include "nn/cuda/nf4.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

constexpr int kNf4GemmTile = 64;              // rows of A and columns of op(W) a block computes
constexpr int kNf4GemmK = 32;                 // k a stage loads
constexpr int kNf4GemmPitch = kNf4GemmK + 8;  // 80 bytes a shared row: 16-byte aligned for ldmatrix
constexpr int kNf4GemmThreads = 128;          // 4 warps, 2 x 2 over the tile

struct Nf4PieceSet {
  Nf4Piece p[kNf4GemmMaxPieces];
  int n;
};

// W[row, col], from the piece that holds the row (the pieces tile W's rows in order).
__device__ __forceinline__ float nf4_weight(const Nf4PieceSet& w, const Nf4Values& table, int64_t row, int64_t col) {
  int k = 0;
  while (k + 1 < w.n && row >= w.p[k + 1].row0) ++k;
  const Nf4Piece& p = w.p[k];
  return nf4_element(p.blob, p.q, table, (row - p.row0) * p.q.cols + col);
}

template <class S>
__global__ void nf4_gemm_kernel(Arr c, int64_t ldc, const S* a, int64_t lda, Nf4PieceSet w, Nf4Values table,
                                bool trans_w, int64_t M, int64_t N, int64_t K, float beta) {
#if FERRY_MMA_ARCH
  FERRY_DYNAMIC_SHARED(smem);
  S* as = reinterpret_cast<S*>(smem);           // [64][pitch]: A's rows m0.., columns k0..
  S* bs = as + kNf4GemmTile * kNf4GemmPitch;    // [64][pitch]: op(W)'s columns n0.. as rows, k0..
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp >> 1, wn = warp & 1;
  const int64_t m0 = int64_t{blockIdx.y} * kNf4GemmTile, n0 = int64_t{blockIdx.x} * kNf4GemmTile;
  float acc[2][4][4];
  FERRY_UNROLL
  for (int mt = 0; mt < 2; ++mt) {
    FERRY_UNROLL
    for (int nt = 0; nt < 4; ++nt) {
      FERRY_UNROLL
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
    }
  }
  const S zero = Narrow<S>::to(0.0f);
  for (int64_t k0 = 0; k0 < K; k0 += kNf4GemmK) {
    for (int i = threadIdx.x; i < kNf4GemmTile * kNf4GemmK; i += blockDim.x) {
      const int r = i / kNf4GemmK, kk = i % kNf4GemmK;
      const int64_t m = m0 + r, n = n0 + r, k = k0 + kk;
      as[r * kNf4GemmPitch + kk] = m < M && k < K ? a[m * lda + k] : zero;
      float v = 0.0f;
      if (n < N && k < K) v = trans_w ? nf4_weight(w, table, n, k) : nf4_weight(w, table, k, n);
      bs[r * kNf4GemmPitch + kk] = Narrow<S>::to(v);
    }
    __syncthreads();
    FERRY_UNROLL
    for (int kk = 0; kk < kNf4GemmK; kk += 16) {
      uint32_t af[2][4];
      FERRY_UNROLL
      for (int mt = 0; mt < 2; ++mt) {
        ldmatrix_x4(af[mt], as + (wm * 32 + mt * 16 + (lane & 15)) * kNf4GemmPitch + kk + (lane >> 4) * 8);
      }
      // One ldmatrix_x4 gives the B fragments of two 8-column blocks (as attention's
      // mma_rows_times_tile_t reads its key tile).
      FERRY_UNROLL
      for (int np = 0; np < 2; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, bs + (wn * 32 + np * 16 + (lane & 7) + (lane >> 4) * 8) * kNf4GemmPitch + kk +
                           ((lane >> 3) & 1) * 8);
        const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
        FERRY_UNROLL
        for (int mt = 0; mt < 2; ++mt) {
          mma_m16n8k16<S>(acc[mt][2 * np], af[mt], b0, acc[mt][2 * np]);
          mma_m16n8k16<S>(acc[mt][2 * np + 1], af[mt], b1, acc[mt][2 * np + 1]);
        }
      }
    }
    __syncthreads();  // every warp is done with the tiles before the next stage overwrites them
  }
  // c[g][2t, 2t+1] and c[g+8][2t, 2t+1] of each 16 x 8 tile (nn/cuda/mma.cuh).
  FERRY_UNROLL
  for (int mt = 0; mt < 2; ++mt) {
    FERRY_UNROLL
    for (int nt = 0; nt < 4; ++nt) {
      FERRY_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int64_t m = m0 + wm * 32 + mt * 16 + g + (e >> 1) * 8, n = n0 + wn * 32 + nt * 8 + 2 * t + (e & 1);
        if (m >= M || n >= N) continue;
        const int64_t at = m * ldc + n;
        const float v = acc[mt][nt][e];
        st<float>(c, at, beta == 0.0f ? v : __fadd_rn(v, __fmul_rn(beta, ld<float>(c, at))));
      }
    }
  }
#else
  (void)c, (void)ldc, (void)a, (void)lda, (void)w, (void)table, (void)trans_w, (void)M, (void)N, (void)K, (void)beta;
  __trap();
#endif
}

}  // namespace

const char* nf4_gemm_obstacle() {
  if (compute_major() < 8) return "a GPU of compute capability 8.0 or above";
  // A build for older GPUs compiles the kernel's body out (it traps): 8.0 code or nothing.
  cudaFuncAttributes attr{};
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&attr, nf4_gemm_kernel<__nv_bfloat16>));
  if (attr.ptxVersion < 80) return "a build with kernels for compute capability 8.0 or above (CMAKE_CUDA_ARCHITECTURES)";
  return nullptr;
}

void nf4_gemm(Stream s, Arr c, int64_t ldc, Arr a, int64_t lda, const Nf4Piece* pieces, int n_pieces, bool trans_w,
              int64_t M, int64_t N, int64_t K, double beta) {
  if (M == 0 || N == 0) return;
  if (n_pieces < 1 || n_pieces > kNf4GemmMaxPieces) throw std::invalid_argument("nf4_gemm: 1 to 8 pieces");
  Nf4PieceSet w{};
  for (int k = 0; k < n_pieces; ++k) w.p[k] = pieces[k];
  w.n = n_pieces;
  const size_t shared = size_t{2} * kNf4GemmTile * kNf4GemmPitch * 2;
  // Rows in launches of at most 65535 blocks down (gridDim.y's limit: 4M tokens a launch).
  const int64_t rows_per_launch = int64_t{65535} * kNf4GemmTile;
  for (int64_t m0 = 0; m0 < M; m0 += rows_per_launch) {
    const int64_t rows = std::min(rows_per_launch, M - m0);
    const dim3 grid(static_cast<unsigned>((N + kNf4GemmTile - 1) / kNf4GemmTile),
                    static_cast<unsigned>((rows + kNf4GemmTile - 1) / kNf4GemmTile));
    const Arr cm{static_cast<char*>(c.p) + m0 * ldc * static_cast<int64_t>(dtype_size(c.dtype)), c.dtype};
    const auto launch = [&](auto tag) {
      using S = decltype(tag);
      auto& kernel = nf4_gemm_kernel<S>;
      FERRY_LAUNCH(kernel, grid, kNf4GemmThreads, shared, as_stream(s), cm, ldc, static_cast<const S*>(a.p) + m0 * lda,
                   lda, w, nf4_values(), trans_w, rows, N, K, static_cast<float>(beta));
    };
    if (a.dtype == DType::bf16) {
      launch(__nv_bfloat16{});
    } else {
      launch(__half{});
    }
    FERRY_CUDA_CHECK_LAUNCH();
  }
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
