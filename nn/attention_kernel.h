// Which kernels the cuda device runs attention with (the config key device.attention_kernel;
// nn/cuda_kernels.h has what each needs). The CPU device has one kernel and ignores it.
#pragma once

#include <optional>
#include <string_view>

namespace ferry::nn {

// - simt: FlashAttention-2 with SIMT arithmetic; every dtype, head sizes up to 256;
// - tensor_cores: the same algorithm with its tile products on tensor cores (wmma 16x16x16,
//   f32 accumulation, scores and outputs in shared memory); bf16 or f16 activations with
//   f32 statistics, head sizes up to 128, compute capability 8.0 or above; a pass whose
//   shared memory does not fit the GPU at 4 warps per block runs with fewer (at head size
//   128 the dK/dV pass needs 187 KiB at 4 warps: an H100 has 227 KiB per block, an A100
//   163 KiB, which takes it at 2 warps);
// - mma: FlashAttention-2's register-resident design (mma.sync m16n8k16, ldmatrix, cp.async
//   double buffering; nn/cuda/attention_mma.cuh); bf16 or f16 activations at 16-byte
//   aligned addresses, f32 statistics, head sizes 64 and 128, compute capability 8.0 or above;
// - automatic: mma where it can run, else tensor_cores, else simt. The choice depends only
//   on the dtypes, the head size and the GPU (and the activations' alignment, which the
//   allocator gives every tensor), so every rank and every step makes the same one.
enum class AttentionKernel : int { automatic = 0, simt = 1, tensor_cores = 2, mma = 3 };

constexpr std::string_view attention_kernel_name(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::simt:
      return "simt";
    case AttentionKernel::tensor_cores:
      return "tensor_cores";
    case AttentionKernel::mma:
      return "mma";
    case AttentionKernel::automatic:
      break;
  }
  return "auto";
}

// "auto", "simt", "tensor_cores" or "mma"; nullopt for anything else.
constexpr std::optional<AttentionKernel> parse_attention_kernel(std::string_view s) {
  for (AttentionKernel k : {AttentionKernel::automatic, AttentionKernel::simt, AttentionKernel::tensor_cores,
                            AttentionKernel::mma}) {
    if (s == attention_kernel_name(k)) return k;
  }
  return std::nullopt;
}

}  // namespace ferry::nn
