// The configuration sections the engine's parts take, as plain structs without JSON: the
// ZeRO engine (runtime/zero), the offload tiers, the LR schedule and fp16 loss scaling.
// Their keys, defaults, ranges and descriptions are declared in runtime/config/config_schema.cpp,
// each knob bound there to its field here. The initialisers are what a struct built in code
// (tests, benchmarks) starts from and equal the table's defaults (test_config checks it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/dtype.h"
#include "offload/storage.h"
#include "offload/tier.h"

namespace ferry::runtime {

struct ZeroConfig {
  int stage = 0;
  int64_t reduce_bucket_size = 500'000'000;     // elements
  int64_t allgather_bucket_size = 500'000'000;  // elements
  bool overlap_comm = true;                      // collectives issued ahead of use / without waiting
  int64_t prefetch_bucket_size = 50'000'000;     // stage3_prefetch_bucket_size: elements gathered ahead
  int64_t max_live_parameters = 1'000'000'000;   // stage3_max_live_parameters: elements gathered at once
  // Hybrid sharding (MiCS, FSDP's HYBRID_SHARD): state is sharded within groups of this
  // many consecutive ranks and replicated across groups; 0 = one group of every rank.
  int shard_group_size = 0;
  // ZeRO++ hpZ (stage 3): after a unit's first gather of a step, each rank keeps a slice of
  // the gathered weights for its node group of this many consecutive ranks, and later
  // gathers in the step (backward, further micro-batches) read from those: inside the node.
  int hpz_partition_size = 1;
  // The weights handed to the model. bf16/f16 (mixed precision): stage 3 casts a unit's
  // fp32 shard and gathers the two-byte copy; stages 0-2 keep a full two-byte copy beside
  // the fp32 weights, refreshed after each update. Every shard, gradient and reduction
  // stays fp32; the fp32 weights remain the optimizer's master copy.
  nn::DType compute = nn::DType::f32;
};

struct OffloadConfig {
  // Read from the words none | cpu | nvme once, by the knob table (config_schema.cpp).
  offload::Tier optimizer_device = offload::Tier::device, param_device = offload::Tier::device;
  std::vector<std::string> optimizer_paths, param_paths;
  bool optimizer_pin = true, param_pin = true;
  int optimizer_buffers = 6, param_buffers = 5;
  int64_t param_buffer_size = 100'000'000, max_in_cpu = 0;  // elements
  offload::AioConfig aio;
  offload::FaultHook fault;  // tests only (no configuration key): injected into every nvme store
};

struct SchedulerConfig {
  std::string type;  // "" = constant lr
  double warmup_min_lr = 0, warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";
  int64_t total_num_steps = 0;
  double warmup_min_ratio = 0, cos_min_ratio = 1e-4;
};

struct LossScaling {
  double static_scale = 0;  // fp16.loss_scale: 0 = dynamic
  int initial_scale_power = 16;
  int64_t window = 1000;  // loss_scale_window
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_scale = 1;  // min_loss_scale
};

}  // namespace ferry::runtime
