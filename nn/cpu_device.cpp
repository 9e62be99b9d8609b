#include "nn/cpu_device.h"

#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "nn/cpu_attention.h"
#include "nn/cpu_gemm.h"
#include "nn/cpu_kernels.h"
#include "nn/dropout_mask.h"
#include "nn/llama_kernels.h"
#include "nn/nf4_matmul.h"
#include "nn/op_checks.h"

namespace ferry::nn {

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.2f %s (%zu bytes)", v, units[u], bytes);
  return buf;
}

OutOfDeviceMemory::OutOfDeviceMemory(const std::string& device, size_t req, size_t used,
                                     size_t cap)
    : std::runtime_error("out of device memory on " + device + ": asked for " +
                         format_bytes(req) + " with " + format_bytes(used) +
                         " in use, cap (device.memory) " + format_bytes(cap)),
      requested(req),
      in_use(used),
      capacity(cap) {}

namespace {

constexpr size_t kAlign = 64;
// The unit cudaHostRegister locks (64 KiB on some ARM servers, so asked, not assumed).
size_t page_bytes() {
  static const size_t page = [] {
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<size_t>(p) : size_t{4096};
  }();
  return page;
}

[[noreturn]] void fail(const char* op, const std::string& what) { checks::fail("cpu", op, what); }

void expect_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) {
    fail(op, a.describe() + " vs " + b.describe());
  }
}

void expect_dtype(const char* op, const Tensor& t, DType d) {
  if (t.dtype() != d) {
    fail(op, "expected " + std::string(dtype_name(d)) + ", got " + t.describe());
  }
}

// Runs f(T{}) for the floating dtypes every op supports.
template <class F>
void dispatch(const char* op, DType t, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    default: fail(op, std::string("dtype ") + std::string(dtype_name(t)) + " is not supported");
  }
}

template <class T>
T* ptr(const Tensor& t) {
  return t.data_as<T>();
}

using checks::rows_of;

template <class... Ts>
bool any_low(const Ts&... t) {
  return (is_low_precision(t.dtype()) || ...);
}

// f32 products on a CPU with AVX-512 (nn/cpu_gemm.h), down to a rank-16 adapter's
// products (16 columns, or 16 rows), where reading the thin operand's partner in place made
// it 1.1-2.6x Eigen's rate on two cores; narrower than 16 columns (rank 8) Eigen does better.
bool f32_kernel(const Tensor& c, int64_t M, int64_t N) {
  return c.dtype() == DType::f32 && M >= 8 && N >= 16 && cpu::f32_gemm_available();
}

// bf16 operands on a CPU with AVX512-BF16: multiplied in bf16 by nn/cpu_gemm.h into
// an f32 or bf16 output, with the same contract as the widened path (exact products,
// fp32 sums, one rounding) and neither widened copy.
bool bf16_kernel(const Tensor& c, const Tensor& a, const Tensor& b) {
  return a.dtype() == DType::bf16 && b.dtype() == DType::bf16 &&
         (c.dtype() == DType::bf16 || c.dtype() == DType::f32) && cpu::bf16_gemm_available();
}

}  // namespace

// bf16 and f16 are computed as a GPU kernel computes them: each low-precision operand is
// widened to f32 (scratch outside the arena, which holds only what a GPU would), the f32
// kernel runs, and each output is rounded once on the way back. Outputs an op adds into
// are widened first, so the sum is rounded once. Low-precision and f32 operands mix freely
// (bf16 activations with f32 weight gradients); f64 never mixes.
class CpuDevice::Widen {
 public:
  explicit Widen(CpuDevice& dev) : dev_(dev) {}
  Tensor in(const Tensor& t) {
    if (!t.defined() || !is_low_precision(t.dtype())) return t;
    Tensor w = Tensor::empty(*dev_.scratch_, DType::f32, t.shape());
    dev_.cast(w, t);
    return w;
  }
  Tensor out(const Tensor& t, bool accumulates) {
    if (!t.defined() || !is_low_precision(t.dtype())) return t;
    Tensor w = accumulates ? in(t) : Tensor::empty(*dev_.scratch_, DType::f32, t.shape());
    back_.emplace_back(t, w);
    return w;
  }
  void store() {
    for (const auto& [low, wide] : back_) dev_.cast(low, wide);
  }

 private:
  CpuDevice& dev_;
  std::vector<std::pair<Tensor, Tensor>> back_;
};

CpuDevice::CpuDevice(size_t capacity_bytes, int threads) {
  stats_.capacity = capacity_bytes;
  threads_ = threads > 0 ? threads : omp_get_max_threads();
  omp_set_num_threads(threads_);
  // Not Eigen::setNbThreads: it writes a process-wide static that every Eigen product
  // reads, from any thread, unsynchronized (ThreadSanitizer caught two ranks' devices
  // constructed at once). Left unset, Eigen asks omp_get_max_threads() of the thread
  // running the product, which on this thread is threads_ from the line above.
  if (capacity_bytes != kScratchCapacity) scratch_ = std::make_unique<CpuDevice>(kScratchCapacity, threads_);
}

