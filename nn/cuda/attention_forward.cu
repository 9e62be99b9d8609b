// Attention forward (Device::attention_forward): FlashAttention-2's tiled forward in SIMT
// form, for every dtype; where tensor cores can run (attention.cuh: use_tensor_cores) the
// launcher hands over to nn/cuda/attention_tc.cu.
#include "nn/cuda/attention.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

// Forward: one block per (query tile, head, batch), largest tiles first. Per key tile the
// warp's rows take the tile's max (shuffles), rescale their running sums and outputs, and
// add p v with p from the warp's slice of shared memory.
template <class A, class X, class Y, int P>
__global__ void flash_forward_kernel(Arr out, Y lse, X qkv, AttnShape s, const int32_t* doc_start) {
  FERRY_DYNAMIC_SHARED(smem_raw);
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows = warps * kRowsPerWarp;
  const int kld = static_cast<int>(s.hs) + 1, hs = static_cast<int>(s.hs);
  A* qs = reinterpret_cast<A*>(smem_raw);  // [rows][hs]
  A* ks = qs + rows * s.hs;                // [kTile][hs + 1]
  A* vs = ks + kTile * kld;                // [kTile][hs]
  A* ps = vs + kTile * s.hs;               // [warps][kRowsPerWarp][kTile]
  const int64_t tiles = gridDim.x;
  const int64_t i0 = (tiles - 1 - blockIdx.x) * rows, h = blockIdx.y, b = blockIdx.z, kv = h / s.group;
  const A scale = A(1) / sqrt(static_cast<A>(s.hs));
  load_tile<A>(qs, static_cast<int>(s.hs), qkv, b * s.T, i0, rows, s.T, s.W, h * s.hs, s.hs);
  int64_t lo = i0;
  for (int r = 0; r < rows && i0 + r < s.T; ++r) lo = imin(lo, first_key(doc_start, b, s.T, i0 + r));
  const int64_t hi = imin(i0 + rows, s.T);
  A m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][P];
  int64_t start[kRowsPerWarp];
FERRY_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    m[rr] = -INFINITY;
    l[rr] = 0;
    start[rr] = i < s.T ? first_key(doc_start, b, s.T, i) : s.T;
FERRY_UNROLL
    for (int k = 0; k < P; ++k) o[rr][k] = 0;
  }
  A* wp = ps + warp * kRowsPerWarp * kTile;
  for (int64_t j0 = lo; j0 < hi; j0 += kTile) {
    __syncthreads();  // the previous tile has been read by every warp
    load_tile<A>(ks, kld, qkv, b * s.T, j0, kTile, s.T, s.W, (s.NH + kv) * s.hs, s.hs);
    load_tile<A>(vs, static_cast<int>(s.hs), qkv, b * s.T, j0, kTile, s.T, s.W, (s.NH + s.KVH + kv) * s.hs, s.hs);
    __syncthreads();
    A sc[kRowsPerWarp];
FERRY_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) sc[rr] = 0;
    const A* krow = ks + lane * kld;
    const A* q0 = qs + warp * kRowsPerWarp * s.hs;
    for (int d = 0; d < hs; ++d) {
      const A kd = krow[d];
FERRY_UNROLL
      for (int rr = 0; rr < kRowsPerWarp; ++rr) sc[rr] += q0[rr * hs + d] * kd;
    }
    const int64_t j = j0 + lane;
FERRY_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t i = i0 + warp * kRowsPerWarp + rr;
      const bool visible = i < s.T && j >= start[rr] && j <= i;
      const A sv = visible ? sc[rr] * scale : A(-INFINITY);
      const A tmax = warp_max(sv);
      // Warp-uniform: a row with no visible key in this tile keeps its state.
      const A mnew = tmax > m[rr] ? tmax : m[rr];
      const A alpha = mnew == A(-INFINITY) ? A(1) : exp(m[rr] - mnew);
      wp[rr * kTile + lane] = visible ? exp(sv - mnew) : A(0);
      m[rr] = mnew;
      l[rr] *= alpha;
FERRY_UNROLL
      for (int k = 0; k < P; ++k) o[rr][k] *= alpha;
    }
    __syncwarp();
    for (int c = 0; c < kTile; ++c) {
      A p[kRowsPerWarp];
FERRY_UNROLL
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        p[rr] = wp[rr * kTile + c];
        l[rr] += p[rr];
      }
      const A* vrow = vs + c * hs;
FERRY_UNROLL
      for (int k = 0; k < P; ++k) {
        const int d = lane + 32 * k;
        if (d < hs) {
          const A v = vrow[d];
FERRY_UNROLL
          for (int rr = 0; rr < kRowsPerWarp; ++rr) o[rr][k] += p[rr] * v;
        }
      }
    }
    __syncwarp();  // every lane has read the slice before the next tile writes it
  }
FERRY_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    if (i >= s.T) continue;
FERRY_UNROLL
    for (int k = 0; k < P; ++k) {
      const int d = lane + 32 * k;
      if (d < hs) st<A>(out, (b * s.T + i) * s.C + h * s.hs + d, o[rr][k] / l[rr]);
    }
    if (lane == 0) lse.set((b * s.NH + h) * s.T + i, m[rr] + log(l[rr]));
  }
}

}  // namespace

void attention_forward(Stream s, Arr out, Arr lse, Arr qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, int64_t KVH, const int32_t* doc_start, AttentionKernel kernel) {
  if (B * T == 0) return;
  const AttnShape sh = attn_shape(T, C, NH, KVH);
  const int threads = attn_threads(), warps = threads / 32, rows = warps * kRowsPerWarp;
  const AttnPath path = attention_path(kernel, {qkv, out}, lse, sh.hs, "attention_forward");
  if (path == AttnPath::mma) {
    attention_forward_mma(as_stream(s), out, lse, qkv, sh, B, doc_start);
    return;
  }
  if (path == AttnPath::wmma) {
    attention_forward_tc(as_stream(s), out, lse, qkv, sh, B, doc_start);
    return;
  }
  by_acc(wide(out, lse, qkv), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({qkv}, {lse}, [&](auto x, auto y) {
      using X = Operand<A, typename decltype(x)::type>;
      using Y = Operand<A, typename decltype(y)::type>;
      by_lanes(sh.hs, [&](auto lanes) {
        // A reference: the opt-in's key is the kernel's address.
        auto& kernel = flash_forward_kernel<A, X, Y, decltype(lanes)::value>;
        const SharedFit fit = fit_shared(kernel, static_cast<size_t>(forward_shared(warps, sh.hs)) * sizeof(A),
                                         "attention_forward", sh);
        opt_in_shared(kernel, fit);
        const dim3 grid(static_cast<unsigned>((T + rows - 1) / rows), static_cast<unsigned>(NH),
                        static_cast<unsigned>(B));
        FERRY_LAUNCH(kernel, grid, threads, fit.dynamic, as_stream(s), out, Y(lse), X(qkv), sh, doc_start);
      });
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
