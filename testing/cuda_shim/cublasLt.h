// Stands in for the CUDA toolkit's <cublasLt.h> in the CPU-emulated test builds only (as
// cublas_v2.h here): the cuda device's sources compile unchanged against testing/emu_cublaslt.h.
#pragma once
#include "testing/cuda_emulation.h"
#include "testing/emu_cublaslt.h"