CpuDevice::~CpuDevice() = default;

std::string CpuDevice::name() const {
  return "cpu (" + std::to_string(threads_) + " threads, cap " + format_bytes(stats_.capacity) + ")";
}

void* CpuDevice::allocate(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes > stats_.capacity - stats_.in_use) {  // in_use <= capacity always holds
      throw OutOfDeviceMemory("the cpu device", bytes, stats_.in_use, stats_.capacity);
    }
    stats_.in_use += bytes;
    stats_.peak = std::max(stats_.peak, stats_.in_use);
  }
  Pinning pin;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pinning_.pin && bytes >= pinning_.min_bytes) pin = pinning_;
  }
  // A page-locked allocation owns its pages: registrations must not share one.
  const size_t align = pin.pin ? page_bytes() : kAlign;
  const size_t rounded = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  if (!p) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.in_use -= bytes;
    throw std::bad_alloc();
  }
  if (pin.pin) {
    const std::string why = pin.pin(p, rounded);
    std::lock_guard<std::mutex> lock(mu_);
    if (why.empty()) {
      pinned_[p] = rounded;
      pinned_bytes_ += rounded;
    } else if (pin_problem_.empty()) {
      pin_problem_ = why;
    }
  }
  return p;
}

void CpuDevice::deallocate(void* ptr, size_t bytes) noexcept {
  std::function<void(void*)> unpin;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.in_use -= bytes;
    if (auto it = pinned_.find(ptr); it != pinned_.end()) {
      unpin = pinning_.unpin;
      pinned_bytes_ -= it->second;
      pinned_.erase(it);
    }
  }
  if (unpin) unpin(ptr);
  std::free(ptr);
}

void CpuDevice::set_pinning(Pinning p) {
  std::lock_guard<std::mutex> lock(mu_);
  pinning_ = std::move(p);
}

std::string CpuDevice::pinning_problem() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pin_problem_;
}

size_t CpuDevice::pinned_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pinned_bytes_;
}

MemoryStats CpuDevice::memory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CpuDevice::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak = stats_.in_use;
}

void CpuDevice::copy_from_host(const Tensor& dst, const void* src) {
  std::memcpy(dst.data(), src, dst.nbytes());
}

void CpuDevice::copy_to_host(void* dst, const Tensor& src) {
  std::memcpy(dst, src.data(), src.nbytes());
}

void CpuDevice::copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() != src.dtype() || dst.numel() != src.numel()) {
    fail("copy", dst.describe() + " <- " + src.describe());
  }
  std::memmove(dst.data(), src.data(), src.nbytes());
}

namespace {

double load(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::f32: return t.data_as<float>()[i];
    case DType::f64: return t.data_as<double>()[i];
    case DType::bf16: return bf16_to_f32(t.data_as<uint16_t>()[i]);
    case DType::i32: return t.data_as<int32_t>()[i];
    case DType::f16: return f16_to_f32(t.data_as<uint16_t>()[i]);
  }
  return 0;
}

void store(const Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::f32: t.data_as<float>()[i] = static_cast<float>(v); return;
    case DType::f64: t.data_as<double>()[i] = v; return;
    case DType::bf16: t.data_as<uint16_t>()[i] = f32_to_bf16(static_cast<float>(v)); return;
    case DType::i32: t.data_as<int32_t>()[i] = static_cast<int32_t>(v); return;
    case DType::f16: t.data_as<uint16_t>()[i] = f32_to_f16(static_cast<float>(v)); return;
  }
}

}  // namespace

void CpuDevice::cast(const Tensor& dst, const Tensor& src) {
  if (dst.numel() != src.numel()) fail("cast", dst.describe() + " <- " + src.describe());
  const int64_t n = src.numel();
  if (dst.dtype() == src.dtype()) return copy(dst, src);
  if (is_low_precision(dst.dtype()) && src.dtype() == DType::f32) {
    const float* s = src.data_as<float>();
    uint16_t* d = dst.data_as<uint16_t>();
    const bool bf = dst.dtype() == DType::bf16;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = bf ? f32_to_bf16(s[i]) : f32_to_f16(s[i]);
    return;
  }
  if (dst.dtype() == DType::f32 && is_low_precision(src.dtype())) {
    const uint16_t* s = src.data_as<uint16_t>();
    float* d = dst.data_as<float>();
    const bool bf = src.dtype() == DType::bf16;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = bf ? bf16_to_f32(s[i]) : f16_to_f32(s[i]);
    return;
  }
  // Rare pairs (f64 oracle runs, token ids): through double, which holds every value exactly.
  for (int64_t i = 0; i < n; ++i) store(dst, i, load(src, i));
}

