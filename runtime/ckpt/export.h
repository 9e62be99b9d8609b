// Consolidated weights from a sharded checkpoint, as one safetensors file with the
// model's tensor names: for GPT-2, Hugging Face's ("wte.weight", "h.0.attn.c_attn.weight",
// ... "ln_f.bias"; the output head is tied to wte); GPT-2's Conv1D layers store weights
// [in, out], ferry's linear layers [out, in]: those four matrices per block are transposed
// on the way. For Llama, Meta's names with q/k/v and gate/up fused
// ("layers.0.attention.wqkv.weight"), [out, in] as stored.
// Streams unit by unit: memory holds one unit's master weights (plus one tensor's
// converted copy), whatever the model's size and the checkpoint's world size.
// Errors: CheckpointError for a refused checkpoint, std::runtime_error for the output.
#pragma once

#include <cstdint>
#include <string>

namespace ferry::runtime {

struct ExportReport {
  int tensors = 0;
  int64_t parameters = 0;
  uint64_t bytes = 0;              // of the output file's data
  uint64_t largest_unit_bytes = 0;  // the buffer that bounded memory
  int64_t step = 0;
  std::string checkpoint;          // the step directory read
};

// `checkpoint` is a step directory or a checkpoint.dir (its `latest` is used);
// dtype "fp32" or "bf16" (round to nearest even).
ExportReport export_safetensors(const std::string& checkpoint, const std::string& out, const std::string& dtype);

// True for the weights GPT-2 keeps transposed ([in, out]).
bool gpt2_conv1d_weight(const std::string& name);

}  // namespace ferry::runtime
