// The roofline ledger's prediction of a model's forward+backward on a GPU (nn/op_ledger.h),
// made without one: the model runs once on a LedgerDevice (nn/ledger_device.h), which checks
// shapes, computes nothing and records each op's launches, FLOPs and bytes as the cuda device
// incurs them; the H100's and H200's rates turn that into seconds. `ferry bench model
// --predict` prints it beside each measurement (alone where there is no GPU).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/attention_kernel.h"
#include "nn/model.h"
#include "nn/op_ledger.h"

namespace ferry::bench {

struct Prediction {
  struct Gpu {
    std::string name;
    double seconds = 0;  // one forward+backward
    double mfu = 0;      // model FLOPs (Model::flops_per_token) over seconds, against 989 TFLOP/s
    std::vector<nn::OpLedger::Line> lines;  // per op, with its predicted seconds
  };
  int64_t launches = 0;
  int64_t widened = 0;  // ops that took a widening (f32 scratch) path
  double ledger_flops = 0, model_flops = 0;
  Gpu h100, h200;
  std::vector<std::string> sources;  // each rate and where it comes from
  nlohmann::json to_json() const;
};

using ModelMaker = std::function<std::unique_ptr<nn::Model>(nn::Device&, nn::DType)>;

// One zero_grads + forward + backward of make()'s model at B x T tokens, weights in `dtype`,
// gradients in f32 (the trainer's), attention (heads of head_dim) through `attention`'s
// kernels (automatic: the tensor cores, as the cuda device picks them for bf16).
Prediction predict_forward_backward(const ModelMaker& make, nn::DType dtype, int64_t B, int64_t T, int64_t head_dim,
                                    nn::AttentionKernel attention);

// The ops taking the most predicted time on the H100, `top` of them, one line each.
std::string describe_top_ops(const Prediction& p, size_t top);

}  // namespace ferry::bench
