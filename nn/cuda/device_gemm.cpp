// The cuda device's GEMM: cuBLAS (fp32 accumulation; mixed operand types widened to f32
// scratch from the budget and rounded back once).
#include "nn/cuda/device_impl.h"

#include <stdexcept>

namespace ferry::nn::cuda_dev {
FERRY_CUDA_ABI_BEGIN

Arr CudaDevice::widen(const Tensor& t, Scratch& keep) {
  keep = Scratch(*this, static_cast<size_t>(t.numel()) * 4);
  const Arr w{keep.get(), DType::f32};
  cuda::cast(st(), w, arr(t), t.numel());
  return w;
}

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f64:
      return CUDA_R_64F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    case DType::i32:
      break;
  }
  throw std::invalid_argument("cuda.gemm: i32 is not a GEMM type");
}

}  // namespace

// cuBLAS is column-major: row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T,
// so B goes first and the leading dimensions are the row-major row lengths.
// Operand types cuBLAS takes directly: A and B of one type, C of that type, or f32 C for
// bf16/f16 A and B (weight gradients from bf16 activations). Anything else is widened to
// f32 scratch, computed, and rounded back once.
void CudaDevice::gemm(const Tensor& c, const Tensor& a, bool ta, const Tensor& b, bool tb,
                      double alpha, double beta) {
  const auto [M, N, K] = checks::gemm(kDev, c, a, ta, b, tb);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    // cuBLAS refuses lda or ldb of 0; the product is empty, so C = beta C (C unread at 0).
    if (beta == 0) {
      fill(c, 0.0);
    } else if (beta != 1) {
      scale(c, beta);
    }
    return;
  }
  const bool any_f64 =
      a.dtype() == DType::f64 || b.dtype() == DType::f64 || c.dtype() == DType::f64;
  const bool all_f64 =
      a.dtype() == DType::f64 && b.dtype() == DType::f64 && c.dtype() == DType::f64;
  if (any_f64 && !all_f64) {
    fail(kDev, "gemm",
         "f64 does not mix: c " + c.describe() + ", a " + a.describe() + ", b " + b.describe());
  }
  Scratch wa, wb, wc;
  Arr A = arr(a), B = arr(b), Cm = arr(c);
  if (A.dtype != B.dtype) {
    if (A.dtype != DType::f32) A = widen(a, wa);
    if (B.dtype != DType::f32) B = widen(b, wb);
  }
  const bool direct = Cm.dtype == A.dtype || (is_low_precision(A.dtype) && Cm.dtype == DType::f32);
  if (!direct) {
    wc = Scratch(*this, static_cast<size_t>(c.numel()) * 4);
    Cm = {wc.get(), DType::f32};
    if (beta != 0) cuda::cast(st(), Cm, arr(c), c.numel());
  }
  const int lda = static_cast<int>(ta ? M : K), ldb = static_cast<int>(tb ? K : N),
            ldc = static_cast<int>(N);
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                          opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (all_f64) {
    FERRY_CUBLAS_CHECK(cublasGemmEx(cublas_, opb, opa, static_cast<int>(N), static_cast<int>(M),
                                    static_cast<int>(K), &alpha, B.p, CUDA_R_64F, ldb, A.p,
                                    CUDA_R_64F, lda, &beta, Cm.p, CUDA_R_64F, ldc,
                                    CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT));
  } else {
    const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
    FERRY_CUBLAS_CHECK(cublasGemmEx(
        cublas_, opb, opa, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha_f,
        B.p, cuda_type(B.dtype), ldb, A.p, cuda_type(A.dtype), lda, &beta_f, Cm.p,
        cuda_type(Cm.dtype), ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  if (!direct) cuda::cast(st(), arr(c), Cm, c.numel());
  debug_sync("gemm (cublasGemmEx)");
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda_dev