void CpuDevice::fill(const Tensor& dst, double value) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (dst.dtype() == DType::f32) {
    std::fill_n(dst.data_as<float>(), n, static_cast<float>(value));
  } else if (is_low_precision(dst.dtype())) {  // the rounded pattern once, then plain stores
    store(dst, 0, value);
    std::fill_n(dst.data_as<uint16_t>() + 1, n - 1, dst.data_as<uint16_t>()[0]);
  } else {
    for (int64_t i = 0; i < n; ++i) store(dst, i, value);
  }
}

void CpuDevice::gemm(const Tensor& c, const Tensor& a, bool ta, const Tensor& b, bool tb,
                     double alpha, double beta) {
  if (bf16_kernel(c, a, b)) {
    const checks::GemmDims d = checks::gemm("cpu", c, a, ta, b, tb);
    cpu::gemm_bf16(c.data(), c.dtype() == DType::bf16, d.N, ptr<uint16_t>(a), a.dim(1), ta, ptr<uint16_t>(b), b.dim(1),
                   tb, d.M, d.N, d.K, static_cast<float>(alpha), static_cast<float>(beta));
    return;
  }
  if (any_low(c, a, b)) {
    Widen w(*this);
    gemm(w.out(c, beta != 0), w.in(a), ta, w.in(b), tb, alpha, beta);
    return w.store();
  }
  if (a.dtype() != c.dtype() || b.dtype() != c.dtype()) {
    fail("gemm", "needs one dtype: c " + c.describe() + ", a " + a.describe() + ", b " + b.describe());
  }
  // Named copies, not a structured binding: a lambda capturing a binding is C++20 that
  // clang 14 refuses (docs/design/testing.md, "CI time": a clang sanitizer build).
  const checks::GemmDims dims = checks::gemm("cpu", c, a, ta, b, tb);
  const int64_t M = dims.M, N = dims.N, K = dims.K;
  if (f32_kernel(c, M, N)) {
    cpu::gemm_f32(ptr<float>(c), N, ptr<float>(a), a.dim(1), ta, ptr<float>(b), b.dim(1), tb, M, N, K,
                  static_cast<float>(alpha), static_cast<float>(beta));
    return;
  }
  dispatch("gemm", c.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::gemm<T>(ptr<T>(c), ptr<T>(a), ptr<T>(b), M, N, K, ta, tb, static_cast<T>(alpha),
                 static_cast<T>(beta));
  });
}

void CpuDevice::gemm_cols(const Tensor& c, int64_t c_col, int64_t c_cols, const Tensor& a, int64_t a_col,
                          int64_t a_cols, bool ta, const Tensor& b, bool tb, double alpha, double beta) {
  if (bf16_kernel(c, a, b)) {
    const checks::GemmDims d = checks::gemm_cols("cpu", c, c_col, c_cols, a, a_col, a_cols, ta, b, tb);
    if (d.M == 0 || d.N == 0) return;
    const size_t c_bytes = c.dtype() == DType::bf16 ? 2 : 4;
    cpu::gemm_bf16(static_cast<char*>(c.data()) + c_col * c_bytes, c.dtype() == DType::bf16, c.dim(1),
                   ptr<uint16_t>(a) + a_col, a.dim(1), ta, ptr<uint16_t>(b), b.dim(1), tb, d.M, d.N, d.K,
                   static_cast<float>(alpha), static_cast<float>(beta));
    return;
  }
  if (any_low(c, a, b)) {
    Widen w(*this);  // the whole rows widened; the windows are taken in f32
    gemm_cols(w.out(c, true), c_col, c_cols, w.in(a), a_col, a_cols, ta, w.in(b), tb, alpha, beta);
    return w.store();
  }
  if (a.dtype() != c.dtype() || b.dtype() != c.dtype()) {
    fail("gemm_cols", "needs one dtype: c " + c.describe() + ", a " + a.describe() + ", b " + b.describe());
  }
  const checks::GemmDims dims = checks::gemm_cols("cpu", c, c_col, c_cols, a, a_col, a_cols, ta, b, tb);
  const int64_t M = dims.M, N = dims.N, K = dims.K, ldc = c.dim(1), lda = a.dim(1);
  if (M == 0 || N == 0) return;
  if (f32_kernel(c, M, N)) {
    cpu::gemm_f32(ptr<float>(c) + c_col, ldc, ptr<float>(a) + a_col, lda, ta, ptr<float>(b), b.dim(1), tb, M, N, K,
                  static_cast<float>(alpha), static_cast<float>(beta));
    return;
  }
  dispatch("gemm_cols", c.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::gemm_strided<T>(ptr<T>(c) + c_col, ldc, ptr<T>(a) + a_col, lda, ptr<T>(b), M, N, K, ta, tb,
                         static_cast<T>(alpha), static_cast<T>(beta));
  });
}

