// The cuda device's GEMM: cuBLAS (fp32 accumulation; mixed operand types widened to f32
// scratch from the budget and rounded back once), and linear layers with their epilogue
// (bias, GELU) in one cuBLASLt call.
#include "nn/cuda/device_impl.h"

#include <array>
#include <optional>
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

// A window is a pointer into the wide tensor and its row length as the leading dimension:
// cuBLAS reads strided operands directly. One dtype, or f32 C with 16-bit A and B (the
// adapters' gradients); anything else is refused (nothing in ferry mixes otherwise).
void CudaDevice::gemm_cols(const Tensor& c, int64_t c_col, int64_t c_cols, const Tensor& a, int64_t a_col,
                           int64_t a_cols, bool ta, const Tensor& b, bool tb, double alpha, double beta) {
  const auto [M, N, K] = checks::gemm_cols(kDev, c, c_col, c_cols, a, a_col, a_cols, ta, b, tb);
  if (M == 0 || N == 0) return;
  const bool direct = a.dtype() == b.dtype() &&
                      (c.dtype() == a.dtype() || (is_low_precision(a.dtype()) && c.dtype() == DType::f32));
  if (!direct) {
    fail(kDev, "gemm_cols", "takes one dtype, or f32 c with 16-bit a and b: c " + c.describe() + ", a " +
                                a.describe() + ", b " + b.describe());
  }
  if (K == 0) {  // an empty product (an empty micro-batch): C = beta C, which accumulation leaves as is
    if (beta == 1.0) return;
    fail(kDev, "gemm_cols", "an empty inner dimension with beta != 1");
  }
  auto at = [](const Tensor& t, int64_t col) {
    return static_cast<const char*>(t.data()) + static_cast<size_t>(col) * dtype_size(t.dtype());
  };
  const int lda = static_cast<int>(a.dim(1)), ldb = static_cast<int>(tb ? K : N), ldc = static_cast<int>(c.dim(1));
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  void* cp = const_cast<char*>(at(c, c_col));
  if (c.dtype() == DType::f64) {
    FERRY_CUBLAS_CHECK(cublasGemmEx(cublas_, opb, opa, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K),
                                    &alpha, b.data(), CUDA_R_64F, ldb, at(a, a_col), CUDA_R_64F, lda, &beta, cp,
                                    CUDA_R_64F, ldc, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT));
  } else {
    const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
    FERRY_CUBLAS_CHECK(cublasGemmEx(cublas_, opb, opa, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K),
                                    &alpha_f, b.data(), cuda_type(b.dtype()), ldb, at(a, a_col), cuda_type(a.dtype()),
                                    lda, &beta_f, cp, cuda_type(c.dtype()), ldc, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
  }
  debug_sync("gemm_cols (cublasGemmEx)");
}

// ---- linear layers: one cuBLASLt call with a bias or GELU+bias epilogue ----------------------

bool CudaDevice::lt_fusable(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                            const Tensor& pre) {
  const DType t = out.dtype();
  auto aligned = [](const Tensor& v) { return reinterpret_cast<uintptr_t>(v.data()) % 16 == 0; };
  return linear_forward_fuses(out, x, w, bias, pre) && aligned(out) && aligned(x) && aligned(w) &&
         (!bias.defined() || aligned(bias)) && (!pre.defined() || aligned(pre)) && t == x.dtype();
}

void CudaDevice::linear_forward(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                                const Tensor& pre) {
  const auto [M, N, K] = checks::gemm(kDev, out, x, false, w, true);
  if (bias.defined() && bias.numel() != N) fail(kDev, "linear_forward", "bias " + bias.describe() + " for " + out.describe());
  if (!lt_fusable(out, x, w, bias, pre)) {
    DeviceOps::linear_forward(out, x, w, bias, pre);
    return;
  }
  // Row-major out[M,N] = x[M,K] w[N,K]^T is, column-major, D[N,M] = op(A) B with A = w
  // stored K x N (ld K) and transposed, B = x stored K x M (ld K), D = out (ld N); the bias
  // runs along D's rows (N), and the aux output (pre) is laid out as D.
  const cudaDataType_t t = cuda_type(out.dtype());
  const int32_t epilogue = pre.defined() ? (bias.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                                         : (bias.defined() ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  struct Release {
    cublasLtMatmulDesc_t& desc;
    cublasLtMatrixLayout_t &a, &b, &d;
    ~Release() {
      if (desc) cublasLtMatmulDescDestroy(desc);
      for (cublasLtMatrixLayout_t l : {a, b, d}) {
        if (l) cublasLtMatrixLayoutDestroy(l);
      }
    }
  } release{desc, a, b, d};
  FERRY_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  FERRY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)));
  FERRY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)));
  FERRY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (bias.defined()) {
    const void* bp = bias.data();
    FERRY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
    FERRY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof(t)));
  }
  if (pre.defined()) {
    void* ap = pre.data();
    const int64_t ld = N;
    FERRY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ap, sizeof(ap)));
    FERRY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
  }
  FERRY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, t, static_cast<uint64_t>(K), static_cast<uint64_t>(N), K));
  FERRY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, t, static_cast<uint64_t>(K), static_cast<uint64_t>(M), K));
  FERRY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d, t, static_cast<uint64_t>(N), static_cast<uint64_t>(M), N));
  // The algorithm: cuBLASLt's first choice under two constraints, cached per shape (a
  // heuristic query costs host time every step otherwise): the workspace ferry gives cuBLAS,
  // and split-K partials reduced in f32, never in the bf16 output type (cublas_'s
  // CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION, for the same reason).
  const std::array<int64_t, 5> key = {M, N, K, static_cast<int64_t>(t), epilogue};
  cublasLtMatmulAlgo_t algo;
  {
    std::lock_guard<std::mutex> lock(lt_mu_);
    auto it = lt_algos_.find(key);
    if (it == lt_algos_.end()) {
      cublasLtMatmulPreference_t pref = nullptr;
      FERRY_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const uint64_t ws = kCublasWorkspace;
      const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_INPLACE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
      if (st == CUBLAS_STATUS_SUCCESS) {
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                  sizeof(schemes));
      }
      if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulAlgoGetHeuristic(lt_, desc, a, b, d, d, pref, 1, &result, &found);
      cublasLtMatmulPreferenceDestroy(pref);
      if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
        // No algorithm for this epilogue here: the unfused ops, and not asked again.
        lt_algos_.emplace(key, std::nullopt);
        DeviceOps::linear_forward(out, x, w, bias, pre);
        return;
      }
      it = lt_algos_.emplace(key, result.algo).first;
    }
    if (!it->second) {
      DeviceOps::linear_forward(out, x, w, bias, pre);
      return;
    }
    algo = *it->second;
  }
  const float one = 1.0f, zero = 0.0f;
  FERRY_CUBLAS_CHECK(cublasLtMatmul(lt_, desc, &one, w.data(), a, x.data(), b, &zero, out.data(), d, out.data(), d, &algo,
                                    cublas_ws_, kCublasWorkspace, compute_));
  debug_sync("linear_forward (cublasLtMatmul)");
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda_dev
