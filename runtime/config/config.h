// The run's configuration: one JSON file plus `--set key.path=value` overrides, checked
// against config_schema, with DeepSpeed's names for the runtime keys.
//
// Errors (unknown key, wrong type, value out of range, inconsistent values, unreadable
// file) throw ConfigError whose message names the file (or the --set argument) and the
// key, and suggests the closest valid key for a misspelt one.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/arch.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "nn/lora.h"
#include "offload/cpu_adam.h"
#include "runtime/config/sections.h"

namespace ferry::runtime {

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};



// Filled by the knob table (config_schema.cpp binds every key to its field); the
// initialisers equal the table's defaults, checked by test_config.
struct Config {
  nn::GPTConfig model;           // the dimensions every architecture has
  std::string model_arch = "gpt2";  // a family of the registry (nn/arch.h): gpt2, llama, mistral, qwen2, qwen3
  nn::LlamaConfig llama;         // with a Llama-family arch: the whole shape
  nn::LoraOptions lora;          // lora.*: adapters (r > 0) instead of full fine-tuning
  std::string adapter_from;      // a PEFT adapter folder that starts the adapters ("" = none)
  std::string lora_bias = "none";
  std::string lora_base_dtype = "compute";  // lora.base_dtype: compute or nf4 (sets lora.nf4)
  std::string init_from;         // a Hugging Face model folder whose weights start the run ("" = none)
  int64_t max_positions = 0;     // llama family: max_position_embeddings (0 = block_size), for export
  // The registry's descriptor of model_arch (checked against it when the file is read).
  const nn::Arch& arch() const { return nn::arch(model_arch); }
  bool llama_family() const { return arch().family == nn::ArchFamily::llama; }
  uint64_t model_seed = 1337;
  bool activation_checkpointing = false;
  // Mixed precision: zero.compute is bf16 (bf16.enabled) or f16 (fp16.enabled), else f32.
  bool bf16 = false;
  bool fp16 = false;
  LossScaling loss_scaling;  // fp16 only
  struct {
    std::string path, format = "text";
    uint64_t seed = 1234;
    double val_fraction = 0.05;
    std::string val_path;  // "" = the split is data.val_fraction of path
    std::string text_documents = "file";  // file | lines (text through a tokenizer)
    std::string tokenizer = "auto";  // auto | bytes | a tokenizer.json
    bool mask_prompt = true;
    std::string packing = "padded";  // padded | packed (jsonl)
    bool truncate = true;             // jsonl: cut records longer than block_size + 1, else refuse them
    std::string dtype = "auto";      // tokens: auto | uint16 | uint32
    std::string chat_template = "auto";  // auto | a tokenizer_config.json | a Jinja file
  } data;
  struct {
    std::string type = "cpu";
    size_t memory = size_t{4} << 30;
    int threads = 0;
    std::string attention_kernel = "auto";  // auto | simt | tensor_cores (nn/attention_kernel.h)
    std::string nf4_gemm = "panel";         // panel | fused (nn/cuda_device.h: set_cuda_nf4_gemm)
  } device;
  struct {
    int64_t steps = 500, eval_every = 100, eval_batches = 8, sample_tokens = 200;
    double sample_temperature = 0.8;
  } train;
  struct {
    std::string metrics;  // "" = none
    std::string tensorboard;  // "" = none; a folder of TensorBoard event files (rank 0)
    std::string csv;          // "" = none; a folder of DeepSpeed csv_monitor files (rank 0)
    std::string rank_logs;    // "" = none; a folder of each rank's stdout and stderr (base/rank_output.h)
    int64_t every = 10;
    std::string trace;    // "" = none; per rank: trace_path_for_rank()
    std::string progress = "auto";  // auto | bar | lines
    double peak_tflops = 0;         // per rank; 0 = not configured (no MFU)
  } log;
  struct {
    int prefetch_depth = 2;
    bool overlap_offload = true;
    int adam_threads = 0;  // 0 = auto (runtime/zero/update_worker.h plan_update_worker)
  } schedule;
  struct {
    std::string dir;  // "" = no checkpoints
    int64_t every_steps = 0;
    int keep_last = 2;
    std::string resume = "none";  // none | auto | a checkpoint directory
  } checkpoint;
  ZeroConfig zero;
  OffloadConfig offload;
  double comm_timeout_s = 300;
  std::string comm_progress = "auto";
  int64_t micro_batch = 16, grad_accum = 1;
  double grad_clip = 1.0;
  std::string optimizer_type = "AdamW";  // the only one
  offload::AdamWParams optimizer;
  SchedulerConfig scheduler;
  int world_size = 1;
  struct {
    std::string path;                          // "" = no --deepspeed file
    std::vector<std::string> autos_resolved;   // "key = value" for each "auto" in it
    std::vector<std::string> ignored;          // its keys ferry ignores (runtime/config/deepspeed_config.h)
    std::vector<std::string> resolved;         // an accelerate YAML's keys: "key = value -> ferry key = value"
    std::vector<std::string> warnings;         // sentences for the log (num_processes, a file read by the other flag)
  } deepspeed;
  struct {
    std::string path;                    // "" = no --fsdp (a file, or the Trainer's string form)
    std::vector<std::string> resolved;   // "fsdp key = value -> ferry key = value", one per mapped key
    std::vector<std::string> ignored;    // its keys that do not change what is computed (runtime/config/fsdp_config.h)
    std::vector<std::string> warnings;   // sentences for the log (accelerate's num_processes not the world size)
  } fsdp;
  // Hugging Face Trainer names taken as ferry's keys: "learning_rate = 2e-05 ->
  // optimizer.params.lr" (runtime/config/trainer_keys.h), for the run's header.
  std::vector<std::string> trainer_keys;
  // Each nvme_path folder of an offload on nvme and where it was set ("FILE: key 'k'", or
  // the --set argument), for create_nvme_folders.
  std::vector<std::pair<std::string, std::string>> nvme_folders;
  nlohmann::json resolved;  // every effective value, for printing and for the metrics header

