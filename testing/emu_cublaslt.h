// The cuBLASLt calls of the emulated GPU (tests only): the subset the cuda device uses for
// GEMMs with an epilogue (nn/cuda/device_linear.cpp), checked as cuBLASLt checks them.
//
// cublasLtMatmul(D = alpha op(A) op(B) + beta C, then the epilogue), column-major as the
// library is: the matrix layouts give each operand's type, rows, columns and leading
// dimension as stored (before TRANSA/TRANSB), and the shapes must agree (op(A) m x k,
// op(B) k x n, C and D m x n), leading dimensions at least the rows, every operand inside
// one device allocation: anything else is CUBLAS_STATUS_INVALID_VALUE and queues nothing.
// Supported as the cuda device uses it: A and B of one 16-bit or f32 type, C and D of that
// type (C may be D), compute CUBLAS_COMPUTE_32F, scale type f32. Epilogues DEFAULT, BIAS,
// GELU, GELU_BIAS, GELU_AUX, GELU_AUX_BIAS; BIAS needs BIAS_POINTER (m elements of
// BIAS_DATA_TYPE, default D's type), AUX needs EPILOGUE_AUX_POINTER and EPILOGUE_AUX_LD >= m
// (aux has D's type, aux_ld a multiple of 8, aux and bias 16-byte aligned). Others are CUBLAS_STATUS_NOT_SUPPORTED, as on a GPU for a combination
// the library lacks.
// Numerics: products summed in double, then in f32 as the library's epilogue works:
// pre = alpha acc + beta c + bias[i]; aux = pre rounded to its type; D = GELU(pre) (tanh form,
// nn/cpu_kernels.h's constants) or pre, rounded once. One queued op named "cublasLtMatmul".
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "testing/emu_cublas.h"

enum cublasLtMatmulDescAttributes_t {
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 10,
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 11,
  CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,
};
enum cublasLtEpilogue_t {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_BIAS = 4,
  CUBLASLT_EPILOGUE_GELU = 32,
  CUBLASLT_EPILOGUE_GELU_AUX = 32 | 128,
  CUBLASLT_EPILOGUE_GELU_BIAS = 32 | 4,
  CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 32 | 128 | 4,
};

struct ferry_emu_lt_handle {};
struct ferry_emu_lt_desc {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_32F;
  bool bias_type_set = false;
  void* aux = nullptr;
  int64_t aux_ld = 0;
};
struct ferry_emu_lt_layout {
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
};
using cublasLtHandle_t = ferry_emu_lt_handle*;
using cublasLtMatmulDesc_t = ferry_emu_lt_desc*;
using cublasLtMatrixLayout_t = ferry_emu_lt_layout*;
struct cublasLtMatmulAlgo_t {
  uint64_t data[8];
};

