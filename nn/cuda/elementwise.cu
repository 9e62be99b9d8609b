// Elementwise kernels (cast, fill, add, accumulate, scale, add_bias), column sums (bias
// gradients) and the sum of squares (gradient norms): one thread per element, grid-stride.
// Also the emulation's block-size switch (nn/cuda_kernels.h).
#include "nn/cuda/column_reduce.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
using namespace detail;

namespace {

template <class A>
__global__ void cast_kernel(Arr dst, Arr src, int64_t n) {
  FERRY_FOR_EACH(i, n) st<A>(dst, i, ld<A>(src, i));
}

template <class A>
__global__ void fill_kernel(Arr dst, A value, int64_t n) {
  FERRY_FOR_EACH(i, n) st<A>(dst, i, value);
}

template <class A>
__global__ void add_kernel(Arr out, Arr a, Arr b, int64_t n) {
  FERRY_FOR_EACH(i, n) st<A>(out, i, ld<A>(a, i) + ld<A>(b, i));
}

template <class A>
__global__ void scale_kernel(Arr x, A f, int64_t n) {
  FERRY_FOR_EACH(i, n) st<A>(x, i, ld<A>(x, i) * f);
}

template <class A>
__global__ void add_bias_kernel(Arr out, Arr bias, int64_t N, int64_t C) {
  FERRY_FOR_EACH(i, N * C) st<A>(out, i, ld<A>(out, i) + ld<A>(bias, i % C));
}

template <class A>
__global__ void sum_squares_kernel(Arr x, int64_t n, double* partial) {
  __shared__ double scratch[32];
  double s = 0;
  FERRY_FOR_EACH(i, n) {
    const double v = ld<double>(x, i);
    s += v * v;
  }
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
    FERRY_LAUNCH(cast_kernel<decltype(a)>, grid_for(n), block_threads(), 0, as_stream(s), dst, src, n);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void fill(Stream s, Arr dst, double value, int64_t n) {
  if (n == 0) return;
  by_acc(wide(dst) || dst.dtype == DType::i32, [&](auto a) {
    using A = decltype(a);
    FERRY_LAUNCH(fill_kernel<A>, grid_for(n), block_threads(), 0, as_stream(s), dst, static_cast<A>(value),
                 n);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void add(Stream s, Arr out, Arr a, Arr b, int64_t n) {
  if (n == 0) return;
  by_acc(wide(out, a, b), [&](auto t) {
    FERRY_LAUNCH(add_kernel<decltype(t)>, grid_for(n), block_threads(), 0, as_stream(s), out, a, b, n);
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
    FERRY_LAUNCH(scale_kernel<A>, grid_for(n), block_threads(), 0, as_stream(s), x, static_cast<A>(factor),
                 n);
  });
  FERRY_CUDA_CHECK_LAUNCH();
}

void add_bias(Stream s, Arr out, Arr bias, int64_t N, int64_t C) {
  if (N * C == 0) return;
  by_acc(wide(out, bias), [&](auto a) {
    FERRY_LAUNCH(add_bias_kernel<decltype(a)>, grid_for(N * C), block_threads(), 0, as_stream(s), out,
                 bias, N, C);
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
  FERRY_LAUNCH(sum_squares_kernel<double>, kSumSquaresBlocks, block_threads(), 0, as_stream(s), x, n,
               partial);
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
