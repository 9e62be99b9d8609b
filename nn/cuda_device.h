// The CUDA device: the Device interface (nn/device.h) on one GPU.
//
// - Memory: one cudaMalloc slab per device, carved by a first-fit allocator (256-byte
//   aligned blocks, neighbours coalesced on free); never managed memory. The budget
//   (device.memory) caps the bytes handed out exactly as on the CPU device, so
//   OutOfDeviceMemory, the peak and `ferry plan` mean the same thing on both. The slab is
//   the budget plus a little room for the rounding. Outside the budget: cuBLAS's
//   workspace (32 MiB), a few bytes of flags and partial sums, and stream-ordered scratch
//   (cudaMallocAsync) for the f32 copies a mixed-dtype GEMM needs and attention
//   backward's per-row sums.
// - Streams: compute (every op), host-to-device and device-to-host (the copies). A copy
//   waits, through an event, for the compute work issued before it (the memory it writes
//   may have been freed by a tensor whose kernel is still queued) and the compute stream
//   waits for the copy the same way: events, never a device-wide synchronization.
//   copy_into_new waits only for its block's fence (the event recorded when the block was
//   last freed), so it overlaps the queued kernels. copy_from_host, copy_into_new and
//   copy_to_host return once the host side of the copy is done (the host buffer may be
//   reused); other ops return at once (they run in issue order).
// - Values: bf16/f16 operands are computed in f32 and rounded once per stored output, as
//   the CPU device does; GEMMs are cuBLAS with fp32 accumulation (fp32 GEMMs without TF32,
//   so they match the CPU device near 1e-5). Reductions are deterministic.
// - Errors: every CUDA and cuBLAS call is checked (nn/cuda_check.h) and throws
//   std::runtime_error naming the call; token and target ids outside the vocabulary throw
//   std::out_of_range as on the CPU device (read back once per embedding and loss, the
//   ops that run once per micro-batch).
// Thread safety: as nn/device.h: one issuing thread; memory accounting is thread safe.
// This header needs no CUDA headers: a build without the toolkit gets a cuda_status()
// that says so and a make_cuda_device() that throws it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "nn/cuda_abi.h"
#include "nn/device.h"

namespace ferry::nn {
FERRY_CUDA_ABI_BEGIN

struct CudaStatus {
  bool built = false;  // compiled with the CUDA toolkit (FERRY_WITH_CUDA)
  int gpus = 0;        // devices the CUDA runtime sees
  std::string reason;  // why the cuda device is unavailable; "" when it is available
  bool available() const { return reason.empty(); }
};
CudaStatus cuda_status();

// The cuda device on GPU `ordinal` with a budget of `capacity_bytes`. Throws
// std::runtime_error with cuda_status().reason when there is no usable GPU.
std::unique_ptr<Device> make_cuda_device(size_t capacity_bytes, int ordinal = 0);

// The compute stream (a cudaStream_t) of a device from make_cuda_device: what NCCL and
// the copy engines order against. Throws std::invalid_argument for other devices.
void* cuda_compute_stream(Device& device);

FERRY_CUDA_ABI_END
}  // namespace ferry::nn