void CpuDevice::add_bias(const Tensor& out, const Tensor& bias) {
  if (any_low(out, bias)) {
    Widen w(*this);
    add_bias(w.out(out, true), w.in(bias));
    return w.store();
  }
  if (bias.numel() != out.dim(-1) || bias.dtype() != out.dtype()) {
    fail("add_bias", out.describe() + " + " + bias.describe());
  }
  dispatch("add_bias", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::add_bias<T>(ptr<T>(out), ptr<T>(bias), rows_of(out), out.dim(-1));
  });
}

void CpuDevice::bias_backward(const Tensor& dbias, const Tensor& dout) {
  if (any_low(dbias, dout)) {
    Widen w(*this);
    bias_backward(w.out(dbias, true), w.in(dout));
    return w.store();
  }
  if (dbias.numel() != dout.dim(-1) || dbias.dtype() != dout.dtype()) {
    fail("bias_backward", dbias.describe() + " from " + dout.describe());
  }
  dispatch("bias_backward", dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::bias_backward<T>(ptr<T>(dbias), ptr<T>(dout), rows_of(dout), dout.dim(-1));
  });
}

void CpuDevice::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  if (any_low(out, a, b)) {
    Widen w(*this);
    add(w.out(out, false), w.in(a), w.in(b));
    return w.store();
  }
  expect_same_shape("add", out, a);
  expect_same_shape("add", out, b);
  dispatch("add", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* o = ptr<T>(out);
    const T *x = ptr<T>(a), *y = ptr<T>(b);
    const int64_t n = out.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
  });
}

void CpuDevice::accumulate(const Tensor& dst, const Tensor& src) {
  if (any_low(dst, src)) {
    Widen w(*this);
    accumulate(w.out(dst, true), w.in(src));
    return w.store();
  }
  expect_same_shape("accumulate", dst, src);
  dispatch("accumulate", dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* d = ptr<T>(dst);
    const T* s = ptr<T>(src);
    const int64_t n = dst.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] += s[i];
  });
}

double CpuDevice::sum_squares(const Tensor& x) {
  // Fixed-size chunks summed in chunk order: the same result for any thread count.
  constexpr int64_t kChunk = 1 << 14;
  const int64_t n = x.numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < chunks; ++k) {
    double s = 0;
    const int64_t end = std::min(n, (k + 1) * kChunk);
    if (x.dtype() == DType::f32) {
      const float* p = x.data_as<float>();
      for (int64_t i = k * kChunk; i < end; ++i) s += static_cast<double>(p[i]) * p[i];
    } else {
      for (int64_t i = k * kChunk; i < end; ++i) s += load(x, i) * load(x, i);
    }
    partial[static_cast<size_t>(k)] = s;
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

void CpuDevice::scale(const Tensor& x, double factor) {
  if (any_low(x)) {
    Widen w(*this);
    scale(w.out(x, true), factor);
    return w.store();
  }
  dispatch("scale", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = ptr<T>(x);
    const T f = static_cast<T>(factor);
    const int64_t n = x.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] *= f;
  });
}

namespace {

// dropout_rows over storage S computed in A (nn/dropout_mask.h): load widens to A, store
// rounds once, as the cuda kernel's Operand does. Rows in parallel; each element's value
// depends on its position alone.
template <class A, class Load, class Store>
void dropout_rows_cpu(int64_t N, int64_t C, uint64_t key, int64_t row0, uint64_t threshold, A scale, Load load,
                      Store store) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    // dropout_word(rh, j) = mix(rh + (j + 1) G), the columns' words by adding G (mod 2^64).
    uint64_t z = dropout_row_hash(key, row0 + i) + kDropoutGamma;
    for (int64_t j = 0; j < C; ++j, z += kDropoutGamma) {
      const int64_t k = i * C + j;
      store(k, dropout_mix(z) >= threshold ? load(k) * scale : A(0));
    }
  }
}

}  // namespace

// Rows dequantized in parallel (each row's elements are independent), then rounded once to
// the panel's dtype: the values nf4_dequantize_rect gives, whatever the thread count.
void CpuDevice::nf4_dequantize(const Tensor& panel, const Tensor& blob, const Nf4Layout& l, int64_t r0, int64_t c0) {
  checks::nf4_dequantize("cpu", panel, blob, l, r0, c0);
  const int64_t R = panel.dim(0), C = panel.dim(1);
  if (R * C == 0) return;
  const auto* bytes = static_cast<const uint8_t*>(blob.data());
  const DType t = panel.dtype();
  void* out = panel.data();
  if (is_low_precision(t)) {  // straight to 16 bits from per-block tables of rounded values
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      nf4_dequantize_rect_16(bytes, l, r0 + r, 1, c0, C, static_cast<uint16_t*>(out) + r * C, C, t == DType::bf16);
    }
    return;
  }
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      nf4_dequantize_rect(bytes, l, r0 + r, 1, c0, C, row.data());
      const auto at = static_cast<size_t>(r * C);
      for (size_t c = 0; c < row.size(); ++c) {
        switch (t) {
          case DType::f32: static_cast<float*>(out)[at + c] = row[c]; break;
          case DType::f64: static_cast<double*>(out)[at + c] = row[c]; break;
          case DType::bf16: static_cast<uint16_t*>(out)[at + c] = f32_to_bf16(row[c]); break;
          case DType::f16: static_cast<uint16_t*>(out)[at + c] = f32_to_f16(row[c]); break;
          case DType::i32: break;  // refused by the checks
        }
      }
    }
  }
}

