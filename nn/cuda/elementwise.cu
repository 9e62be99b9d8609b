// Elementwise kernels (cast, fill, add, accumulate, scale, add_bias, dropout_rows): 16 bytes
// per operand per thread step where the operands allow it (docs/design/cuda.md, "Memory-bound
// kernels"); column sums (bias gradients) and the sum of squares (gradient norms).
// Also the emulation's block-size switch (nn/cuda_kernels.h).
#include "nn/cuda/column_reduce.cuh"
#include "nn/dropout_mask.h"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

// Each kernel takes its operands as Operand<A, S> (S the storage type, or Arr for the
// uncommon mixes) and `chunks` vector chunks (vector_chunks: 0 where an operand is
// misaligned or untyped): a thread moves 16 bytes per operand per chunk, then the tail
// elements one by one.

template <class A, class D, class X>
__global__ void cast_kernel(D dst, X src, int64_t n, int64_t chunks) {
  constexpr int W = kChunkWidth<D, X>;
  for_each_chunk<W>(
      n, chunks,
      [&](int64_t j) {
        A x[W];
        src.load(j, x);
        dst.store(j, x);
      },
      [&](int64_t i) { dst.set(i, src[i]); });
}

template <class A, class D>
__global__ void fill_kernel(D dst, A value, int64_t n, int64_t chunks) {
  constexpr int W = D::kWidth;
  for_each_chunk<W>(
      n, chunks,
      [&](int64_t j) {
        A x[W];
        for (A& e : x) e = value;
        dst.store(j, x);
      },
      [&](int64_t i) { dst.set(i, value); });
}

template <class A, class X>
__global__ void add_kernel(X out, X a, X b, int64_t n, int64_t chunks) {
  constexpr int W = X::kWidth;
  for_each_chunk<W>(
      n, chunks,
      [&](int64_t j) {
        A x[W], y[W];
        a.load(j, x);
        b.load(j, y);
        FERRY_UNROLL
        for (int k = 0; k < W; ++k) x[k] = x[k] + y[k];
        out.store(j, x);
      },
      [&](int64_t i) { out.set(i, a[i] + b[i]); });
}

template <class A, class X>
__global__ void scale_kernel(X x, A f, int64_t n, int64_t chunks) {
  constexpr int W = X::kWidth;
  for_each_chunk<W>(
      n, chunks,
      [&](int64_t j) {
        A v[W];
        x.load(j, v);
        FERRY_UNROLL
        for (int k = 0; k < W; ++k) v[k] = v[k] * f;
        x.store(j, v);
      },
      [&](int64_t i) { x.set(i, x[i] * f); });
}

// Rows of C: a thread keeps its cell's column as it strides (for_each_cell), so no per-element
// modulo; vectorised as chunks of the row when C is a multiple of the chunk width.
template <class A, class X>
__global__ void add_bias_kernel(X out, X bias, int64_t N, int64_t C, bool vectors) {
  constexpr int W = X::kWidth;
  if (vectors) {
    for_each_cell(N, C / W, [&](int64_t j, int64_t, int64_t c) {
      A x[W], b[W];
      out.load(j, x);
      bias.load(c, b);
      FERRY_UNROLL
      for (int k = 0; k < W; ++k) x[k] = x[k] + b[k];
      out.store(j, x);
    });
  } else {
    for_each_cell(N, C, [&](int64_t i, int64_t, int64_t c) { out.set(i, out[i] + bias[c]); });
  }
}

