// The namespace of the cuda device's symbols. Built for a GPU it adds nothing; built for
// the CPU emulation (FERRY_CUDA_EMULATION, tests only: testing/cuda_emulation.h) the same code
// lands in an inline namespace, so an emulated build links beside the real one or the stub
// without a clash, while callers spell every name the same way.
#pragma once

#ifdef FERRY_CUDA_EMULATION
#define FERRY_CUDA_ABI_BEGIN inline namespace emulated {
#define FERRY_CUDA_ABI_END }
#else
#define FERRY_CUDA_ABI_BEGIN
#define FERRY_CUDA_ABI_END
#endif
