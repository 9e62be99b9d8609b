// The cuda device's sources, compiled for the CPU emulation (testing/cuda_emulation.h): what
// test_backend_ops_emulated runs against the CPU device where there is no GPU. One
// translation unit: the files' anonymous namespaces meet here, so their names differ.
// NOLINTBEGIN(bugprone-suspicious-include): the same sources g++ and nvcc compile
#include "nn/cuda/device_memory.cpp"
#include "nn/cuda/device_transfers.cpp"
#include "nn/cuda/device_gemm.cpp"
#include "nn/cuda/device_ops.cpp"
#include "nn/cuda/device_probe.cpp"
#include "nn/cuda/elementwise.cu"
#include "nn/cuda/embedding.cu"
#include "nn/cuda/norms.cu"
#include "nn/cuda/attention_forward.cu"
#include "nn/cuda/attention_backward.cu"
#include "nn/cuda/attention_tc.cu"
#include "nn/cuda/attention_mma.cu"
#include "nn/cuda/attention_mma_backward.cu"
#include "nn/cuda/activations.cu"
#include "nn/cuda/rope.cu"
#include "nn/cuda/softmax_xent.cu"
#include "nn/cuda/linear_xent.cu"
#include "nn/cuda/adamw.cu"
#include "nn/cuda/nf4.cu"
#include "nn/cuda/nf4_gemm.cu"
// NOLINTEND(bugprone-suspicious-include)
