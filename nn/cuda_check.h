// Check macros for the CUDA runtime and cuBLAS (STYLE.md: one per foreign API). Every call
// goes through one; kernel launches are followed by FERRY_CUDA_CHECK_LAUNCH, which reads
// cudaGetLastError (a bad configuration or a missing image for this GPU surfaces there).
// A fault inside a kernel (an illegal address) surfaces only at a later synchronising
// call, often another op or the NCCL poller: with FERRY_CUDA_SYNC=1 in the environment
// every launch is followed by cudaDeviceSynchronize and a check, so the error names the
// launch that caused it (slow; for debugging). The variable is read once, at first use.
// Errors: std::runtime_error naming the call, the file:line and the library's own text.
// Include only from files built with the CUDA toolkit (FERRY_WITH_CUDA), or for the CPU
// emulation of tests (FERRY_CUDA_EMULATION).
#pragma once

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "base/env.h"

// In the CPU-emulated test builds these two are testing/cuda_shim's stand-ins.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace ferry::nn::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* call, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA error ") + cudaGetErrorName(e) + " (" +
                           cudaGetErrorString(e) + ") in " + call + " at " + file + ":" +
                           std::to_string(line));
}

[[noreturn]] inline void throw_cublas(cublasStatus_t s, const char* call, const char* file,
                                      int line) {
  throw std::runtime_error(std::string("cuBLAS error ") + cublasGetStatusName(s) + " (" +
                           cublasGetStatusString(s) + ") in " + call + " at " + file + ":" +
                           std::to_string(line));
}

// FERRY_CUDA_SYNC=1: synchronise and check after every op (see above).
inline bool sync_each_launch() {
  static const bool on = [] {
    const char* e = ::ferry::env_value("FERRY_CUDA_SYNC");
    return e && std::strcmp(e, "1") == 0;
  }();
  return on;
}

inline void check_launch(const char* file, int line) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_cuda(e, "a kernel launch", file, line);
  if (!sync_each_launch()) return;
  e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    throw_cuda(e, "cudaDeviceSynchronize after the kernel launched here (FERRY_CUDA_SYNC=1)", file,
               line);
  }
}

}  // namespace ferry::nn::cuda

#define FERRY_CUDA_CHECK(call)                                                   \
  do {                                                                           \
    const cudaError_t ferry_cuda_err_ = (call);                                  \
    if (ferry_cuda_err_ != cudaSuccess) {                                        \
      ::ferry::nn::cuda::throw_cuda(ferry_cuda_err_, #call, __FILE__, __LINE__); \
    }                                                                            \
  } while (0)

#define FERRY_CUDA_CHECK_LAUNCH() ::ferry::nn::cuda::check_launch(__FILE__, __LINE__)

#define FERRY_CUBLAS_CHECK(call)                                                    \
  do {                                                                              \
    const cublasStatus_t ferry_cublas_st_ = (call);                                 \
    if (ferry_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                \
      ::ferry::nn::cuda::throw_cublas(ferry_cublas_st_, #call, __FILE__, __LINE__); \
    }                                                                               \
  } while (0)
