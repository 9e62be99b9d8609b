// The cuda device's sources, compiled for the CPU emulation (testing/cuda_emulation.h): what
// test_backend_ops_emulated runs against the CPU device where there is no GPU.
#include "nn/cuda_device.cpp"  // NOLINT(bugprone-suspicious-include)
#include "nn/cuda_kernels.cu"  // NOLINT(bugprone-suspicious-include): the same source nvcc compiles