bool CpuDevice::nf4_gemm_direct(DType c, DType a) {
  return a == DType::bf16 && (c == DType::bf16 || c == DType::f32) && cpu::bf16_gemm_available();
}

bool CpuDevice::nf4_gemm(const Tensor& c, int64_t c_col, const Tensor& a, int64_t a_col,
                         const std::vector<Nf4Weight>& pieces, bool trans_w, double beta) {
  if (!nf4_gemm_direct(c.dtype(), a.dtype()) || pieces.empty()) return false;
  const checks::Nf4GemmDims d = checks::nf4_gemm("cpu", c, c_col, a, a_col, pieces, trans_w);
  std::vector<cpu::Nf4Operand> w;
  for (const Nf4Weight& p : pieces) w.push_back({static_cast<const uint8_t*>(p.blob.data()), p.layout, p.row0});
  const size_t c_bytes = c.dtype() == DType::bf16 ? 2 : 4;
  cpu::gemm_bf16_nf4(static_cast<char*>(c.data()) + d.c_from * static_cast<int64_t>(c_bytes),
                     c.dtype() == DType::bf16, c.dim(1), ptr<uint16_t>(a) + d.a_from, a.dim(1), w, trans_w, d.M, d.N,
                     d.K, 1.0f, static_cast<float>(beta));
  return true;
}

void CpuDevice::dropout_rows(const Tensor& out, const Tensor& in, double p, uint64_t key, int64_t row0) {
  checks::dropout_rows("cpu", out, in, p, row0);
  if (p == 0.0) {
    if (out.data() != in.data()) copy(out, in);
    return;
  }
  const int64_t N = in.dim(0), C = in.dim(1);
  const uint64_t threshold = dropout_threshold(p);
  const double scale = dropout_scale(p);
  switch (in.dtype()) {
    case DType::f64: {
      const double* x = in.data_as<double>();
      double* y = out.data_as<double>();
      dropout_rows_cpu<double>(
          N, C, key, row0, threshold, scale, [x](int64_t k) { return x[k]; }, [y](int64_t k, double v) { y[k] = v; });
      return;
    }
    case DType::f32: {
      const float* x = in.data_as<float>();
      float* y = out.data_as<float>();
      dropout_rows_cpu<float>(
          N, C, key, row0, threshold, static_cast<float>(scale), [x](int64_t k) { return x[k]; },
          [y](int64_t k, float v) { y[k] = v; });
      return;
    }
    case DType::bf16: {
      const uint16_t* x = in.data_as<uint16_t>();
      uint16_t* y = out.data_as<uint16_t>();
      dropout_rows_cpu<float>(
          N, C, key, row0, threshold, static_cast<float>(scale), [x](int64_t k) { return bf16_to_f32(x[k]); },
          [y](int64_t k, float v) { y[k] = f32_to_bf16(v); });
      return;
    }
    case DType::f16: {
      const uint16_t* x = in.data_as<uint16_t>();
      uint16_t* y = out.data_as<uint16_t>();
      dropout_rows_cpu<float>(
          N, C, key, row0, threshold, static_cast<float>(scale), [x](int64_t k) { return f16_to_f32(x[k]); },
          [y](int64_t k, float v) { y[k] = f32_to_f16(v); });
      return;
    }
    case DType::i32:
      break;  // refused by the checks
  }
}

void CpuDevice::embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                  const Tensor& wpe, int64_t T) {
  if (any_low(out, wte, wpe)) {
    Widen w(*this);
    embedding_forward(w.out(out, false), tokens, w.in(wte), w.in(wpe), T);
    return w.store();
  }
  expect_dtype("embedding_forward", tokens, DType::i32);
  const int64_t N = tokens.numel(), C = wte.dim(1);
  if (out.numel() != N * C || wpe.dim(1) != C || wpe.dim(0) < T || N % T != 0) {
    fail("embedding_forward", "out " + out.describe() + ", tokens " + tokens.describe() +
                                  ", wte " + wte.describe() + ", wpe " + wpe.describe() +
                                  ", T " + std::to_string(T));
  }
  dispatch("embedding_forward", out.dtype(), [&](auto tag) {
    using T_ = decltype(tag);
    cpu::embedding_forward<T_>(ptr<T_>(out), tokens.data_as<int32_t>(), ptr<T_>(wte),
                               ptr<T_>(wpe), N, T, C, wte.dim(0));
  });
}

