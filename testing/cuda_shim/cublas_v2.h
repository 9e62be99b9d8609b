// Stands in for the CUDA toolkit's <cublas_v2.h> in the CPU-emulated test builds only: those targets put
// testing/cuda_shim ahead of the toolkit's include folder, so the cuda device's sources compile
// unchanged against testing/cuda_emulation.h. Never on the include path of a library.
#pragma once
#include "testing/cuda_emulation.h"
