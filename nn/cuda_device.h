// The CUDA device: the Device interface (nn/device.h) on one GPU.
//
// - Memory: one cudaMalloc slab per device, carved at the first allocation (so that a
//   communicator started after the device takes its GPU memory first) by a first-fit
//   allocator that prefers blocks no queued work still uses (256-byte aligned blocks,
//   neighbours coalesced on free); never managed memory. The budget (device.memory) caps
//   the bytes handed out exactly as on the CPU device, so OutOfDeviceMemory, the peak and
//   `ferry plan` mean the same thing on both; an op's scratch (the f32 copies a
//   mixed-dtype GEMM needs, attention backward's per-row sums) is carved from it too and
//   counts. The slab is the budget plus a little room for the rounding. Outside the
//   budget: cuBLAS's workspace (32 MiB), a few bytes of flags and partial sums, and the
//   default memory pool (its release threshold raised so it keeps what it maps). A budget
//   that does not fit in cudaMemGetInfo's free memory less a reserve (352 MiB: cuBLAS's
//   workspace, the pool, kernel images and NCCL's late allocations; nn/cuda/device_impl.h
//   says why) is refused when the device is made and again when the slab is carved, with
//   std::runtime_error naming `device.memory`, the free bytes, the reserve and the largest
//   budget that fits.
// - Streams: compute (every op), host-to-device and device-to-host (the copies). A copy
//   waits, through an event, for the compute work issued before it (the memory it writes
//   may have been freed by a tensor whose kernel is still queued) and the compute stream
//   waits for the copy the same way: events, never a device-wide synchronization.
//   copy_into_new waits only for its block's fence (the event recorded when the block was
//   last freed, from a pool of reused events), on the device: the host does not wait for
//   it. copy_from_host and copy_to_host return once the host side of the copy is done (the
//   host buffer may be reused). copy_into_new returns once the copy is queued: from
//   pageable memory the runtime has staged the source by then (it may be reused); a
//   page-locked source (cudaMallocHost, cudaHostRegister, cuda_register_host) is read
//   when the copy runs and must stay unchanged until the host next waits for the device
//   (synchronize(), copy_to_host, sum_squares, a flag check). Other ops return at once
//   (they run in issue order).
// - Values: bf16/f16 operands are computed in f32 and rounded once per stored output, as
//   the CPU device does; GEMMs are cuBLAS with fp32 accumulation (fp32 GEMMs without TF32,
//   so they match the CPU device near 1e-5). Reductions are deterministic.
// - Errors: every CUDA and cuBLAS call is checked (nn/cuda_check.h) and throws
//   std::runtime_error naming the call; token and target ids outside the vocabulary throw
//   std::out_of_range as on the CPU device (read back once per embedding and loss, the
//   ops that run once per micro-batch).
// - Debugging: FERRY_CUDA_SYNC=1 synchronises the device and checks for an error after
//   every op (kernel launch, GEMM, copy), so an asynchronous fault names its op.
// Thread safety: as nn/device.h: one issuing thread; memory accounting is thread safe:
// deallocate may run on any thread (it makes this device's GPU current in that thread).
// This header needs no CUDA headers: a build without the toolkit gets a cuda_status()
// that says so and a make_cuda_device() that throws it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "nn/attention_kernel.h"
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

// The cuda device on GPU `ordinal` with a budget of `capacity_bytes`, running attention
// with `attention` (nn/attention_kernel.h; tensor_cores or mma where they cannot run makes
// the attention ops throw std::invalid_argument saying why). Throws std::runtime_error with
// cuda_status().reason when there is no usable GPU.
std::unique_ptr<Device> make_cuda_device(size_t capacity_bytes, int ordinal = 0,
                                         AttentionKernel attention = AttentionKernel::automatic);

// device.nf4_gemm "fused": a cuda device multiplies QLoRA's NF4 base straight from the
// blobs (DeviceOps::nf4_gemm, nn/cuda/nf4_gemm.cu) instead of dequantizing panels for
// cuBLAS. Returns "" or what the fused kernel needs that this GPU or build lacks (the
// device then keeps the panels). Throws std::invalid_argument for other devices.
std::string set_cuda_nf4_gemm(Device& device, bool fused);

// What a cuda device's attention runs with ("simt", "tensor_cores" or "mma") for
// activations of `act` (statistics f32) and head size head_size on its GPU, and in *why
// (when not null) what the kernels it was asked for would need there ("tensor cores need
// ...", "mma needs ..."; auto: what mma needs, or what the tensor cores need where it falls
// to SIMT), or "" when they can run. Where the kernels asked for cannot run, the name is
// the one auto would fall back to. Throws std::invalid_argument for other devices.
std::string cuda_attention_kernel(Device& device, DType act, int64_t head_size, std::string* why = nullptr);

// Whether the cuda device runs linear_forward (nn/device_ops.h) as one cuBLASLt call with its
// epilogue: 16-bit out, x and w of one dtype, a bias of that dtype, pre (GELU's input) of
// out's dtype and shape with out's width a multiple of 8 (cuBLASLt's aux leading dimension),
// no empty dimension; and, checked on the device only, every pointer 16-byte aligned (the
// arena and the units' tensor alignment give that). Otherwise the unfused ops run. The
// roofline ledger (nn/ledger_device.h) costs the op by the same rule.
inline bool linear_forward_fuses(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                                 const Tensor& pre) {
  const DType t = out.dtype();
  return is_low_precision(t) && x.dtype() == t && w.dtype() == t && out.numel() > 0 && x.dim(-1) > 0 &&
         (!bias.defined() || (bias.dtype() == t && bias.numel() == out.dim(-1))) &&
         (!pre.defined() || (pre.dtype() == t && pre.shape() == out.shape() && out.dim(-1) % 8 == 0));
}

// The largest budget make_cuda_device(capacity, ordinal) accepts on that GPU now: its free
// memory (cudaMemGetInfo) less the reserve and the slab's rounding room. For tools that
// size themselves to the GPU (ferry bench model); throws as make_cuda_device does.
size_t cuda_budget_that_fits(int ordinal = 0);

// The compute stream (a cudaStream_t) of a device from make_cuda_device: what NCCL and
// the copy engines order against. Throws std::invalid_argument for other devices.
void* cuda_compute_stream(Device& device);

// The PCI bus id ("0000:18:00.0") of a cuda device's GPU: what names the physical GPU
// whatever CUDA_VISIBLE_DEVICES says (comm/gpu_binding.h compares them across ranks).
// Throws std::invalid_argument for other devices, std::runtime_error for CUDA errors.
std::string cuda_pci_bus_id(Device& device);

// Page-locks host memory [ptr, ptr + bytes) for DMA with a cuda device's GPU
// (cudaHostRegister through the runtime this library links, with that GPU made current
// in the calling thread). Returns "" or why it failed (the memory is then still usable,
// pageable). Undo with cuda_unregister_host before freeing it. Throws
// std::invalid_argument for other devices.
std::string cuda_register_host(Device& device, void* ptr, size_t bytes);
void cuda_unregister_host(Device& device, void* ptr) noexcept;

FERRY_CUDA_ABI_END
}  // namespace ferry::nn