void CpuDevice::embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                   const Tensor& tokens, int64_t T) {
  if (any_low(dwte, dwpe, dout)) {
    Widen w(*this);
    embedding_backward(w.out(dwte, true), w.out(dwpe, true), w.in(dout), tokens, T);
    return w.store();
  }
  expect_dtype("embedding_backward", tokens, DType::i32);
  const int64_t N = tokens.numel(), C = dwte.dim(1);
  if (dout.numel() != N * C || dwpe.dim(1) != C || dwpe.dim(0) < T || N % T != 0) {
    fail("embedding_backward", "dout " + dout.describe() + ", dwte " + dwte.describe());
  }
  dispatch("embedding_backward", dout.dtype(), [&](auto tag) {
    using T_ = decltype(tag);
    cpu::embedding_backward<T_>(ptr<T_>(dwte), ptr<T_>(dwpe), ptr<T_>(dout),
                                tokens.data_as<int32_t>(), N, T, C);
  });
}

void CpuDevice::layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                  const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  if (any_low(out, mean, rstd, inp, weight, bias)) {
    Widen w(*this);
    layernorm_forward(w.out(out, false), w.out(mean, false), w.out(rstd, false), w.in(inp), w.in(weight), w.in(bias));
    return w.store();
  }
  expect_same_shape("layernorm_forward", out, inp);
  const int64_t C = inp.dim(-1), N = rows_of(inp);
  if (weight.numel() != C || bias.numel() != C || mean.numel() != N || rstd.numel() != N) {
    fail("layernorm_forward", "inp " + inp.describe() + ", weight " + weight.describe() +
                                  ", mean " + mean.describe());
  }
  dispatch("layernorm_forward", inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::layernorm_forward<T>(ptr<T>(out), ptr<T>(mean), ptr<T>(rstd), ptr<T>(inp),
                              ptr<T>(weight), ptr<T>(bias), N, C);
  });
}

void CpuDevice::layernorm_backward(const Tensor& dinp, const Tensor& dweight,
                                   const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                                   const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  if (any_low(dinp, dweight, dbias, dout, inp, weight, mean, rstd)) {
    Widen w(*this);
    layernorm_backward(w.out(dinp, true), w.out(dweight, true), w.out(dbias, true), w.in(dout), w.in(inp), w.in(weight), w.in(mean), w.in(rstd));
    return w.store();
  }
  expect_same_shape("layernorm_backward", dinp, inp);
  expect_same_shape("layernorm_backward", dout, inp);
  const int64_t C = inp.dim(-1), N = rows_of(inp);
  if (dweight.numel() != C || dbias.numel() != C || weight.numel() != C || mean.numel() != N) {
    fail("layernorm_backward", "inp " + inp.describe() + ", dweight " + dweight.describe());
  }
  dispatch("layernorm_backward", inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::layernorm_backward<T>(ptr<T>(dinp), ptr<T>(dweight), ptr<T>(dbias), ptr<T>(dout),
                               ptr<T>(inp), ptr<T>(weight), ptr<T>(mean), ptr<T>(rstd), N, C);
  });
}


namespace {
// Each start must lie in its row's causal prefix: [0, t].
void check_doc_starts(const char* op, const Tensor& doc_start, int64_t T) {
  if (!doc_start.defined()) return;
  const int32_t* d = doc_start.data_as<int32_t>();
  for (int64_t n = 0; n < doc_start.numel(); ++n) {
    if (d[n] < 0 || d[n] > n % T) {
      throw std::invalid_argument(std::string("cpu ") + op + ": doc_start[" + std::to_string(n) + "] = " +
                                  std::to_string(d[n]) + " is outside [0, " + std::to_string(n % T) + "]");
    }
  }
}
}  // namespace

void CpuDevice::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t n_head,
                                  int64_t n_kv_head, const Tensor& doc_start) {
  if (any_low(out, qkv)) {
    Widen w(*this);
    attention_forward(w.out(out, false), lse, w.in(qkv), n_head, n_kv_head, doc_start);
    return w.store();
  }
  const int64_t kv = n_kv_head > 0 ? n_kv_head : n_head;
  const int64_t C = checks::attention("cpu", "attention_forward", out, lse, qkv, n_head, kv);
  checks::doc_start("cpu", "attention_forward", doc_start, qkv);
  check_doc_starts("attention_forward", doc_start, qkv.dim(1));
  dispatch("attention_forward", qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::flash_attention_forward<T>(ptr<T>(out), ptr<T>(lse), ptr<T>(qkv), qkv.dim(0), qkv.dim(1), C, n_head, kv,
                                    doc_start.defined() ? doc_start.data_as<int32_t>() : nullptr);
  });
}

