// A Hugging Face model folder opened for streamed, sharded loading (model.init_from).
//
// The constructor reads config.json's companions: model.safetensors, or the shards named by
// model.safetensors.index.json's weight_map, each file's header only. It checks, before
// anything trains, that every tensor ferry's model needs is there with the shape the model
// has, in F32, BF16 or F16, and that no file holds a tensor ferry would drop (tied heads'
// copies and buffers excepted: HfLayout::ignorable). fill() copies any element range of a
// unit's flat buffer from the files, converted to f32, reading only the bytes of that range
// (pread; GPT-2's transposed Conv1D weights: one contiguous run per stored row), so a rank
// that keeps a shard reads only its shard's bytes and holds nothing beyond the range.
//
// Errors: std::runtime_error naming the folder or file and the tensor. Threads: one thread
// per object (fill() seeks nothing shared, but counts bytes).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/unit.h"
#include "runtime/ckpt/safetensors.h"
#include "runtime/hf/hf_tensors.h"

namespace ferry::runtime {

// The files besides the weights that a run started from `dir` carries into its checkpoints
// (their hf/ folder) and `ferry export --hf` writes back: config.json and every tokenizer,
// chat-template and generation file `dir` has (tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, added_tokens.json, chat_template.jinja, chat_template.json,
// additional_chat_templates/*.jinja, generation_config.json, vocab.json, merges.txt,
// tokenizer.model, *.tiktoken, ...). Paths relative to `dir`, sorted; those that exist only.
std::vector<std::string> hf_side_files(const std::string& dir);

class HfWeights {
 public:
  // `model`: the resolved model.* keys; `layout`: the model's units.
  HfWeights(const std::string& dir, const nlohmann::json& model, const std::vector<nn::UnitSpec>& layout);
  ~HfWeights();

  // Writes elements [begin, begin + n) of `unit`'s flat buffer (f32) into dst; alignment
  // padding between tensors becomes 0, and so do the elements of tensors stored in NF4
  // (TensorSpec::nf4: bytes, not values; read_rows gives their values to quantize).
  void fill(int unit, int64_t begin, int64_t n, float* dst);
  // Rows [row0, row0 + rows) of tensor `tensor` of `unit`, in ferry's layout (row-major
  // [rows, cols] of the TensorSpec's shape), into dst.
  void read_rows(int unit, size_t tensor, int64_t row0, int64_t rows, float* dst);
  // A folder bitsandbytes saved in 4-bit NF4 (transformers' load_in_4bit; config.json's
  // quantization_config): each quantized module is its state (`weight` packed U8, `.absmax`,
  // `.nested_absmax`, `.nested_quant_map`, `.quant_map`, `.quant_state.bitsandbytes__nf4`),
  // which the constructor checks is complete for every module the layout quantizes, and the
  // folder's quantization of a module the layout keeps as values is refused. read_nf4: true
  // and the state of the piece of tensor `tensor` starting at row `row0` when the folder holds
  // it quantized (checked: sizes, NF4's table, the quant_state's shape and blocks), false
  // when the folder holds its values (then read_rows, and ferry quantizes them).
  bool read_nf4(int unit, size_t tensor, int64_t row0, nn::Nf4Tensor* out);
  int nf4_states() const { return static_cast<int>(nf4_sources_.size()); }  // modules saved in NF4

  uint64_t bytes_read() const { return bytes_read_; }
  int files() const { return static_cast<int>(readers_.size()); }
  // "3 files (BF16), 124439808 parameters": for the run's header.
  std::string describe() const;
  // Each weight file's name (in dir), size and CRC-32C of its first and last MiB: what an
  // adapters' checkpoint records of its frozen base, and checks on resume and merge (a base
  // and its instruct variant have the same names and sizes; their first MiB, the header
  // and the first tensors, differ). Reads 2 MiB per file.
  nlohmann::json file_fingerprints() const;
  const std::string& dir() const { return dir_; }

 private:
  struct Source {
    SafetensorsReader* reader = nullptr;
    const SafetensorsEntry* entry = nullptr;
    size_t dsize = 4;
  };
  void read_piece(const HfTensorMap& m, const HfPiece& p, const Source& src, int64_t a, int64_t b, float* dst);
  void convert(const Source& src, const void* bytes, int64_t n, float* out) const;

  std::string dir_;
  HfLayout hf_;
  std::vector<std::unique_ptr<SafetensorsReader>> readers_;
  std::map<std::string, Source> sources_;            // by piece name
  struct Nf4Source {
    SafetensorsReader* reader = nullptr;
    const SafetensorsEntry *weight = nullptr, *absmax = nullptr, *nested_absmax = nullptr,
                           *nested_quant_map = nullptr, *quant_map = nullptr, *state = nullptr;
    int64_t rows = 0, cols = 0;
  };
  std::map<std::string, Nf4Source> nf4_sources_;     // by piece name: a bitsandbytes NF4 state
  std::vector<std::vector<size_t>> unit_tensors_;    // per unit: indices into hf_.tensors
  std::vector<nn::UnitSpec> layout_;
  std::vector<char> bytes_;                          // one run's bytes, reused
  uint64_t bytes_read_ = 0;
  std::string dtypes_;
};

}  // namespace ferry::runtime
