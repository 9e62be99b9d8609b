// ferry export --hf: a checkpoint as a Hugging Face model folder that transformers'
// AutoModelForCausalLM.from_pretrained loads with no conversion: config.json for the
// architecture (the registry's Hugging Face class, nn/arch.h: GPT2LMHeadModel ... Qwen3ForCausalLM),
// Hugging Face's tensor names and layouts (q/k/v and gate/up split, GPT-2's Conv1D weights
// transposed), model.safetensors or shards of at most max_shard_bytes with
// model.safetensors.index.json, in fp32, bf16 or fp16, and every tokenizer, chat-template
// and generation file of the source folder when the run started from one (the checkpoint's
// hf/ folder, see hf_side_files), byte for byte.
// When the checkpoint carries the source config.json, its other keys (token ids, ...) are
// kept and the shape keys are written over them.
// Memory: one unit's master weights plus one tensor's converted copy, whatever the model.
// Errors: CheckpointError for a refused checkpoint, std::runtime_error for the output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry::runtime {

struct HfExportReport {
  int tensors = 0, files = 0;
  int64_t parameters = 0;
  uint64_t bytes = 0;               // of tensor data written
  uint64_t largest_unit_bytes = 0;  // the buffer that bounded memory
  int64_t step = 0;
  std::string checkpoint, architecture;
  std::vector<std::string> carried;  // side files copied from the checkpoint's hf/ (config.json aside)
};

// `checkpoint`: a step directory or a checkpoint.dir (its latest); dtype fp32|bf16|fp16;
// `out` is created (it must not hold a model already). Every file is written as NAME.tmp and
// renamed when synced; config.json and the side files come first, the weights next, the
// index (or the single model.safetensors) last, so a failed export leaves no file that
// makes the folder look like a model, and a retry into it is allowed. Errors name the file.
// A checkpoint of adapters (lora.r > 0) holds no base: it needs `merge`, which reads the
// frozen tensors from the base folder the manifest names (`base` when it moved) and writes
// W + scale B A for every adapted projection (runtime/hf/peft.h's merge_adapters), the
// adapters themselves left out; without `merge` it is refused, naming --peft and --merge.
HfExportReport export_hf(const std::string& checkpoint, const std::string& out, const std::string& dtype,
                         uint64_t max_shard_bytes, bool merge = false, const std::string& base = "");

}  // namespace ferry::runtime