void CpuDevice::attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                   const Tensor& lse, int64_t n_head, int64_t n_kv_head, const Tensor& doc_start) {
  if (any_low(dqkv, dout, qkv, out)) {
    Widen w(*this);
    attention_backward(w.out(dqkv, true), w.in(dout), w.in(qkv), w.in(out), lse, n_head, n_kv_head, doc_start);
    return w.store();
  }
  const int64_t kv = n_kv_head > 0 ? n_kv_head : n_head;
  const int64_t C = checks::attention("cpu", "attention_backward", dout, lse, qkv, n_head, kv);
  expect_same_shape("attention_backward", dqkv, qkv);
  expect_same_shape("attention_backward", out, dout);
  checks::doc_start("cpu", "attention_backward", doc_start, qkv);
  check_doc_starts("attention_backward", doc_start, qkv.dim(1));
  dispatch("attention_backward", qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::flash_attention_backward<T>(ptr<T>(dqkv), ptr<T>(dout), ptr<T>(qkv), ptr<T>(out), ptr<T>(lse), qkv.dim(0),
                                     qkv.dim(1), C, n_head, kv,
                                     doc_start.defined() ? doc_start.data_as<int32_t>() : nullptr);
  });
}

void CpuDevice::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                                double eps) {
  if (any_low(out, rstd, inp, weight)) {
    Widen w(*this);
    rmsnorm_forward(w.out(out, false), w.out(rstd, false), w.in(inp), w.in(weight), eps);
    return w.store();
  }
  expect_same_shape("rmsnorm_forward", out, inp);
  const int64_t C = inp.dim(-1), N = rows_of(inp);
  if (weight.numel() != C || rstd.numel() != N) {
    fail("rmsnorm_forward", "inp " + inp.describe() + ", weight " + weight.describe() + ", rstd " + rstd.describe());
  }
  dispatch("rmsnorm_forward", inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::rmsnorm_forward<T>(ptr<T>(out), ptr<T>(rstd), ptr<T>(inp), ptr<T>(weight), N, C, eps);
  });
}

void CpuDevice::rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                                 const Tensor& weight, const Tensor& rstd) {
  if (any_low(dinp, dweight, dout, inp, weight, rstd)) {
    Widen w(*this);
    rmsnorm_backward(w.out(dinp, true), w.out(dweight, true), w.in(dout), w.in(inp), w.in(weight), w.in(rstd));
    return w.store();
  }
  expect_same_shape("rmsnorm_backward", dinp, inp);
  expect_same_shape("rmsnorm_backward", dout, inp);
  const int64_t C = inp.dim(-1), N = rows_of(inp);
  if (dweight.numel() != C || weight.numel() != C || rstd.numel() != N) {
    fail("rmsnorm_backward", "inp " + inp.describe() + ", dweight " + dweight.describe() + ", rstd " + rstd.describe());
  }
  dispatch("rmsnorm_backward", inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::rmsnorm_backward<T>(ptr<T>(dinp), ptr<T>(dweight), ptr<T>(dout), ptr<T>(inp), ptr<T>(weight), ptr<T>(rstd),
                             N, C);
  });
}

void CpuDevice::swiglu_forward(const Tensor& out, const Tensor& gate_up) {
  if (any_low(out, gate_up)) {
    Widen w(*this);
    swiglu_forward(w.out(out, false), w.in(gate_up));
    return w.store();
  }
  const int64_t H = out.dim(-1), N = rows_of(out);
  if (gate_up.numel() != 2 * N * H || gate_up.dim(-1) != 2 * H || gate_up.dtype() != out.dtype()) {
    fail("swiglu_forward", "out " + out.describe() + ", gate_up " + gate_up.describe() + " (must be [N, 2H])");
  }
  dispatch("swiglu_forward", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::swiglu_forward<T>(ptr<T>(out), ptr<T>(gate_up), N, H);
  });
}

void CpuDevice::swiglu_backward(const Tensor& dgate_up, const Tensor& gate_up, const Tensor& dout) {
  if (any_low(dgate_up, gate_up, dout)) {
    Widen w(*this);
    swiglu_backward(w.out(dgate_up, true), w.in(gate_up), w.in(dout));
    return w.store();
  }
  expect_same_shape("swiglu_backward", dgate_up, gate_up);
  const int64_t H = dout.dim(-1), N = rows_of(dout);
  if (gate_up.numel() != 2 * N * H || gate_up.dim(-1) != 2 * H) {
    fail("swiglu_backward", "dout " + dout.describe() + ", gate_up " + gate_up.describe() + " (must be [N, 2H])");
  }
  dispatch("swiglu_backward", dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::swiglu_backward<T>(ptr<T>(dgate_up), ptr<T>(gate_up), ptr<T>(dout), N, H);
  });
}


