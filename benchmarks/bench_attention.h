// ferry bench attention: the attention kernels alone (Device::attention_forward/backward)
// at contexts 256 to 8192 with GPT-2 small's heads (12 x 64), 8192 tokens per call (B =
// 8192 / T), causal: milliseconds per forward and per backward and their GFLOP/s (causal
// FLOPs: forward 2 B NH T^2 hs, backward 2.5x that, as FlashAttention counts them).
// With --python PY (a Python with torch), PyTorch's scaled_dot_product_attention on the same
// device, shapes and dtype (is_causal; on a GPU its flash kernel) is measured in the same
// run and the ratio printed per context: the peer is a column, never a constant.
// On the cuda device each of its attention kernels that can run (nn/attention_kernel.h:
// simt always, tensor_cores (wmma) and mma with bf16 on compute capability 8.0+) is a row
// of its own, their repetitions alternated, and the headline compares SIMT with the faster
// tensor-core kernel (or ferry's fastest with SDPA when --python is given).
#pragma once

#include <string>

#include "benchmarks/bench_report.h"

namespace ferry::bench {

struct AttentionBenchOptions {
  std::string device = "cpu";  // cpu | cuda
  bool bf16 = false;
  std::string python;  // "" = no peer column
  int threads = 0;     // CPU threads (0 = all cores)
  bool quick = false;  // T = 256 and 1024 only, fewer repetitions
};

int run_attention_bench(const AttentionBenchOptions& opt, Report& report);

}  // namespace ferry::bench
