// DeepSpeed configuration files as the runtime part of a ferry run:
//   ferry-train --config ferry.json --deepspeed ds_config.json
// ferry.json keeps ferry's own sections (model, data, device, train, log, ...); the
// DeepSpeed file supplies batch, optimizer, scheduler, ZeRO, offload and aio keys, under
// DeepSpeed's names and spellings (stage3_ prefixes or not, aio.thread_count, cpu_offload).
//
// Every key of the DeepSpeed file falls in one of four kinds:
//   mapped    the ferry knob of the same meaning (config_schema.cpp);
//   "auto"    Hugging Face's placeholder: the value comes from ferry.json, or ferry's
//             default, or is computed (train_batch_size; warmup_max_lr = optimizer lr;
//             reduce_bucket_size = n_embd^2 and stage3_prefetch_bucket_size =
//             0.9 n_embd^2, as the HF integration sets them); every resolved value is
//             reported;
//   ignored   keys that do not change what is computed (logging, monitors, memory
//             layout hints such as contiguous_gradients or sub_group_size): listed in one
//             warning;
//   refused   keys whose effect ferry does not implement and whose absence would change
//             the result (fp16/bf16/amp enabled, other optimizers and schedules,
//             quantized or low-precision communication, pipeline, sparse attention,
//             tensor or sequence parallelism of more than one rank, ...): a ConfigError
//             naming the file and the key.
// Keys are named as the file writes them (`max_live_parameters`, not ferry's
// `stage3_max_live_parameters`; an accelerate YAML's `deepspeed_config.zero_stage`):
// `names` maps a DeepSpeed key path to the name to use, and DeepSpeedImport::written keeps
// it for each ferry key, so later checks of the value can say it too.
// Pure functions of their inputs; errors are ConfigError with "FILE: key '...': why".
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ferry::runtime {

struct DeepSpeedImport {
  nlohmann::json runtime = nlohmann::json::object();  // ferry key paths, nested; "auto" keys absent
  std::vector<std::string> autos;    // ferry key paths whose DeepSpeed value was "auto"
  std::vector<std::string> ignored;  // DeepSpeed key paths ferry ignores (do not change results)
  std::map<std::string, std::string> written;  // ferry key path -> the key as the file wrote it
};

// Translates a DeepSpeed document read from `source`; relative nvme paths are resolved
// against `base_dir` (the file's folder). `names`: DeepSpeed key path -> the name messages
// use for it (empty: the path itself).
DeepSpeedImport translate_deepspeed(const nlohmann::json& ds, const std::string& source, const std::string& base_dir,
                                    const std::map<std::string, std::string>& names = {});

}  // namespace ferry::runtime
