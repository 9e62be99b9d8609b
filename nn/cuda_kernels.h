// The CUDA device's kernels, behind plain C++ launchers (this header needs no CUDA
// headers; the .cu files of nn/cuda/ implement it with nvcc, one per op family).
//
// Every launcher enqueues on `stream` (a cudaStream_t) and checks the launch; none
// synchronizes. Arrays are raw device pointers with their dtype (Arr), so one kernel
// serves f32, bf16, f16 and mixed operands: each element is loaded into the accumulation
// type, computed there, and rounded once when stored, which is what the CPU device's
// widening does (nn/cpu_device.cpp). The accumulation type is f32, or f64 when an operand
// is f64. Reductions run in a fixed order (no atomics on values), so results are
// deterministic: the same inputs and shapes give the same bits run after run. The order
// depends on the block size (a build constant: 256, attention 128), so it differs from the
// CPU device's at rounding level, except embedding_backward's dwte (token order, as on the
// CPU). Shapes have been checked by the caller (nn/cuda/device_ops.cpp).
// Scratch: column_sums, embedding_backward, layernorm_backward and rmsnorm_backward take
// partial sums in device memory (at most 2^20 values of the accumulation type, or one per
// output column where there are more columns), allocated and freed on `stream`
// (cudaMallocAsync / cudaFreeAsync from the device's default pool): stream ordered, no host
// synchronisation; a failed allocation is std::runtime_error like any CUDA error.
// Errors that depend on values (a token outside the vocabulary) are written to `err`
// (device int[3]: flag, index, value) for the caller to read back.
#pragma once

#include <cstdint>

#include "nn/adamw_formula.h"
#include "nn/attention_kernel.h"
#include "nn/rope.h"
#include "nn/cuda_abi.h"
#include "nn/dtype.h"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN

struct Arr {
  void* p = nullptr;
  DType dtype = DType::f32;
};

using Stream = void*;  // cudaStream_t

void cast(Stream s, Arr dst, Arr src, int64_t n);
void fill(Stream s, Arr dst, double value, int64_t n);
void add(Stream s, Arr out, Arr a, Arr b, int64_t n);
void accumulate(Stream s, Arr dst, Arr src, int64_t n);
void scale(Stream s, Arr x, double factor, int64_t n);
void add_bias(Stream s, Arr out, Arr bias, int64_t N, int64_t C);
void column_sums(Stream s, Arr dst, Arr src, int64_t N, int64_t C);  // dst[c] += sum_n src[n,c]
// out[N,C] = in masked and scaled (DeviceOps::dropout_rows; nn/dropout_mask.h): element
// (i, j) kept when dropout_word(dropout_row_hash(key, row0 + i), j) >= threshold, then
// multiplied by scale (rounded to the accumulation type). out may be in. One launch.
void dropout_rows(Stream s, Arr out, Arr in, int64_t N, int64_t C, uint64_t key, int64_t row0, uint64_t threshold,
                  double scale);
// NF4 dequantization (DeviceOps::nf4_dequantize): where a blob keeps each part (byte offsets,
// nn/nf4_blob.h's Nf4Layout) and the matrix's row length.
struct Nf4Args {
  int64_t cols = 0;
  int64_t code_at = 0, offset_at = 0, nested_at = 0, absmax_at = 0, packed_at = 0;
  bool double_quant = true;
};
// panel[R, C] = rows [r0, r0 + R) x columns [c0, c0 + C) of the matrix in `blob` (device
// bytes), each value rounded once to panel's dtype. One launch.
void nf4_dequantize(Stream s, Arr panel, const uint8_t* blob, const Nf4Args& q, int64_t R, int64_t C, int64_t r0,
                    int64_t c0);
// One NF4 matrix of a weight W: rows [row0, row0 + q's rows) of it, its blob at `blob`.
struct Nf4Piece {
  const uint8_t* blob = nullptr;
  Nf4Args q;
  int64_t row0 = 0;
};
constexpr int kNf4GemmMaxPieces = 8;
// Why nf4_gemm cannot run on the current GPU ("a GPU of compute capability 8.0 or above",
// ...), or nullptr.
const char* nf4_gemm_obstacle();
// c[M, N] (row stride ldc) = beta c + a[M, K] (row stride lda) op(W), op(W) = W^T when
// trans_w (N = W's rows, K = its columns), else W (K = rows, N = columns); W is `pieces`
// (1 to kNf4GemmMaxPieces, tiling its rows in order), dequantized tile by tile in shared
// memory as the operand is loaded. a bf16 or f16; c f32, bf16 or f16; fp32 sums, one
// rounding into c. One launch (nn/cuda/nf4_gemm.cu).
void nf4_gemm(Stream s, Arr c, int64_t ldc, Arr a, int64_t lda, const Nf4Piece* pieces, int n_pieces, bool trans_w,
              int64_t M, int64_t N, int64_t K, double beta);
