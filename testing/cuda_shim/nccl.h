// Stands in for NCCL's <nccl.h> in the CPU-emulated test builds only (see cuda_runtime.h here).
#pragma once
#include "testing/nccl_emulation.h"
