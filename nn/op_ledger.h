// The roofline ledger (issue 39): what each DeviceOps call costs the cuda device on a GPU,
// from its operands' shapes and dtypes alone, and the step time a GPU's rates predict.
//
// OpCost, per call:
// - launches: the device work items the cuda device issues for it (kernels, cuBLAS calls,
//   memsets and device-to-device copies on the compute stream; stream-ordered allocations
//   are not counted), as nn/cuda/*.cpp and *.cu issue them today. tests/test_op_ledger.cpp
//   checks every op's figure against the CPU emulation of the cuda device, which records
//   each launch: a kernel change that adds or removes a launch fails there until the ledger
//   says so too.
// - flops: the arithmetic the op must do. GEMM 2MNK. Attention is counted causal as
//   FlashAttention's papers count it (score tiles above the diagonal skipped): forward
//   4 hs per score (QK^T and PV), backward 2.5 times that (five products: S again, dP, dV,
//   dQ, dK).
// - bytes: what the cuda device's kernels move through device memory as they are written
//   (an f32 scratch copy, a partial-sums pass, a read-modify-write output all count);
//   min_bytes: the op's floor, each input read once and each output written once (an
//   accumulated output read and written). bytes >= min_bytes, and their ratio is the op's
//   debt to memory speed.
// - widened: the op took a path that widens low-precision operands to f32 scratch (a GEMM
//   of mixed operand types): a bf16 step should have none.
//
// GpuRates: the rates one GPU reaches, each with its source printed beside it: measured on a
// GPU run of this project where there is one (docs/design/measured.md), else an assumption
// that says so. Never a datasheet peak alone: GEMMs at the rate cuBLAS reached at
// transformer shapes, memory-bound kernels at 85% of HBM bandwidth, attention at the rate
// measured for the kernel that runs or, never timed, half of FlashAttention-2's published
// H100 rate at that head size and pass.
//
// OpLedger: totals per op name in first-seen order; predict() sums per op
// launches x launch + max(flops / rate, bytes / memory): no overlap between ops (one stream).
// Not thread safe: one ledger per device, filled from the thread that issues the ops.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nn/attention_kernel.h"
#include "nn/nf4_blob.h"
#include "nn/rope.h"
#include "nn/tensor.h"

namespace ferry::nn {

enum class Work { gemm, attention_forward, attention_backward, memory };

struct OpCost {
  const char* op = "";
  Work work = Work::memory;
  int64_t launches = 0;
  double flops = 0, bytes = 0, min_bytes = 0;
  bool widened = false;
  bool low_precision = false;  // gemm: 16-bit operands (the tensor cores' rate)
  int64_t head_dim = 0, T = 0;  // attention: what its rate depends on
};

// ---- the cost of each DeviceOps call on the cuda device (nn/device_ops.h's contracts) ---------
namespace op_cost {
OpCost cast(const Tensor& dst, const Tensor& src);
OpCost fill(const Tensor& dst);
OpCost gemm(const Tensor& c, const Tensor& a, bool ta, const Tensor& b, bool tb, double beta);
// gemm_cols with dims from op_checks: one cuBLAS call over the windows (same dtypes only).
OpCost gemm_cols(const Tensor& c, int64_t M, int64_t N, int64_t K, const Tensor& a, const Tensor& b, double beta);
// linear_forward as one cuBLASLt call (nn/cuda_device.h: linear_forward_fuses); where it does
// not fuse, the ledger records the gemm, add_bias and gelu_forward it runs instead.
OpCost linear_forward(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& pre);
OpCost add_bias(const Tensor& out, const Tensor& bias);
OpCost bias_backward(const Tensor& dbias, const Tensor& dout);
OpCost add(const Tensor& out, const Tensor& a, const Tensor& b);
OpCost accumulate(const Tensor& dst, const Tensor& src);
OpCost sum_squares(const Tensor& x, bool to_device);  // to_device: sum_squares_to
OpCost scale(const Tensor& x);
// One kernel; p == 0 is the device-to-device copy the cuda device makes instead ("copy"), or
// nothing at all when out is in (no launch: not to be recorded).
OpCost dropout_rows(const Tensor& out, const Tensor& in, double p);
// One kernel: the rectangle's nibbles and block scales read, the panel written.
OpCost nf4_dequantize(const Tensor& panel, const Nf4Layout& l);
OpCost embedding_forward(const Tensor& out, const Tensor& tokens);
OpCost embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,
                          int64_t T);
OpCost layernorm_forward(const Tensor& out, const Tensor& inp, const Tensor& mean);
OpCost layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& mean);
OpCost rmsnorm_forward(const Tensor& out, const Tensor& inp, const Tensor& rstd);
OpCost rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& rstd);
OpCost attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t n_head,
                         int64_t n_kv_head);