// Rows of C as add_bias walks them; each element's mask word from its global row and its
// column alone (nn/dropout_mask.h), so the vector and the scalar paths, any block size and
// the CPU device agree bit for bit. The row's hash is computed once per chunk (a chunk lies
// in one row when C is a multiple of the chunk width). A dropped element is stored as 0,
// not as x * 0, so that it does not depend on x.
template <class A, class X>
__global__ void dropout_rows_kernel(X out, X in, int64_t N, int64_t C, uint64_t key, int64_t row0,
                                    uint64_t threshold, A scale, bool vectors) {
  constexpr int W = X::kWidth;
  if (vectors) {
    for_each_cell(N, C / W, [&](int64_t j, int64_t r, int64_t c) {
      A x[W];
      in.load(j, x);
      // dropout_word(rh, col) = mix(rh + (col + 1) G): the chunk's columns by adding G, not
      // by a 64-bit multiply each (the same words, mod 2^64).
      uint64_t z = dropout_row_hash(key, row0 + r) + (static_cast<uint64_t>(c * W) + 1) * kDropoutGamma;
      FERRY_UNROLL
      for (int k = 0; k < W; ++k, z += kDropoutGamma) x[k] = dropout_mix(z) >= threshold ? x[k] * scale : A(0);
      out.store(j, x);
    });
  } else {
    for_each_cell(N, C, [&](int64_t i, int64_t r, int64_t c) {
      const bool keep = dropout_word(dropout_row_hash(key, row0 + r), c) >= threshold;
      out.set(i, keep ? in[i] * scale : A(0));
    });
  }
}

// Squares summed in double per thread (16-byte chunks of x where aligned, then the tail),
// then over the block; one partial per block.
template <class X>
__global__ void sum_squares_kernel(X x, int64_t n, int64_t chunks, double* partial) {
  constexpr int W = X::kWidth;
  __shared__ double scratch[32];
  double s = 0;
  for_each_chunk<W>(
      n, chunks,
      [&](int64_t j) {
        double v[W];
        x.load(j, v);
        FERRY_UNROLL
        for (int k = 0; k < W; ++k) s += v[k] * v[k];
      },
      [&](int64_t i) {
        const double v = x[i];
        s += v * v;
      });
  s = block_reduce(s, scratch, Sum{});
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials_kernel(double* partial, int count) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    double total = 0;
    for (int i = 0; i < count; ++i) total += partial[i];  // in block order: deterministic
    partial[count] = total;
  }
}

}  // namespace

