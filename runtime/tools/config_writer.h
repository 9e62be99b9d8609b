// ferry config: a ready configuration file built from a few choices, as DeepSpeed's and
// accelerate's setup guides write one.
//   deepspeed  a DeepSpeed ds_config.json, in DeepSpeed's own key names and structure, for
//              `ferry train --config FERRY.json --deepspeed FILE` (or DeepSpeed itself);
//   ferry      a ferry configuration (model, data, device, train, and the runtime keys under
//              DeepSpeed's names, as examples/configs/tiny.json), for `ferry train --config FILE`.
// What a choice does not set is left to the loader: in a DeepSpeed file as "auto" (ferry,
// like the Hugging Face integration, takes the ferry file's value or its default:
// runtime/config/deepspeed_config.h); in a ferry file it is left out (ferry's default).
//
// Errors: an illegal combination (offload_param below stage 3, offload_optimizer at stage 0,
// nvme without a path, bf16 with fp16, a stage outside 0-3, ...) throws ConfigError naming
// the flag; then the document is loaded through ferry's own loader (runtime::load_config),
// and a ConfigError it throws (naming the key) is passed on, prefixed "ferry's loader refuses".
// Paths (nvme, data, init_from) are written absolute, so the file means the same wherever it is
// saved. Thread-safe: the check writes its files in a folder of its own under the system temp
// folder, removed before returning.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ferry::runtime {

struct ConfigChoices {
  // Both kinds.
  int zero_stage = 2;                      // 0..3
  std::string offload_optimizer = "none";  // none | cpu | nvme (stage 1-3)
  std::string offload_param = "none";      // none | cpu | nvme (stage 3)
  std::string nvme_path;                   // needed by nvme; made absolute
  bool pin_memory = true;                  // offload_*.pin_memory
  bool bf16 = false, fp16 = false;         // at most one; neither: "auto" (deepspeed), fp32 (ferry)
  std::optional<int64_t> micro_batch;      // train_micro_batch_size_per_gpu
  std::optional<int64_t> grad_accum;       // gradient_accumulation_steps
  std::optional<double> clip;              // gradient_clipping
  std::optional<double> lr, weight_decay;  // optimizer.params
  std::optional<int64_t> warmup_steps;     // a scheduler when set
  std::string scheduler;     // WarmupLR | WarmupDecayLR | WarmupCosineLR; "" = WarmupDecayLR
                             // (needs warmup_steps)
  int shard_group_size = 0;  // zero_optimization.mics_shard_size; 0 = not written
  // ferry only.
  std::string
      model;  // "" or tiny: examples/configs/tiny-model.json's shape; else a model.preset name
  std::string init_from;       // a Hugging Face folder; replaces `model`
  int64_t block_size = 0;      // model.block_size; 0 = the model's own
  std::string data;            // data.path (required)
  std::string data_format;     // data.format; "" = ferry's default (text)
  std::string device = "cpu";  // cpu | cuda
  std::string device_memory;   // device.memory ("4GiB"); "" = ferry's default
  int64_t steps = 0;           // train.steps; 0 = ferry's default
};

// One written file and what was chosen, one "key = value (why)" line per leaf, in order.
struct WrittenConfig {
  nlohmann::ordered_json doc;  // in the order DeepSpeed's guides write the keys
  std::vector<std::string> choices;
};

// The DeepSpeed document for `c` (the ferry-only fields are ignored), checked by loading it
// beside a tiny ferry base file. Both are checked at a world of shard_group_size ranks
// (or 1), since a shard group must divide the world.
WrittenConfig deepspeed_config(const ConfigChoices& c);

// The ferry document for `c`, checked by loading it alone (with init_from, its config.json
// is read).
WrittenConfig ferry_config(const ConfigChoices& c);

}  // namespace ferry::runtime
