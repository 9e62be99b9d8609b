// Column reductions, dst[c] += sum over rows of a term: bias gradients (column_sums), dwpe
// (embedding backward) and the norms' weight gradients. Included by those kernel files; the
// kernels are templates in each file's own anonymous namespace.
#pragma once

#include "nn/cuda/common.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
namespace {
using namespace detail;

// ---- column reductions: dst[c] += sum over rows n of term(n, c) ------------------------------
// Bias gradients, the norms' weight gradients and dwpe. Two passes, both in a fixed order,
// so the result depends only on the shapes and the block size, never on timing:
// pass 1 (column_partials_kernel): the grid is column tiles x row chunks. A block is 32
//   consecutive columns (lane = column, so each warp loads one coalesced segment per row)
//   by R = blockDim.x / 32 row lanes; row lane r adds rows r, r + R, ... of its chunk in
//   order, then row lane 0 adds the R lane sums in lane order and writes the chunk's
//   partial sum to scratch.
// pass 2 (column_finish_kernel): one thread per column adds its chunks' partials in chunk
//   order and adds the total to the destination (rounded once, as the CPU device does).
// Cost (H100, N = 8192 rows, C = 768, 256 threads): pass 1 is 24 tiles x 32 chunks = 768
// blocks of 32 loads per thread, all coalesced, enough warps in flight to stream at memory
// speed (N C elements read once); pass 2 reads 32 C partials. The one-thread-per-column
// kernel it replaces ran 3 blocks walking all N rows, latency bound.
// A term has K outputs (layernorm: dw and db) and adds row n's contributions to s[0..K-1];
// `at` = n * C + c.

constexpr int kRowsPerLane = 32;                 // rows per row lane per chunk (pass 1)
constexpr int kRowsInFlight = 8;                 // rows a row lane loads at once (pass 1)
constexpr int64_t kMaxPartials = int64_t{1} << 20;  // scratch elements: 4 MiB f32, 8 MiB f64
constexpr int64_t kMaxChunks = 65535;              // gridDim.y

template <class A, class X>
struct ColumnSumTerm {  // column_sums; dwpe (dout as [N / T, T C])
  static constexpr int K = 1;
  X src;
  __device__ void add(A* s, int64_t at, int64_t) const {
    s[0] += src[at];
  }
};

// partial: [K][gridDim.y][C].
template <class A, class Term>
__global__ void column_partials_kernel(Term term, int64_t N, int64_t C, int64_t chunk_rows,
                                       A* partial) {
  constexpr int K = Term::K;
  __shared__ A lane_sums[K][kMaxThreads];
  const int lane = threadIdx.x & 31, r = threadIdx.x >> 5, R = blockDim.x >> 5;
  const int64_t c = blockIdx.x * int64_t{32} + lane;
  const int64_t n0 = blockIdx.y * chunk_rows;
  const int64_t n1 = n0 + chunk_rows < N ? n0 + chunk_rows : N;
  A s[K];
  for (int k = 0; k < K; ++k) s[k] = 0;
  if (c < C) {
    // kRowsInFlight rows per step, unrolled: their loads issue together (no stores between
    // them) and the sums still take the rows in order. A loop of one row at a time waited
    // out each load's latency: 23 us a launch at N = 8192 on an H200 (docs/design/measured.md).
    int64_t n = n0 + r;
    for (; n + (kRowsInFlight - 1) * R < n1; n += kRowsInFlight * R) {
      FERRY_UNROLL
      for (int u = 0; u < kRowsInFlight; ++u) term.add(s, (n + u * R) * C + c, n + u * R);
    }
    for (; n < n1; n += R) term.add(s, n * C + c, n);
  }
  for (int k = 0; k < K; ++k) lane_sums[k][threadIdx.x] = s[k];
  __syncthreads();
  if (r == 0 && c < C) {
    for (int k = 0; k < K; ++k) {
      A t = lane_sums[k][lane];
      for (int q = 1; q < R; ++q) t += lane_sums[k][q * 32 + lane];
      partial[(k * int64_t{gridDim.y} + blockIdx.y) * C + c] = t;
    }
  }
}

// out_k[c] += sum over chunks of partial[k][chunk][c], k < K (out1 unused when K = 1).
template <class A>
__global__ void column_finish_kernel(Arr out0, Arr out1, int K, const A* partial,
                                     int64_t chunks, int64_t C) {
  FERRY_FOR_EACH(i, K * C) {
    const int64_t k = i / C, c = i % C;
    A t = 0;
    int64_t q = 0;
    for (; q + kRowsInFlight <= chunks; q += kRowsInFlight) {  // loads together, sums in order
      FERRY_UNROLL
      for (int u = 0; u < kRowsInFlight; ++u) t += partial[(k * chunks + q + u) * C + c];
    }
    for (; q < chunks; ++q) t += partial[(k * chunks + q) * C + c];
    const Arr& out = k == 0 ? out0 : out1;
    st<A>(out, c, ld<A>(out, c) + t);
  }
}

// The two passes of a column reduction of N rows of C columns into out0 (and out1 when
// Term::K = 2). Row chunks of kRowsPerLane rows per row lane, fewer and longer when the
// partials would pass kMaxPartials elements (C > 1M columns still gets one chunk).
template <class A, class Term>
void reduce_columns(cudaStream_t st, const Term& term, int64_t N, int64_t C, Arr out0, Arr out1) {
  constexpr int K = Term::K;
  if (N * C == 0) return;
  const int threads = block_threads();
  const int64_t rows_per_chunk = int64_t{threads / 32} * kRowsPerLane;
  const int64_t cap = std::clamp<int64_t>(kMaxPartials / (K * C), 1, kMaxChunks);
  int64_t chunks = std::min((N + rows_per_chunk - 1) / rows_per_chunk, cap);
  const int64_t chunk_rows = (N + chunks - 1) / chunks;
  chunks = (N + chunk_rows - 1) / chunk_rows;  // no empty chunk
  StreamScratch partial(st, static_cast<size_t>(K * chunks * C) * sizeof(A));
  const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks));
  A* const part = partial.get<A>();
  auto& pass1 = column_partials_kernel<A, Term>;  // a reference: FERRY_LAUNCH takes its address
  FERRY_LAUNCH(pass1, grid, threads, 0, st, term, N, C, chunk_rows, part);
  FERRY_CUDA_CHECK_LAUNCH();
  FERRY_LAUNCH(column_finish_kernel<A>, grid_for(K * C), threads, 0, st, out0, out1, K, part,
               chunks, C);
  FERRY_CUDA_CHECK_LAUNCH();
  partial.release();
}

}  // namespace
FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