  int64_t global_batch() const { return micro_batch * grad_accum * world_size; }
};

// Reads `path`, applies `overrides` ("a.b=value"; the value is JSON if it parses as JSON,
// else a string), checks everything, fills defaults. With `deepspeed_path`, that
// DeepSpeed configuration supplies the runtime keys (runtime/config/deepspeed_config.h): a key
// both files set differently is an error; "auto" takes ferry's file, ferry's default or
// the computed value; `overrides` apply last. Where neither file sets gradient_clipping,
// DeepSpeed's default (0, no clipping) applies. With `fsdp_path` (a PyTorch FSDP,
// Hugging Face Trainer or accelerate configuration, or the Trainer's --fsdp string:
// runtime/config/fsdp_config.h), the same layering: ferry's file < the FSDP file < `overrides`,
// a key both files set differently an error; its transformer_layer_cls_to_wrap must name
// the model's block class; HYBRID_SHARD needs zero_optimization.shard_group_size from ferry's
// file or --set, unless accelerate's num_processes (= the world size) and num_machines give
// the ranks per node. Both `deepspeed_path` and `fsdp_path` is an error.
Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   int world_size = 1, const std::string& deepspeed_path = "",
                   const std::string& fsdp_path = "");
// The same from an in-memory document; `source` names it in errors, `base_dir` resolves
// relative paths. `origins`: key path -> the file that gave the value where it is not
// `source` (a --deepspeed file's keys), for the cross-key errors to name.
Config config_from_json(const nlohmann::json& doc, const std::string& source,
                        const std::string& base_dir, const std::vector<std::string>& overrides,
                        int world_size = 1, const std::map<std::string, std::string>& origins = {});

// Creates every nvme_path folder the run offloads to that does not exist yet, as DeepSpeed
// does (its parents too); run by each rank before training (a node-local folder on each
// node). Throws ConfigError naming the folder, the file and key that set it, and the OS
// error, where one cannot be created or is not a folder.
void create_nvme_folders(const Config& c);

// "512MiB", "2GiB", "1.5GB", "1000" -> bytes. Throws ConfigError naming `what`.
// The model the configuration describes (nn::GPT or nn::Llama), on `device`, computing in
// zero.compute, with activation checkpointing as configured; and its unit layout.
std::unique_ptr<nn::Model> make_model(const Config& c, nn::Device& device);
std::vector<nn::UnitSpec> model_layout(const Config& c);
// Why lora.base_dtype "nf4" cannot run with c's stage, placement and precision (the rule the
// configuration applies, and ferry plan's rows), or "" when it can (or c has no NF4 base).
std::string nf4_refusal(const Config& c);
// The run's FLOPs per token (the 6N + attention rule, nn/arch.h) for `units` (model_layout):
// with frozen tensors, a frozen matrix costs 4 FLOPs a parameter (no weight gradient) and
// each adapter 6; what `ferry plan` and the run's TFLOP/s and MFU count.
double run_flops_per_token(const Config& c, const std::vector<nn::UnitSpec>& units, int64_t T);

size_t parse_bytes(const nlohmann::json& value, const std::string& what);

// Markdown table of every knob (path, type, default, description), for the docs and --help-config.
std::string describe_knobs();

}  // namespace ferry::runtime