inline cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = new ferry_emu_lt_handle();
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                                               cudaDataType_t scale) {
  *d = new ferry_emu_lt_desc();
  (*d)->compute = compute;
  (*d)->scale = scale;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,
                                                     const void* buf, size_t size) {
  if (!d || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  auto take = [&](auto& field) {
    if (size != sizeof(field)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&field, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  };
  switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return take(d->ta);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return take(d->tb);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return take(d->epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return take(d->bias);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      return take(d->aux);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      return take(d->aux_ld);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      d->bias_type_set = true;
      return take(d->bias_type);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}
inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t type, uint64_t rows,
                                                 uint64_t cols, int64_t ld) {
  *l = new ferry_emu_lt_layout{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}

enum cublasLtMatmulPreferenceAttributes_t {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
  CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3,
};
enum cublasLtReductionScheme_t {
  CUBLASLT_REDUCTION_SCHEME_NONE = 0,
  CUBLASLT_REDUCTION_SCHEME_INPLACE = 1,
  CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE = 2,
  CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE = 4,
};
struct ferry_emu_lt_pref {
  uint64_t max_workspace = 0;
  uint32_t schemes = 7;
};
using cublasLtMatmulPreference_t = ferry_emu_lt_pref*;
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};

inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new ferry_emu_lt_pref();
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                           cublasLtMatmulPreferenceAttributes_t a, const void* buf,
                                                           size_t size) {
  if (!p || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && size == sizeof(uint64_t)) {
    std::memcpy(&p->max_workspace, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (a == CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK && size == sizeof(uint32_t)) {
    std::memcpy(&p->schemes, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

// One algorithm for any configuration cublasLtMatmul supports (it needs no workspace and
// reduces in f32 here, so every preference admits it); none, with NOT_SUPPORTED, otherwise.
inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                                     cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                                     cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                                                     cublasLtMatmulPreference_t p, int requested,
                                                     cublasLtMatmulHeuristicResult_t* results, int* returned) {
  if (!h || !d || !A || !B || !C || !D || !p || requested < 1 || !results || !returned)
    return CUBLAS_STATUS_INVALID_VALUE;
  *returned = 0;
  if (d->compute != CUBLAS_COMPUTE_32F || A->type != B->type || D->type != A->type || A->type == CUDA_R_64F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  results[0] = {};
  results[0].state = CUBLAS_STATUS_SUCCESS;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

namespace ferry_emu {

inline bool layout_in_device(const void* p, const ferry_emu_lt_layout& l) {
  return operand_in_device(p, l.type, static_cast<int>(l.rows), static_cast<int>(l.cols), static_cast<int>(l.ld));
}

inline float gelu_tanh(float x) {
  constexpr float k = 0.7978845608028654f, c = 0.044715f;
  return 0.5f * x * (1.0f + std::tanh(k * (x + c * x * x * x)));
}

}  // namespace ferry_emu

// algo may be null (the library then picks one) or one from cublasLtMatmulAlgoGetHeuristic.
inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha, const void* A,
                                     cublasLtMatrixLayout_t Ad, const void* B, cublasLtMatrixLayout_t Bd,
                                     const void* beta, const void* C, cublasLtMatrixLayout_t Cd, void* D,
                                     cublasLtMatrixLayout_t Dd, const cublasLtMatmulAlgo_t*, void* workspace,
                                     size_t workspace_bytes, cudaStream_t stream) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!d || !Ad || !Bd || !Cd || !Dd) return CUBLAS_STATUS_INVALID_VALUE;
  const int64_t m = static_cast<int64_t>(Dd->rows), n = static_cast<int64_t>(Dd->cols);
  const int64_t am = static_cast<int64_t>(d->ta == CUBLAS_OP_N ? Ad->rows : Ad->cols);
  const int64_t k = static_cast<int64_t>(d->ta == CUBLAS_OP_N ? Ad->cols : Ad->rows);
  const int64_t bk = static_cast<int64_t>(d->tb == CUBLAS_OP_N ? Bd->rows : Bd->cols);
  const int64_t bn = static_cast<int64_t>(d->tb == CUBLAS_OP_N ? Bd->cols : Bd->rows);
  if (am != m || bk != k || bn != n || Cd->rows != Dd->rows || Cd->cols != Dd->cols) return CUBLAS_STATUS_INVALID_VALUE;
  for (const ferry_emu_lt_layout* l : {Ad, Bd, Cd, Dd}) {
    if (l->ld < std::max<int64_t>(1, static_cast<int64_t>(l->rows))) return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (d->compute != CUBLAS_COMPUTE_32F || d->scale != CUDA_R_32F || Ad->type != Bd->type || Cd->type != Dd->type ||
      Dd->type != Ad->type || Ad->type == CUDA_R_64F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const int32_t e = d->epilogue;
  const bool has_bias = e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool gelu = (e & CUBLASLT_EPILOGUE_GELU) != 0;
  const bool aux = e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  if (e != CUBLASLT_EPILOGUE_DEFAULT && !has_bias && e != CUBLASLT_EPILOGUE_GELU && !aux) return CUBLAS_STATUS_NOT_SUPPORTED;
  const cudaDataType_t bias_type = d->bias_type_set ? d->bias_type : Dd->type;
  if (has_bias && !d->bias) return CUBLAS_STATUS_INVALID_VALUE;
  // The library's documented requirements: aux's leading dimension a multiple of 8, aux and
  // bias 16-byte aligned.
  if (aux && (!d->aux || d->aux_ld < std::max<int64_t>(1, m) || d->aux_ld % 8 != 0 ||
              reinterpret_cast<uintptr_t>(d->aux) % 16 != 0))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (has_bias && reinterpret_cast<uintptr_t>(d->bias) % 16 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const ferry_emu_lt_layout a = *Ad, b = *Bd, c = *Cd, dl = *Dd;
  const cublasOperation_t ta = d->ta, tb = d->tb;
  const void* bias = d->bias;
  void* aux_p = d->aux;
  const int64_t aux_ld = d->aux_ld;
  std::unique_lock<std::mutex> lock(ferry_emu::emu().mu);
  if (!ferry_emu::layout_in_device(A, a) || !ferry_emu::layout_in_device(B, b) ||
      (be != 0 && !ferry_emu::layout_in_device(C, c)) || !ferry_emu::layout_in_device(D, dl) ||
      (has_bias && !ferry_emu::emu().device_range(bias, static_cast<size_t>(m) * ferry_emu::size_of(bias_type))) ||
      (aux && !ferry_emu::operand_in_device(aux_p, dl.type, static_cast<int>(m), static_cast<int>(n),
                                            static_cast<int>(aux_ld))) ||
      (workspace_bytes && !ferry_emu::emu().device_range(workspace, workspace_bytes)))
    return CUBLAS_STATUS_INVALID_VALUE;  // cuBLASLt would fault on the GPU; here it is caught
  ferry_emu::enqueue(lock, stream, "cublasLtMatmul", [=] {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        double acc = 0;
        for (int64_t l = 0; l < k; ++l) {
          acc += ferry_emu::load(a.type, A, ta == CUBLAS_OP_N ? i + l * a.ld : l + i * a.ld) *
                 ferry_emu::load(b.type, B, tb == CUBLAS_OP_N ? l + j * b.ld : j + l * b.ld);
        }
        float pre = static_cast<float>(al * acc + (be != 0 ? be * ferry_emu::load(c.type, C, i + j * c.ld) : 0.0));
        if (has_bias) pre += static_cast<float>(ferry_emu::load(bias_type, bias, i));
        if (aux) ferry_emu::store(dl.type, aux_p, i + j * aux_ld, pre);
        ferry_emu::store(dl.type, D, i + j * dl.ld, gelu ? ferry_emu::gelu_tanh(pre) : pre);
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}