void cast(Stream s, Arr dst, Arr src, int64_t n) {
  if (n == 0) return;
  // i32 through double too: every i32 and every f32 is exact there.
  by_acc(wide(dst, src) || dst.dtype == DType::i32 || src.dtype == DType::i32, [&](auto a) {
    using A = decltype(a);
    by_type<A>(dst, [&](auto d) {
      by_type<A>(src, [&](auto x) {
        using D = Operand<A, typename decltype(d)::type>;
        using X = Operand<A, typename decltype(x)::type>;
        const int64_t chunks = vector_chunks<D, X>(n, {dst.p, src.p});
        auto& kernel = cast_kernel<A, D, X>;  // a reference: FERRY_LAUNCH takes its address
        constexpr int W = kChunkWidth<D, X>;
        FERRY_LAUNCH(kernel, grid_for_chunks(n, chunks, W), block_threads(), 0, as_stream(s),
                     D(dst), X(src), n, chunks);
      });
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void fill(Stream s, Arr dst, double value, int64_t n) {
  if (n == 0) return;
  by_acc(wide(dst) || dst.dtype == DType::i32, [&](auto a) {
    using A = decltype(a);
    by_type<A>(dst, [&](auto d) {
      using D = Operand<A, typename decltype(d)::type>;
      const int64_t chunks = vector_chunks<D>(n, {dst.p});
      auto& kernel = fill_kernel<A, D>;
      FERRY_LAUNCH(kernel, grid_for_chunks(n, chunks, D::kWidth), block_threads(), 0, as_stream(s),
                   D(dst), static_cast<A>(value), n, chunks);
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void add(Stream s, Arr out, Arr a, Arr b, int64_t n) {
  if (n == 0) return;
  by_acc(wide(out, a, b), [&](auto t) {
    using A = decltype(t);
    by_storage<A>({out, a, b}, {}, [&](auto x, auto) {
      using X = Operand<A, typename decltype(x)::type>;
      const int64_t chunks = vector_chunks<X>(n, {out.p, a.p, b.p});
      auto& kernel = add_kernel<A, X>;
      FERRY_LAUNCH(kernel, grid_for_chunks(n, chunks, X::kWidth), block_threads(), 0, as_stream(s),
                   X(out), X(a), X(b), n, chunks);
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void accumulate(Stream s, Arr dst, Arr src, int64_t n) {
  add(s, dst, dst, src, n);
}

void scale(Stream s, Arr x, double factor, int64_t n) {
  if (n == 0) return;
  by_acc(wide(x), [&](auto a) {
    using A = decltype(a);
    by_type<A>(x, [&](auto t) {
      using X = Operand<A, typename decltype(t)::type>;
      const int64_t chunks = vector_chunks<X>(n, {x.p});
      auto& kernel = scale_kernel<A, X>;
      FERRY_LAUNCH(kernel, grid_for_chunks(n, chunks, X::kWidth), block_threads(), 0, as_stream(s),
                   X(x), static_cast<A>(factor), n, chunks);
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void add_bias(Stream s, Arr out, Arr bias, int64_t N, int64_t C) {
  if (N * C == 0) return;
  by_acc(wide(out, bias), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({out, bias}, {}, [&](auto x, auto) {
      using X = Operand<A, typename decltype(x)::type>;
      const bool vectors = C % X::kWidth == 0 && vector_chunks<X>(C, {out.p, bias.p}) > 0;
      const int64_t cells = vectors ? N * C / X::kWidth : N * C;
      auto& kernel = add_bias_kernel<A, X>;
      FERRY_LAUNCH(kernel, grid_for(cells), block_threads(), 0, as_stream(s), X(out), X(bias), N,
                   C, vectors);
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void dropout_rows(Stream s, Arr out, Arr in, int64_t N, int64_t C, uint64_t key, int64_t row0, uint64_t threshold,
                  double scale) {
  if (N * C == 0) return;
  by_acc(wide(out, in), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({out, in}, {}, [&](auto x, auto) {
      using X = Operand<A, typename decltype(x)::type>;
      const bool vectors = X::kTyped && C % X::kWidth == 0 && vector_chunks<X>(C, {out.p, in.p}) > 0;
      const int64_t cells = vectors ? N * C / X::kWidth : N * C;
      auto& kernel = dropout_rows_kernel<A, X>;
      FERRY_LAUNCH(kernel, grid_for(cells), block_threads(), 0, as_stream(s), X(out), X(in), N, C, key, row0,
                   threshold, static_cast<A>(scale), vectors);
    });
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void column_sums(Stream s, Arr dst, Arr src, int64_t N, int64_t C) {
  by_acc(wide(dst, src), [&](auto a) {
    using A = decltype(a);
    by_storage<A>({src}, {}, [&](auto x, auto) {
      using X = Operand<A, typename decltype(x)::type>;
      reduce_columns<A>(as_stream(s), ColumnSumTerm<A, X>{X(src)}, N, C, dst, Arr{});
    });
  });
}

void sum_squares(Stream s, Arr x, int64_t n, double* partial) {
  by_type<float>(x, [&](auto t) {  // the storage type only: the sum is in double
    using X = Operand<double, typename decltype(t)::type>;
    const int64_t chunks = vector_chunks<X>(n, {x.p});
    auto& kernel = sum_squares_kernel<X>;  // a reference: FERRY_LAUNCH takes its address
    FERRY_LAUNCH(kernel, kSumSquaresBlocks, block_threads(), 0, as_stream(s), X(x), n, chunks,
                 partial);
  });
  FERRY_CUDA_CHECK_LAUNCH();
  FERRY_LAUNCH(sum_partials_kernel, 1, 32, 0, as_stream(s), partial, kSumSquaresBlocks);
  FERRY_CUDA_CHECK_LAUNCH();
}

#ifdef FERRY_CUDA_EMULATION
void set_emulated_block_threads(int generic, int attention) {
  for (int t : {generic, attention}) {
    if (t < 32 || t > kMaxThreads || t % 32 != 0) {
      throw std::invalid_argument("set_emulated_block_threads: " + std::to_string(t) +
                                  " threads per block; multiples of 32 in [32, " +
                                  std::to_string(kMaxThreads) + "] only");
    }
  }
  emulated_threads = generic;
  emulated_attn_threads = attention;
}
#endif

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
