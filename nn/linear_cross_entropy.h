// The fused output layer and cross-entropy (DeviceOps::linear_cross_entropy_forward and
// _backward, nn/device_ops.h): how the rows are chunked, and the default every device
// inherits, written with the device's own ops.
//
// Why: the head's [N, V] tensors dominate a step's activation memory at large vocabularies
// (Llama 3: V = 128,256; at 8k tokens the f32 probabilities alone are 4 GiB, with 2 GiB of
// bf16 logits and 2 GiB of their gradient). The fused ops hold one chunk of rows instead.
//
// Chunking: Nc rows of x at a time against the whole vocabulary, Nc chosen so that the
// chunk's scratch (bytes_per_score bytes for each of its Nc x V scores) stays within
// kLinearXentScratchBytes, whatever N is. Whole rows, not a vocabulary split with an online
// max/sum as Cut Cross-Entropy does: a chunk's softmax is then the plain one, and backward
// recomputes it from the chunk's scores without a saved log-sum-exp (one more read of
// memory the GEMM just wrote, 1/C of the GEMM's FLOPs). Nc depends on V and the dtypes
// only, never on N's split over ranks, so runs stay identical across world sizes.
//
// The default (DeviceOps' bodies in linear_cross_entropy.cpp), per chunk:
//   forward:  scores[Nc,V] = x_c w^T (gemm, x's dtype); softmax_cross_entropy_forward into
//             probs[Nc,V] (losses' dtype) and losses_c.
//   backward: the same two, then scores <- 0 and softmax_cross_entropy_backward into it
//             (the chunk's dlogits, x's dtype); dx_c += dlogits w, dw += dlogits^T x_c.
// Its scratch: (x's dtype + losses' dtype) bytes per score, allocated from x's device on
// each call and freed before it returns. Rows' values are those of the unfused path: the
// same kernels on the same rows (dw's sum over rows is cut at chunk boundaries: rounding).
// A device with a kernel that does the chunk's softmax, loss and gradient in place in the
// scores (the CUDA device: nn/cuda/linear_xent.cu) overrides both through the *_in_place
// loops below and needs only the scores' bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include <functional>

#include "nn/tensor.h"

namespace ferry::nn {

class DeviceOps;

// The scratch the fused head holds at once: 1 GiB of scores (and, for the default, the
// probabilities beside them). Why so much: every chunk adds into all of dw, so a GPU reads
// and writes dw (f32: 1 GiB at Llama 3.2 1B's head) once per chunk, and small chunks make
// thin GEMMs. Measured on an H200 at N = 8192, C = 2048, V = 128,256 (bf16, f32 dw), one
// forward and backward of the head: unfused 19.8 ms (8 GiB of [N, V] tensors); fused with
// 64 MiB 148.9 ms, 512 MiB 34.9 ms, 1 GiB 31.4 ms, 2 GiB 29.9 ms with the default's ops;
// with the CUDA device's row kernels 31.9 ms at 256 MiB, 28.7 at 1 GiB, 28.5 at 2 GiB. One
// budget for every device, so `ferry plan` (the default's 6 bytes a score) counts the GPU's
// 1 GiB once N fills it, and more than the GPU's 2 bytes a score below that. Never more than
// the unfused head held (6 or 8 bytes a score for at most N rows, where that held 8 or 16).
inline constexpr size_t kLinearXentScratchBytes = size_t{1} << 30;

// The budget in force: kLinearXentScratchBytes unless a test has set another. Tests set a
// few hundred bytes to cut small shapes into many chunks (tests/test_backend_ops.cpp runs
// every device through several chunks and a shorter last one); 0 restores the default.
// Process-wide and atomic; set it only while no op runs.
size_t linear_cross_entropy_scratch_bytes();
void set_linear_cross_entropy_scratch_bytes(size_t bytes);

// Rows per chunk for N rows of V scores, bytes_per_score bytes of scratch each: the most
// that fit the budget, a multiple of 8 when at least 8 (row offsets of bf16 chunks stay
// 16-byte aligned where C is a multiple of 8), at least 1, at most N.
int64_t linear_cross_entropy_chunk_rows(int64_t N, int64_t V, size_t bytes_per_score);

// Shape and dtype checks both ops share, on every device (std::invalid_argument naming
// `device` and `op`): x[N,C] and w[V,C] 2-D of one dtype, targets i32[N], `per_row` (losses
// or nothing) N elements; for backward dx shaped as x and dw as w. Returns {N, C, V}.
struct LinearXentDims {
  int64_t N = 0, C = 0, V = 0;
};
LinearXentDims check_linear_cross_entropy(const char* device, const char* op, const Tensor& x, const Tensor& w,
                                          const Tensor& targets, const Tensor& losses, const Tensor& dx = Tensor{},
                                          const Tensor& dw = Tensor{});

// The chunk loops of a device whose kernel works in place in each chunk's scores (the CUDA
// device; the ledger device counts them): dtype_size(x) bytes of scratch a score, so chunks
// three times as tall as the default's in bf16. Per chunk, scores = x_c w^T (ops.gemm), then
//   forward:  rows(losses_c, scores, targets_c) writes the chunk's losses;
//   backward: rows(scores, targets_c) turns the scores into dloss (softmax - onehot), zeros
//             on ignored rows, then dx_c += it @ w and dw += it^T @ x_c (ops.gemm).
// Checks and errors as check_linear_cross_entropy, naming `device`; scratch from x's device.
using LinearXentForwardRows = std::function<void(const Tensor& losses, const Tensor& scores, const Tensor& targets)>;
using LinearXentBackwardRows = std::function<void(const Tensor& scores, const Tensor& targets)>;
void linear_cross_entropy_forward_in_place(DeviceOps& ops, const char* device, const Tensor& losses, const Tensor& x,
                                           const Tensor& w, const Tensor& targets, const LinearXentForwardRows& rows);
void linear_cross_entropy_backward_in_place(DeviceOps& ops, const char* device, const Tensor& dx, const Tensor& dw,
                                            const Tensor& x, const Tensor& w, const Tensor& targets,
                                            const LinearXentBackwardRows& rows);

}  // namespace ferry::nn
