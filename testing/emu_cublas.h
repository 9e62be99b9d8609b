// The cuBLAS calls of the emulated GPU (tests only). cublasGemmEx checks its arguments as
// cuBLAS does (sizes, leading dimensions >= max(1, rows), the operands inside device
// allocations) and queues the product on the handle's stream: a loop in double over
// column-major operands, rounded once into C. Unless the math mode forbids it
// (CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION), a bf16/f16 output with K > 256 is
// summed as cuBLAS's split-K may do it: partial sums of 256 rounded to the output type.
#pragma once

#include "nn/dtype.h"
#include "testing/emu_cuda_api.h"

struct ferry_emu_cublas {
  cudaStream_t stream = nullptr;
  int math = 0;
};
using cublasHandle_t = ferry_emu_cublas*;
enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_NOT_SUPPORTED = 15
};
enum cublasOperation_t { CUBLAS_OP_N, CUBLAS_OP_T };
enum cublasMath_t {
  CUBLAS_DEFAULT_MATH = 0,
  CUBLAS_TF32_TENSOR_OP_MATH = 3,
  CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16
};
enum cudaDataType_t { CUDA_R_32F, CUDA_R_64F, CUDA_R_16BF, CUDA_R_16F };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_64F };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT };

inline const char* cublasGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
inline const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
  }
  return "unknown error";
}
inline cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = new ferry_emu_cublas();
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasDestroy(cublasHandle_t h) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->math = m;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void* p, size_t n) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  std::lock_guard<std::mutex> lock(ferry_emu::emu().mu);
  if (n && !ferry_emu::emu().device_range(p, n)) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

namespace ferry_emu {

inline double load(cudaDataType_t t, const void* p, int64_t i) {
  switch (t) {
    case CUDA_R_32F:
      return static_cast<const float*>(p)[i];
    case CUDA_R_64F:
      return static_cast<const double*>(p)[i];
    case CUDA_R_16BF:
      return ferry::nn::bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case CUDA_R_16F:
      return ferry::nn::f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}

inline void store(cudaDataType_t t, void* p, int64_t i, double v) {
  switch (t) {
    case CUDA_R_32F:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      return;
    case CUDA_R_64F:
      static_cast<double*>(p)[i] = v;
      return;
    case CUDA_R_16BF:
      static_cast<uint16_t*>(p)[i] = ferry::nn::f32_to_bf16(static_cast<float>(v));
      return;
    case CUDA_R_16F:
      static_cast<uint16_t*>(p)[i] = ferry::nn::f32_to_f16(static_cast<float>(v));
      return;
  }
}

inline size_t size_of(cudaDataType_t t) {
  return t == CUDA_R_64F ? 8 : t == CUDA_R_32F ? 4 : 2;
}

// Whether a column-major rows x cols operand with leading dimension ld lies in one allocation.
inline bool operand_in_device(const void* p, cudaDataType_t t, int rows, int cols, int ld) {
  if (rows == 0 || cols == 0) return true;
  const size_t elems = static_cast<size_t>(cols - 1) * static_cast<size_t>(ld) + static_cast<size_t>(rows);
  return emu().device_range(p, elems * size_of(t));
}

constexpr int kSplitK = 256;

inline double round_to(cudaDataType_t t, double v) {
  const float f = static_cast<float>(v);
  if (t == CUDA_R_16BF) return ferry::nn::bf16_to_f32(ferry::nn::f32_to_bf16(f));
  if (t == CUDA_R_16F) return ferry::nn::f16_to_f32(ferry::nn::f32_to_f16(f));
  return v;
}

}  // namespace ferry_emu

// Column-major C[m,n] = alpha op(A)[m,k] op(B)[k,n] + beta C, C not read when beta is 0.
inline cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t opa, cublasOperation_t opb,
                                   int m, int n, int k, const void* alpha, const void* A,
                                   cudaDataType_t at, int lda, const void* B, cudaDataType_t bt,
                                   int ldb, const void* beta, void* C, cudaDataType_t ct, int ldc,
                                   cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  const int a_rows = opa == CUBLAS_OP_N ? m : k, b_rows = opb == CUBLAS_OP_N ? k : n;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) ||
      ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  const bool f64 = compute == CUBLAS_COMPUTE_64F;
  if (f64 != (at == CUDA_R_64F) || at != bt) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (ct != at && !(ct == CUDA_R_32F && (at == CUDA_R_16BF || at == CUDA_R_16F)))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const double al = f64 ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  const double be = f64 ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);
  std::unique_lock<std::mutex> lock(ferry_emu::emu().mu);
  if (!ferry_emu::operand_in_device(A, at, a_rows, opa == CUBLAS_OP_N ? k : m, lda) ||
      !ferry_emu::operand_in_device(B, bt, b_rows, opb == CUBLAS_OP_N ? n : k, ldb) ||
      !ferry_emu::operand_in_device(C, ct, m, n, ldc))
    return CUBLAS_STATUS_INVALID_VALUE;  // cuBLAS would fault on the GPU; here it is caught
  const bool reduced = !(h->math & CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) &&
                       (ct == CUDA_R_16BF || ct == CUDA_R_16F) && k > ferry_emu::kSplitK;
  ferry_emu::enqueue(lock, h->stream, "cublasGemmEx", [=] {
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i) {
        double acc = 0, chunk = 0;
        for (int l = 0; l < k; ++l) {
          const double a = ferry_emu::load(
              at, A, opa == CUBLAS_OP_N ? i + int64_t{l} * lda : l + int64_t{i} * lda);
          const double b = ferry_emu::load(
              bt, B, opb == CUBLAS_OP_N ? l + int64_t{j} * ldb : j + int64_t{l} * ldb);
          chunk += a * b;
          if (reduced && (l + 1) % ferry_emu::kSplitK == 0) {
            // a split-K partial, then the running sum, each rounded to the output type
            acc = ferry_emu::round_to(ct, acc + ferry_emu::round_to(ct, chunk));
            chunk = 0;
          }
        }
        acc += chunk;
        const int64_t at_c = i + int64_t{j} * ldc;
        ferry_emu::store(ct, C, at_c, al * acc + (be != 0 ? be * ferry_emu::load(ct, C, at_c) : 0.0));
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}