OpCost attention_backward(const Tensor& dqkv, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                          int64_t n_head, int64_t n_kv_head);
OpCost swiglu_forward(const Tensor& out, const Tensor& gate_up);
OpCost swiglu_backward(const Tensor& dgate_up, const Tensor& dout);
OpCost rope(const Tensor& out, const Tensor& inp, int64_t heads, int64_t head_dim, bool backward);
OpCost gelu_forward(const Tensor& out, const Tensor& inp);
OpCost gelu_backward(const Tensor& dinp);
OpCost softmax_cross_entropy_forward(const Tensor& losses, const Tensor& probs, const Tensor& logits);
OpCost softmax_cross_entropy_backward(const Tensor& dlogits, const Tensor& probs);
// The fused head's row kernels on one chunk's scores (nn/cuda/linear_xent.cu); its GEMMs
// are recorded as gemm. Forward: two reads of the scores (max, sum); backward: the same and
// the rewrite in place. Floor: one read (and, backward, one write).
OpCost linear_xent_forward_rows(const Tensor& losses, const Tensor& scores);
OpCost linear_xent_backward_rows(const Tensor& scores);
OpCost adamw(const Tensor& param);
}  // namespace op_cost

struct Rate {
  double value = 0;
  std::string source;
};

struct GpuRates {
  std::string gpu;
  Rate gemm_bf16, gemm_f32;  // FLOP/s
  Rate memory;               // bytes/s
  Rate launch;               // seconds per launch, added to each op's time
  AttentionKernel attention = AttentionKernel::mma;  // automatic resolves to mma (auto's choice)
  // FLOP/s of the attention kernels at head size hs and context T (the kernels that run
  // for `attention`; see the .cpp for each figure's source).
  Rate attention_rate(bool backward, int64_t hs, int64_t T) const;
};

// The rates of an H100 SXM (80 GB HBM3) and an H200 (141 GB HBM3e) running `attention`'s kernels.
GpuRates h100_rates(AttentionKernel attention);
GpuRates h200_rates(AttentionKernel attention);

class OpLedger {
 public:
  struct Line {
    std::string op;
    Work work = Work::memory;
    int64_t calls = 0, launches = 0, widened = 0;
    double flops = 0, bytes = 0, min_bytes = 0;
    double seconds = 0;  // filled by predict()
  };
  void add(const OpCost& c);
  void clear();
  const std::vector<Line>& lines() const { return lines_; }
  int64_t launches() const;
  int64_t widened() const;
  double flops() const;
  // Seconds the recorded ops take on a GPU with `r`; fills each line's seconds.
  double predict(const GpuRates& r);
  // The per-op seconds of one recorded call: launches x launch + max(compute, memory).
  static double seconds(const OpCost& c, const GpuRates& r);

 private:
  std::vector<Line> lines_;
  std::map<std::string, size_t> index_;
  std::vector<OpCost> calls_;  // kept for predict(): attention's rate depends on each call's T
};

}  // namespace ferry::nn
