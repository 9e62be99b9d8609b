// PEFT LoRA folders, in and out (docs/guide/adapters.md): adapter_config.json and
// adapter_model.safetensors as peft writes them (tests/data/peft/README.md has the
// conventions, verified against peft 0.21.2).
// - In: runtime/config/peft_config.h turns adapter_config.json into lora.* settings,
//   refusing by name what ferry does not compute; PeftWeights fills the adapters (and the modules saved in
//   full) of a run from adapter_model.safetensors (model.adapter_from).
// - Out: export_peft writes a checkpoint's adapters as a folder that
//   PeftModel.from_pretrained loads onto the base model with no missing or unexpected key.
// Names: "base_model.model." + the Hugging Face module + ".lora_A.weight" / ".lora_B.weight";
// a module saved in full: "base_model.model." + its Hugging Face tensor name. lora_A is
// [r, in] and lora_B [out, r] for every layer, GPT-2's Conv1D too (fan_in_fan_out only
// transposes the merged delta), so no adapter tensor is transposed.
// Errors: ConfigError (configuration) or std::runtime_error (files) naming the file and key.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/lora.h"
#include "nn/unit.h"
#include "runtime/ckpt/safetensors.h"

namespace ferry::runtime {

// The state-dict names.
std::string peft_adapter_name(const std::string& module, bool b);
std::string peft_saved_name(const std::string& hf_tensor);

// The adapters of a run as the manifest records them (and export_peft reads them back).
nlohmann::json adapters_json(const std::vector<nn::LoraAdapter>& adapters, const std::vector<nn::UnitSpec>& layout);

// model.adapter_from: a PEFT folder whose tensors start the adapters and the modules saved
// in full. Checks at construction that every adapter and saved module of the run is in the
// file with its shape, and that the file holds nothing else.
class PeftWeights {
 public:
  PeftWeights(const std::string& dir, const nlohmann::json& model, const std::vector<nn::UnitSpec>& layout,
              const std::vector<nn::LoraAdapter>& adapters);
  ~PeftWeights();
  // Overwrites the elements of [begin, begin + n) of `unit`'s flat buffer (f32) that the
  // folder's tensors cover, reading only those elements' bytes from the file.
  void fill(int unit, int64_t begin, int64_t n, float* dst);

 private:
  struct Source {
    int unit = 0;
    int64_t offset = 0, rows = 0, cols = 0;
    bool transposed = false;  // stored [cols, rows] (GPT-2's Conv1D saved in full)
    std::string name;
    std::vector<int64_t> shape;  // in the file
  };
  std::string path_;
  std::unique_ptr<SafetensorsReader> reader_;
  std::vector<Source> sources_;
};

struct PeftExportReport {
  int tensors = 0;
  int64_t parameters = 0;
  int64_t step = 0;
  std::string checkpoint;
};

// `checkpoint`: a step directory or a checkpoint.dir (its latest) of a run with lora.r > 0.
// Writes out/adapter_config.json and out/adapter_model.safetensors (dtype fp32, bf16 or
// fp16), each written as NAME.tmp and renamed when synced, the weights last.
PeftExportReport export_peft(const std::string& checkpoint, const std::string& out, const std::string& dtype);

class HfWeights;
// Refuses (CheckpointError, naming the file) a base folder whose weight files are not those
// an adapters' checkpoint recorded (manifest "lora.base_files": HfWeights::file_fingerprints).
void check_adapter_base(const nlohmann::json& manifest, const HfWeights& base, const std::string& checkpoint);

// ferry export --hf --merge: adds each adapter's scale x B A into its base rows of the unit
// `unit_w` (the unit's full f32 buffer in `layout`'s offsets).
void merge_adapters(const nlohmann::json& manifest, const std::vector<nn::UnitSpec>& layout, int unit, float* unit_w);

}  // namespace ferry::runtime
