// The trainer, the engine it runs on and the NCCL communicator compiled against the CPU
// emulation of CUDA and NCCL (testing/cuda_emulation.h, testing/nccl_emulation.h):
// test_cuda_training_emulated runs
// the trainer's GPU paths (states on the device with NCCL and device AdamW, or staged from
// host memory) on machines without a GPU. Their symbols replace the library's in that
// test only.
#include "comm/nccl_communicator.cpp"  // NOLINT(bugprone-suspicious-include)
#include "runtime/train/engine.cpp"   // NOLINT(bugprone-suspicious-include)
#include "runtime/train/trainer.cpp"  // NOLINT(bugprone-suspicious-include)