// partial: device double[kSumSquaresBlocks + 1]; the total lands in partial[kSumSquaresBlocks].
constexpr int kSumSquaresBlocks = 512;
void sum_squares(Stream s, Arr x, int64_t n, double* partial);

void embedding_forward(Stream s, Arr out, const int32_t* tokens, Arr wte, Arr wpe, int64_t N,
                       int64_t T, int64_t C, int64_t V, int* err);
void embedding_backward(Stream s, Arr dwte, Arr dwpe, Arr dout, const int32_t* tokens, int64_t N,
                        int64_t T, int64_t C);
void layernorm_forward(Stream s, Arr out, Arr mean, Arr rstd, Arr inp, Arr w, Arr b, int64_t N,
                       int64_t C);
void layernorm_backward(Stream s, Arr dinp, Arr dw, Arr db, Arr dout, Arr inp, Arr w, Arr mean,
                        Arr rstd, int64_t N, int64_t C);
void rmsnorm_forward(Stream s, Arr out, Arr rstd, Arr inp, Arr w, int64_t N, int64_t C, double eps);
void rmsnorm_backward(Stream s, Arr dinp, Arr dw, Arr dout, Arr inp, Arr w, Arr rstd, int64_t N,
                      int64_t C);
// Why AttentionKernel::tensor_cores (nn/attention_kernel.h) cannot run attention with
// activations of `act`, statistics of `stats` and head size hs on the current GPU ("needs
// ..." text), or null when they can.
const char* tensor_core_attention_obstacle(DType act, DType stats, int64_t hs);
// The same for AttentionKernel::mma (mma.sync kernels: head sizes 64 and 128).
const char* mma_attention_obstacle(DType act, DType stats, int64_t hs);

// Attention in memory linear in T (Device::attention_forward/backward): shared memory per
// block depends on the head size only (at most 256: std::invalid_argument above it, or when
// the GPU's opt-in limit is smaller than the block needs), checked before anything is
// enqueued; so is `kernel` (tensor_cores asked where they cannot run: std::invalid_argument
// naming the op and the obstacle). lse: [B,NH,T] statistics. doc_start: null, or i32 [B*T]
// on the device.
void attention_forward(Stream s, Arr out, Arr lse, Arr qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, int64_t KVH, const int32_t* doc_start,
                       AttentionKernel kernel = AttentionKernel::automatic);
// dqkv += the gradient; rowdot: device scratch of B*NH*T elements of the accumulation type
// (f64 if any operand is), for D = rowsum(dout * out).
void attention_backward(Stream s, Arr dqkv, Arr dout, Arr qkv, Arr out, Arr lse, int64_t B, int64_t T,
                        int64_t C, int64_t NH, int64_t KVH, const int32_t* doc_start, void* rowdot,
                        AttentionKernel kernel = AttentionKernel::automatic);
void swiglu_forward(Stream s, Arr out, Arr gate_up, int64_t N, int64_t H);
void swiglu_backward(Stream s, Arr dgate_up, Arr gate_up, Arr dout, int64_t N, int64_t H);
void rope(Stream s, Arr out, Arr inp, int64_t N, int64_t T, int64_t heads, int64_t hd,
          int64_t width, const Rope& rope, bool inverse, bool accumulate);
void gelu_forward(Stream s, Arr out, Arr inp, int64_t n);
void gelu_backward(Stream s, Arr dinp, Arr inp, Arr dout, int64_t n);
void softmax_cross_entropy_forward(Stream s, Arr losses, Arr probs, Arr logits,
                                   const int32_t* targets, int64_t N, int64_t V, int* err);
void softmax_cross_entropy_backward(Stream s, Arr dlogits, Arr probs, const int32_t* targets,
                                    int64_t N, int64_t V, double dloss);
// The fused output layer's rows (nn/cuda/linear_xent.cu): scores [N, V] of one chunk in the
// compute dtype. Forward writes losses[N] (the target flag as softmax_cross_entropy_forward);
// backward replaces each row of scores with dloss (softmax - onehot(target)), zeros where the
// target is kIgnoreTarget.
void linear_xent_forward_rows(Stream s, Arr losses, Arr scores, const int32_t* targets, int64_t N,
                              int64_t V, int* err);
void linear_xent_backward_rows(Stream s, Arr scores, const int32_t* targets, int64_t N, int64_t V,
                               double dloss);
void adamw(Stream s, float* p, const float* g, float* m, float* v, int64_t n,
           const AdamWConstants& k);

#ifdef FERRY_CUDA_EMULATION
// Threads per block of the launches that follow: `generic` for every kernel but attention's,
// `attention` for the attention kernels (one warp per 4 rows). Multiples of 32 in [32, 1024]; anything else is
// std::invalid_argument. The emulation's default is 64 and 64 (fibers are slow); a GPU
// build uses 256 and 128, which tests select with this to run the GPU's block shapes (the
// in-block summation orders depend on them). Not thread safe: call between launches.
void set_emulated_block_threads(int generic, int attention);
#endif

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
