// Stands in for the CUDA toolkit's <mma.h> (nvcuda::wmma) in the CPU-emulated test builds only
// (see cuda_runtime.h here).
#pragma once
#include "testing/emu_wmma.h"
#include "testing/emu_mma.h"