void CpuDevice::rope_forward(const Tensor& out, const Tensor& inp, int64_t T, int64_t heads, int64_t head_dim,
                             const Rope& rope) {
  if (any_low(out, inp)) {
    Widen w(*this);
    rope_forward(w.out(out, false), w.in(inp), T, heads, head_dim, rope);
    return w.store();
  }
  checks::rope("cpu", "rope_forward", out, inp, T, heads, head_dim);
  dispatch("rope_forward", inp.dtype(), [&](auto tag) {
    using U = decltype(tag);
    cpu::rope_apply<U>(ptr<U>(out), ptr<U>(inp), rows_of(inp), T, heads, head_dim, inp.dim(-1), rope, false, false);
  });
}

void CpuDevice::rope_backward(const Tensor& dinp, const Tensor& dout, int64_t T, int64_t heads, int64_t head_dim,
                              const Rope& rope) {
  if (any_low(dinp, dout)) {
    Widen w(*this);
    rope_backward(w.out(dinp, true), w.in(dout), T, heads, head_dim, rope);
    return w.store();
  }
  checks::rope("cpu", "rope_backward", dinp, dout, T, heads, head_dim);
  dispatch("rope_backward", dout.dtype(), [&](auto tag) {
    using U = decltype(tag);
    cpu::rope_apply<U>(ptr<U>(dinp), ptr<U>(dout), rows_of(dout), T, heads, head_dim, dout.dim(-1), rope, true, true);
  });
}

void CpuDevice::gelu_forward(const Tensor& out, const Tensor& inp) {
  if (any_low(out, inp)) {
    Widen w(*this);
    gelu_forward(w.out(out, false), w.in(inp));
    return w.store();
  }
  expect_same_shape("gelu_forward", out, inp);
  dispatch("gelu_forward", inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::gelu_forward<T>(ptr<T>(out), ptr<T>(inp), inp.numel());
  });
}

void CpuDevice::gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  if (any_low(dinp, inp, dout)) {
    Widen w(*this);
    gelu_backward(w.out(dinp, true), w.in(inp), w.in(dout));
    return w.store();
  }
  expect_same_shape("gelu_backward", dinp, inp);
  expect_same_shape("gelu_backward", dout, inp);
  dispatch("gelu_backward", inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::gelu_backward<T>(ptr<T>(dinp), ptr<T>(inp), ptr<T>(dout), inp.numel());
  });
}

void CpuDevice::softmax_cross_entropy_forward(const Tensor& losses, const Tensor& probs,
                                              const Tensor& logits, const Tensor& targets) {
  if (any_low(losses, probs, logits)) {
    Widen w(*this);
    softmax_cross_entropy_forward(w.out(losses, false), w.out(probs, false), w.in(logits), targets);
    return w.store();
  }
  expect_same_shape("softmax_cross_entropy_forward", probs, logits);
  expect_dtype("softmax_cross_entropy_forward", targets, DType::i32);
  const int64_t V = logits.dim(-1), N = rows_of(logits);
  if (targets.numel() != N || losses.numel() != N) {
    fail("softmax_cross_entropy_forward", "logits " + logits.describe() + ", targets " +
                                              targets.describe() + ", losses " + losses.describe());
  }
  dispatch("softmax_cross_entropy_forward", logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::softmax_cross_entropy_forward<T>(ptr<T>(losses), ptr<T>(probs), ptr<T>(logits),
                                          targets.data_as<int32_t>(), N, V);
  });
}

void CpuDevice::softmax_cross_entropy_backward(const Tensor& dlogits, const Tensor& probs,
                                               const Tensor& targets, double dloss) {
  if (any_low(dlogits, probs)) {
    Widen w(*this);
    softmax_cross_entropy_backward(w.out(dlogits, true), w.in(probs), targets, dloss);
    return w.store();
  }
  expect_same_shape("softmax_cross_entropy_backward", dlogits, probs);
  const int64_t V = probs.dim(-1), N = rows_of(probs);
  if (targets.numel() != N) fail("softmax_cross_entropy_backward", targets.describe());
  dispatch("softmax_cross_entropy_backward", probs.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::softmax_cross_entropy_backward<T>(ptr<T>(dlogits), ptr<T>(probs),
                                           targets.data_as<int32_t>(), N, V, static_cast<T>(dloss));
  });
}

void CpuDevice::adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                      const AdamWStep& step) {
  for (const Tensor* t : {&param, &grad, &m, &v}) {
    expect_dtype("adamw", *t, DType::f32);
    if (t->numel() != param.numel()) fail("adamw", "param " + param.describe() + " vs " + t->describe());
  }
  if (step.step < 1) fail("adamw", "step must be >= 1, got " + std::to_string(step.step));
  const AdamWConstants k = adamw_constants(step);
  float *p = ptr<float>(param), *mp = ptr<float>(m), *vp = ptr<float>(v);
  const float* g = ptr<float>(grad);
  const int64_t n = param.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) adamw_element(k, p[i], g[i], mp[i], vp[i]);
}

}  // namespace ferry::nn
