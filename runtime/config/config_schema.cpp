#include "runtime/config/config_schema.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>

#include "base/env.h"
#include "offload/tier.h"
#include "runtime/config/config.h"

namespace ferry::runtime {

using nlohmann::json;

namespace {

// Whether a JSON number is a value of the integer type T: an integer within its range, or
// a float (5e8) within it. Converting any other would wrap, or be undefined for a float.
template <class T>
bool fits(const json& v) {
  if (v.is_number_unsigned()) return std::in_range<T>(v.get<uint64_t>());
  if (v.is_number_integer()) return std::in_range<T>(v.get<int64_t>());
  const double d = v.get<double>();
  return d >= static_cast<double>(std::numeric_limits<T>::min()) && d < std::ldexp(1.0, std::numeric_limits<T>::digits);
}

// Converts a checked knob value to a field's type and back. Integer fields also take
// KnobType::number values (bucket sizes written 5e8); lists of paths are comma-joined.
template <class T>
void assign(T& field, const json& v) {
  if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::string> || std::is_floating_point_v<T>) {
    field = v.get<T>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!fits<T>(v)) throw ConfigError(v.dump() + " is out of range for this key");  // check_value refused it first
    field = v.is_number_integer() ? v.get<T>() : static_cast<T>(v.get<double>());
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    field.clear();
    const std::string joined = v.get<std::string>();
    for (size_t start = 0, comma = 0; comma != std::string::npos; start = comma + 1) {
      comma = joined.find(',', start);
      field.push_back(joined.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    }
  } else if constexpr (std::is_same_v<T, offload::Tier>) {
    // The one place a tier's word becomes a Tier; check_value refused any other word first.
    const std::optional<offload::Tier> t = offload::tier_from_word(v.get<std::string>());
    if (!t) throw ConfigError(v.dump() + " is not a tier (none, cpu, nvme)");
    field = *t;
  } else {
    static_assert(std::is_void_v<T>, "no conversion for this field type");
  }
}

template <class T>
json to_json(const T& field) {
  if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    if (field.empty()) return nullptr;
    std::string joined;
    for (const std::string& p : field) joined += (joined.empty() ? "" : ",") + p;
    return joined;
  } else if constexpr (std::is_same_v<T, offload::Tier>) {
    return offload::tier_word(field);
  } else {
    return field;
  }
}

// `access` is a generic lambda returning a reference to the field, of a Config or a const Config.
template <class Access>
Binding field(Access access) {
  using T = std::remove_reference_t<decltype(access(std::declval<Config&>()))>;
  Binding b{[access](Config& c, const json& v) { assign(access(c), v); },
            [access](const Config& c) { return to_json(access(c)); }};
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) b.fits = [](const json& v) { return fits<T>(v); };
  return b;
}

#define F(member) field([](auto& c) -> auto& { return c.member; })

Binding betas() {
  return {[](Config& c, const json& v) {
            c.optimizer.beta1 = v[0].get<double>();
            c.optimizer.beta2 = v[1].get<double>();
          },
          [](const Config& c) { return json::array({c.optimizer.beta1, c.optimizer.beta2}); }};
}

// A knob the cross-key rules consume (config_rules.cpp) with no field of its own.
Binding rule_only() { return {}; }

// model.arch's choices and description: the registry's families (nn/arch.h).
std::vector<std::string> arch_choices() {
  std::vector<std::string> out;
  for (const nn::Arch& a : nn::architectures()) out.emplace_back(a.name);
  return out;
}
std::string arch_description() {
  std::string out;
  for (const nn::Arch& a : nn::architectures()) out += (out.empty() ? "" : "; ") + std::string(a.summary);
  return out;
}

}  // namespace

const std::vector<Knob>& config_knobs() {
  static const std::vector<Knob> knobs = {

      // DeepSpeed's names for the runtime keys.
      {"train_micro_batch_size_per_gpu", F(micro_batch), KnobType::integer, 16, "sequences per micro-batch per rank", 1, {}},
      {"gradient_accumulation_steps", F(grad_accum), KnobType::integer, 1, "micro-batches summed into one optimizer step", 1, {}},
      {"train_batch_size", rule_only(), KnobType::integer, nullptr,
       "global batch in sequences; when given it must equal micro batch x accumulation steps x world size, and a "
       "micro batch or accumulation count left out is derived from it (accumulation 1 when both are), as DeepSpeed does",
       1, {}},
      {"gradient_clipping", F(grad_clip), KnobType::number, 1.0, "clip the global gradient L2 norm to this; 0 disables", 0, {}},
      {"optimizer.type", F(optimizer_type), KnobType::string, "AdamW", "optimizer (decoupled weight decay, bias correction)", {}, {}, false, {"AdamW"}},
      {"optimizer.params.lr", F(optimizer.lr), KnobType::number, 1e-3,
       "peak learning rate (0 is taken, as PyTorch and DeepSpeed take it: the weights stay, to check a pipeline)", 0, {}},
      {"optimizer.params.betas", betas(), KnobType::betas, json::array({0.9, 0.999}), "Adam [beta1, beta2]"},
      {"optimizer.params.eps", F(optimizer.eps), KnobType::number, 1e-8, "Adam epsilon", 0, {}, true},
      {"optimizer.params.weight_decay", F(optimizer.weight_decay), KnobType::number, 0.0,
       "decoupled weight decay, applied to matrices and embeddings (not biases or norms)", 0, {}},
      {"scheduler.type", F(scheduler.type), KnobType::string, nullptr,
       "learning-rate schedule; absent: constant optimizer.params.lr", {}, {}, false,
       {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}},
      {"scheduler.params.warmup_min_lr", F(scheduler.warmup_min_lr), KnobType::number, 0.0, "WarmupLR/WarmupDecayLR: lr at step 0", 0, {}},
      {"scheduler.params.warmup_max_lr", F(scheduler.warmup_max_lr), KnobType::number, 1e-3, "WarmupLR/WarmupDecayLR: lr after warmup", 0, {}},
      {"scheduler.params.warmup_num_steps", F(scheduler.warmup_num_steps), KnobType::integer, 1000,
       "steps of warmup (at least 2 are taken, as in DeepSpeed)", 0, {}},
      {"scheduler.params.warmup_type", F(scheduler.warmup_type), KnobType::string, "log", "warmup curve", {}, {}, false, {"log", "linear"}},
      {"scheduler.params.total_num_steps", F(scheduler.total_num_steps), KnobType::integer, nullptr,
       "WarmupDecayLR/WarmupCosineLR: step at which decay ends (default train.steps); below the warmup: "
       "DeepSpeed's warning, the warmup runs to its end", 0, {}},
      {"scheduler.params.warmup_min_ratio", F(scheduler.warmup_min_ratio), KnobType::number, 0.0,
       "WarmupCosineLR: lr/optimizer lr at step 0", 0, 1},
      {"scheduler.params.cos_min_ratio", F(scheduler.cos_min_ratio), KnobType::number, 1e-4,
       "WarmupCosineLR: lr/optimizer lr at the end of decay", 0, 1},
      {"zero_optimization.stage", F(zero.stage), KnobType::integer, 0,
       "ZeRO stage: 0 replicated (DDP), 1 + optimizer state sharded, 2 + gradients, 3 + parameters", 0, 3},
      {"zero_optimization.reduce_bucket_size", F(zero.reduce_bucket_size), KnobType::number, 5e8,
       "elements (over all ranks) per gradient reduce-scatter / all-reduce call", 1, {}},
      {"zero_optimization.allgather_bucket_size", F(zero.allgather_bucket_size), KnobType::number, 5e8,
       "elements (over all ranks) per parameter all-gather call", 1, {}},
      {"zero_optimization.overlap_comm", F(zero.overlap_comm), KnobType::boolean, true,
       "issue collectives ahead of use and without waiting: parameter all-gathers prefetched, gradient "
       "reductions overlapping backward; false: each collective waited for where it is needed"},
      {"zero_optimization.stage3_prefetch_bucket_size", F(zero.prefetch_bucket_size), KnobType::number, 5e7,
       "stage 3: elements of parameters all-gathered ahead of use, at most", 0, {}},
      {"zero_optimization.stage3_max_live_parameters", F(zero.max_live_parameters), KnobType::number, 1e9,
       "stage 3: elements of gathered parameters alive at once (in use and prefetched), at most; 0 (as DeepSpeed "
       "takes it): nothing gathered ahead, each unit gathered when it is used", 0, {}},
      {"zero_optimization.shard_group_size", F(zero.shard_group_size), KnobType::integer, 0,
       "hybrid sharding (DeepSpeed's mics_shard_size, FSDP's HYBRID_SHARD): shard within groups of this many "
       "consecutive ranks (a node: ranks per node) and replicate across groups, so gathers and reduce-scatters "
       "stay in the group and only gradient shards are all-reduced across groups; 0 = the world (stages 1-3; "
       "must divide the world size)", -1, {}},
      {"zero_optimization.zero_hpz_partition_size", F(zero.hpz_partition_size), KnobType::integer, 1,
       "ZeRO++ hpZ, stage 3: keep a second copy of the weights sharded over groups of this many consecutive ranks "
       "(a node: ranks per node), made by each unit's first gather of a step, so that backward's gathers and "
       "those of later micro-batches stay in the group; costs 1/this of the model in the compute dtype per rank "
       "on the device; 1 = off (must divide shard_group_size, or the world)", 1, {}},
      {"zero_optimization.offload_optimizer.device", F(offload.optimizer_device), KnobType::string, "none",
       "where the fp32 master weights, Adam m and v and the gradient shards live (stages 1-3)", {}, {}, false,
       {"none", "cpu", "nvme"}},
      {"zero_optimization.offload_optimizer.nvme_path", F(offload.optimizer_paths), KnobType::path, nullptr,
       "folder for the optimizer state when device is nvme (several: comma-separated, striped)"},
      {"zero_optimization.offload_optimizer.pin_memory", F(offload.optimizer_pin), KnobType::boolean, true,
       "page-lock the host staging pool; false runs unpinned when RLIMIT_MEMLOCK is too low"},
      {"zero_optimization.offload_optimizer.buffer_count", F(offload.optimizer_buffers), KnobType::integer, 6,
       "pinned buffers for the optimizer's nvme tiles: 3 per tile (master, m, v); 6 or more lets the next "
       "tile's reads overlap the update (DeepSpeed's default, 4, would not)", 3, 1024},
      {"zero_optimization.offload_param.device", F(offload.param_device), KnobType::string, "none",
       "where the parameter shards live between uses (stage 3 only)", {}, {}, false, {"none", "cpu", "nvme"}},
      {"zero_optimization.offload_param.nvme_path", F(offload.param_paths), KnobType::path, nullptr,
       "folder for the parameter shards when device is nvme (several: comma-separated, striped)"},
      {"zero_optimization.offload_param.pin_memory", F(offload.param_pin), KnobType::boolean, true, "as offload_optimizer.pin_memory"},
      {"zero_optimization.offload_param.buffer_count", F(offload.param_buffers), KnobType::integer, 5,
       "pinned buffers for nvme parameter shards: up to 2 read ahead of use, 1 for reads on demand", 1, 1024},
      {"zero_optimization.offload_param.buffer_size", F(offload.param_buffer_size), KnobType::number, 1e8,
       "elements per parameter staging buffer (a unit shard larger than this moves in pieces)", 1024, {}},
      {"zero_optimization.offload_param.max_in_cpu", F(offload.max_in_cpu), KnobType::number, 0,
       "with device nvme: elements of parameter shards (the first units') kept in host memory instead "
       "(DeepSpeed's default is 1e9, which would keep small models entirely in memory)", 0, {}},
      {"aio.block_size", F(offload.aio.block_size), KnobType::bytes, 1048576, "bytes per NVMe request", 4096, {}},
      {"aio.queue_depth", F(offload.aio.queue_depth), KnobType::integer, 8, "NVMe requests in flight per transfer", 1, 4096},
      {"aio.intra_op_parallelism", F(offload.aio.intra_op_parallelism), KnobType::integer, 1, "threads per transfer on the pread/pwrite path", 1, 256},
      {"aio.single_submit", F(offload.aio.single_submit), KnobType::boolean, false, "submit NVMe requests one at a time"},
      {"aio.overlap_events", F(offload.aio.overlap_events), KnobType::boolean, true, "refill the queue as each request completes"},
      // ferry's own sections.
      {"schedule.prefetch_depth", F(schedule.prefetch_depth), KnobType::integer, 2,
       "units fetched ahead of use, in the order the first step recorded: nvme reads this many ahead, "
       "all-gathers max(1, this - 1) ahead; at most offload_param.buffer_count - 1 with nvme parameters", 0, 64},
      {"schedule.overlap_offload", F(schedule.overlap_offload), KnobType::boolean, true,
       "overlap the offload tiers with compute: nvme parameter reads ahead of use, and CPU Adam with its "
       "nvme traffic on a thread of its own (each unit updated as soon as its gradient is final); false: "
       "everything in the plain sequential order"},
      {"schedule.adam_threads", F(schedule.adam_threads), KnobType::integer, 0,
       "OpenMP threads of the update thread (CPU Adam, gradient norms) with overlap_offload; 0 = auto: 1 on "
       "the cpu device (whose compute threads hold the cores), on a GPU every core this rank was given but "
       "one, pinned to those cores (docs/design/zero.md, \"Cores: compute, I/O and Adam\")", 0, 4096},
      {"comm.progress", F(comm_progress), KnobType::string, "auto",
       "how MPI collectives are driven: blocking calls (fastest, spin a core), polling non-blocking calls "
       "(leave the core to others), or auto: blocking unless the node's ranks outnumber its cores",
       {}, {}, false, {"auto", "blocking", "polling"}},
      {"comm.timeout_s", F(comm_timeout_s), KnobType::number, 300.0,
       "a collective not finished this long after it was issued ends the job with a report", 0, {}, true},
      {"model.preset", rule_only(), KnobType::string, nullptr,
       "named shape: sets arch and every dimension the configuration does not set itself; llama-tiny for tests, "
       "llama-1b, llama-8b, llama-70b, llama-405b (the published Llama 3.x shapes), gpt2-small", {}, {}, false,
       {"llama-tiny", "llama-1b", "llama-8b", "llama-70b", "llama-405b", "gpt2-small"}},
      {"model.arch", F(model_arch), KnobType::string, "gpt2", arch_description(), {}, {}, false, arch_choices()},
      {"model.init_from", F(init_from), KnobType::path, "",
       "a Hugging Face model folder (config.json + *.safetensors): its config.json sets the shape and its "
       "weights start the run, each rank reading only its shards' bytes (docs/guide/finetune.md)"},
      {"lora.r", F(lora.r), KnobType::integer, 0,
       "LoRA adapters of this rank on lora.target_modules, the base frozen (PEFT's LoraConfig, "
       "docs/guide/adapters.md); 0: full fine-tuning", 0, 4096},
      {"lora.lora_alpha", F(lora.alpha), KnobType::number, 8.0,
       "the adapters' scale is lora_alpha / r (PEFT's default 8)", 0, {}, true},
      {"lora.use_rslora", F(lora.rslora), KnobType::boolean, false, "rank-stabilised scale lora_alpha / sqrt(r)"},
      {"lora.lora_dropout", F(lora.dropout), KnobType::number, 0.0,
       "dropout on the adapters' input (PEFT's), masks keyed by the seed, step and global position: the same at "
       "every world size and on resume", 0, 0.95},
      {"lora.target_modules", F(lora.target_modules), KnobType::names, nullptr,
       "the Hugging Face modules that get adapters, PEFT's names and matching (q_proj, k_proj, v_proj, o_proj, "
       "gate_proj, up_proj, down_proj; gpt2: c_attn, c_proj, c_fc), or all-linear; absent: PEFT's default for "
       "the family (q_proj, v_proj; gpt2: c_attn)"},
      {"lora.modules_to_save", F(lora.modules_to_save), KnobType::names, nullptr,
       "modules trained in full beside the adapters (lm_head, embed_tokens, a norm...), PEFT's names"},
      {"lora.bias", F(lora_bias), KnobType::string, "none", "which biases train with the adapters: none (PEFT's "
       "default; all and lora_only are not supported)", {}, {}, false, {"none"}},
      {"lora.base_dtype", F(lora_base_dtype), KnobType::string, "compute",
       "the frozen base's storage: compute (its dtype, bf16 in a bf16 run) or nf4 (QLoRA: the block projections "
       "in bitsandbytes' 4-bit NormalFloat, quantized at start, dequantized in the GEMMs (never a whole layer); needs "
       "bf16 or fp16)", {}, {}, false, {"compute", "nf4"}},
      {"lora.double_quant", F(lora.double_quant), KnobType::boolean, true,
       "nf4: quantize the block scales to 8 bits too (bitsandbytes' bnb_4bit_use_double_quant): 0.516 bytes a "
       "parameter instead of 0.5625"},
      {"model.adapter_from", F(adapter_from), KnobType::path, "",
       "a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) whose adapters start the run "
       "on the model.init_from base; its adapter_config.json sets the lora.* keys"},
      {"model.tie_word_embeddings", F(llama.tie_embeddings), KnobType::boolean, nullptr,
       "llama family: the output head is the token embedding (gpt2's always is); absent: false"},
      {"model.rope_scaling.factor", F(llama.rope_factor), KnobType::number, nullptr,
       "llama family: Llama 3's rope scaling (rope_type llama3) factor; absent: no scaling", 0, {}, true},
      {"model.rope_scaling.low_freq_factor", F(llama.rope_low_freq_factor), KnobType::number, nullptr,
       "llama3 rope scaling: low_freq_factor (absent: 1)", 0, {}, true},
      {"model.rope_scaling.high_freq_factor", F(llama.rope_high_freq_factor), KnobType::number, nullptr,
       "llama3 rope scaling: high_freq_factor (absent: 4)", 0, {}, true},
      {"model.rope_scaling.original_max_position_embeddings", F(llama.rope_original_max_positions),
       KnobType::integer, nullptr, "llama3 rope scaling: the context the base model was trained at (absent: 8192)", 1, {}},
      {"model.n_positions", F(model.n_positions), KnobType::integer, nullptr,
       "gpt2: rows of the position table (absent: block_size); block_size may be smaller", 1, {}},
      {"model.max_position_embeddings", F(max_positions), KnobType::integer, nullptr,
       "llama family: the longest context the model claims (absent: block_size); recorded for export", 1, {}},
      {"model.n_layer", F(model.n_layer), KnobType::integer, 4, "transformer blocks", 1, {}},
      {"model.n_head", F(model.n_head), KnobType::integer, 4, "attention heads (n_embd must be a multiple)", 1, {}},
      {"model.n_kv_head", F(llama.n_kv_head), KnobType::integer, nullptr,
       "llama: key/value heads shared by the query heads (n_head a multiple); absent: n_head", 1, {}},
      {"model.head_dim", F(llama.head_size), KnobType::integer, nullptr,
       "qwen3: the size of each attention head (Hugging Face's head_dim); absent: n_embd / n_head", 2, {}},
      {"model.n_embd", F(model.n_embd), KnobType::integer, 128, "channels of the residual stream", 1, {}},
      {"model.intermediate_size", F(llama.intermediate), KnobType::integer, nullptr,
       "llama: SwiGLU hidden width; absent: 8/3 n_embd rounded up to a multiple of 64", 1, {}},
      {"model.rope_theta", F(llama.rope_theta), KnobType::number, 10000.0, "llama: rotary embedding base", 1, {}},
      {"model.norm_eps", F(llama.norm_eps), KnobType::number, 1e-5, "llama: RMSNorm epsilon", 0, {}, true},
      {"model.vocab_size", F(model.vocab_size), KnobType::integer, 256, "vocabulary; 256 for the byte-level tokenizer, at most 65536 "
       "with data.format uint16", 1, 1 << 20},
      {"model.block_size", F(model.block_size), KnobType::integer, 128, "context length in tokens", 1, {}},
      {"model.seed", F(model_seed), KnobType::integer, 1337, "seed of the weight initialisation", 0, {}},
      {"activation_checkpointing.enabled", F(activation_checkpointing), KnobType::boolean, false,
       "keep only each block's input in forward and recompute the block's forward in backward: identical "
       "gradients, activation memory of about one block instead of all, one more forward of the blocks"},
      {"bf16.enabled", F(bf16), KnobType::boolean, false,
       "mixed precision in bf16: weights gathered and computed, activations in bf16; master weights, "
       "gradients, their reductions and Adam state stay fp32"},
      {"fp16.enabled", F(fp16), KnobType::boolean, false,
       "mixed precision in fp16 (as bf16.enabled) with loss scaling; steps whose gradients overflow are skipped"},
      {"fp16.loss_scale", F(loss_scaling.static_scale), KnobType::number, 0.0, "fp16: 0 = dynamic loss scaling; > 0 a static loss scale", 0, {}},
      {"fp16.initial_scale_power", F(loss_scaling.initial_scale_power), KnobType::integer, 16, "fp16: the dynamic loss scale starts at 2^this", 0, 60},
      {"fp16.loss_scale_window", F(loss_scaling.window), KnobType::integer, 1000, "fp16: steps without overflow before the scale doubles", 1, {}},
      {"fp16.hysteresis", F(loss_scaling.hysteresis), KnobType::integer, 2, "fp16: overflows tolerated before the scale halves", 1, {}},
      {"fp16.consecutive_hysteresis", F(loss_scaling.consecutive_hysteresis), KnobType::boolean, false,
       "fp16: refill the hysteresis on every step without overflow (else only when the scale doubles)"},
      {"fp16.min_loss_scale", F(loss_scaling.min_scale), KnobType::number, 1.0, "fp16: the scale never goes below this; an overflow there stops the run", 0, {}, true},
      {"data.path", F(data.path), KnobType::path, nullptr, "training corpus (required)"},
      {"data.format", F(data.format), KnobType::string, "text",
       "text: a plain-text corpus, one document, through data.tokenizer; uint16: a file of little-endian uint16 token "
       "ids, read whole; tokens: token ids memory-mapped (a file, a folder of *.bin as one stream, or a ferry tokenize "
       "folder; width data.dtype); jsonl: fine-tuning records, one JSON object per line and one record per row of a "
       "batch (data.packing): {\"text\"} (trained on whole), {\"prompt\", \"completion\"} (the loss on the completion, "
       "data.mask_prompt) or {\"messages\": [{\"role\", \"content\"}, ...]} (a conversation rendered by "
       "data.chat_template; the loss on the last turn, the assistant's)", {}, {}, false,
       {"text", "uint16", "tokens", "jsonl"}},
      {"data.dtype", F(data.dtype), KnobType::string, "auto",
       "tokens: the ids' width in the files: uint16, uint32, or auto (uint16 when model.vocab_size <= 65536; a "
       "ferry tokenize folder says uint32 itself)", {}, {}, false, {"auto", "uint16", "uint32"}},
      {"data.tokenizer", F(data.tokenizer), KnobType::path, "auto",
       "auto: model.init_from's tokenizer.json when there is one, else bytes; bytes: every byte a token "
       "(vocabulary 256); or the path of a Hugging Face tokenizer.json", {}, {}, false, {"auto", "bytes"}},
      {"data.packing", F(data.packing), KnobType::string, "padded",
       "jsonl: padded: one record per row, padded after its end; packed: as many whole records per row as fit, "
       "each attending only within itself (llama family: rotary positions)", {}, {}, false, {"padded", "packed"}},
      {"data.chat_template", F(data.chat_template), KnobType::path, "auto",
       "jsonl {\"messages\"} records: auto: the tokenizer folder's chat_template.jinja, else the chat_template of its "
       "tokenizer_config.json; or the path of a tokenizer_config.json, or of a file holding the Jinja template "
       "itself", {}, {}, false, {"auto"}},
      {"data.truncate", F(data.truncate), KnobType::boolean, true,
       "jsonl: a record longer than block_size + 1 tokens is cut to fit its row (the header counts them); false: "
       "it is an error naming the file and the line"},
      {"data.mask_prompt", F(data.mask_prompt), KnobType::boolean, true,
       "jsonl: the loss counts only the completion's tokens (and EOS), not the prompt's"},
      {"data.seed", F(data.seed), KnobType::integer, 1234, "seed of the batch sampler: batches are a function of (seed, step)", 0, {}},
      {"data.val_fraction", F(data.val_fraction), KnobType::number, 0.05,
       "tail of data.path held out for validation (records: the last records); 0: none, every record trains and the "
       "run does not evaluate", 0, 0.5},
      {"data.text_documents", F(data.text_documents), KnobType::string, "file",
       "text through a tokenizer: file: the file is one document, encoded as tokenizer(text) (the post-processor's "
       "BOS once, at its start); lines: each line (with its line end) is one, as Hugging Face datasets' text loader "
       "and run_clm read a .txt (a BOS per line)", {}, {}, false, {"file", "lines"}},
      {"data.val_path", F(data.val_path), KnobType::path, nullptr,
       "a validation file in data.format (an evaluation set): all of it is the validation split and all of "
       "data.path trains (data.val_fraction is then not given)"},
      {"device.type", F(device.type), KnobType::string, "cpu",
       "where the model computes: cpu, or cuda (one GPU per rank; model states stay in host memory)", {}, {}, false,
       {"cpu", "cuda"}},
      {"device.memory", F(device.memory), KnobType::bytes, "4GiB", "cap of the device arena: parameters, gradients, optimizer state, activations (cuda: the GPU arena of activations and the units in use)", 1, {}},
      {"device.threads", F(device.threads), KnobType::integer, 0, "CPU threads for the cpu device; 0 = the node's cores divided among the ranks on it", 0, 4096},
      {"device.attention_kernel", F(device.attention_kernel), KnobType::string, "auto",
       "cuda: attention's kernels: simt (any dtype, head size up to 256), tensor_cores (wmma; bf16/f16 "
       "activations, head size up to 128, compute capability 8.0+), mma (FlashAttention-2's register-resident "
       "mma.sync kernels; bf16/f16 activations, head size 64 or 128, compute capability 8.0+); tensor_cores or mma "
       "where they cannot run is an error naming what is missing; or auto: mma where it can run, else tensor_cores, "
       "else simt (the cpu device has one kernel)",
       {}, {}, false, {"auto", "simt", "tensor_cores", "mma"}},
      {"device.nf4_gemm", F(device.nf4_gemm), KnobType::string, "panel",
       "cuda, QLoRA (lora.base_dtype nf4): panel dequantizes the base a panel at a time (at most 4M values) for "
       "cuBLAS; fused multiplies straight from the 4-bit blobs, dequantized in the GEMM's shared-memory operand "
       "load (mma.sync, compute capability 8.0+; an error naming what is missing elsewhere; not yet timed on a "
       "GPU). The cpu device multiplies bf16 from the blobs where the CPU has AVX512-BF16",
       {}, {}, false, {"panel", "fused"}},
      {"train.steps", F(train.steps), KnobType::integer, 500,
       "optimizer steps; 0 trains nothing and, with checkpoint.dir, saves the initial weights as step 0", 0, {}},
      {"train.eval_every", F(train.eval_every), KnobType::integer, 100, "validate every this many steps; 0 = only at the end", 0, {}},
      {"train.eval_batches", F(train.eval_batches), KnobType::integer, 8, "micro-batches per validation", 1, {}},
      {"train.sample_tokens", F(train.sample_tokens), KnobType::integer, 200, "tokens to generate at the end; 0 = none", 0, {}},
      {"train.sample_temperature", F(train.sample_temperature), KnobType::number, 0.8, "softmax temperature of the sample", 0, {}, true},
      {"log.metrics", F(log.metrics), KnobType::path, nullptr, "JSON-lines metrics file (one object per step and per evaluation)"},
      {"log.tensorboard", F(log.tensorboard), KnobType::path, nullptr,
       "folder of TensorBoard event files (tensorboard --logdir FOLDER): loss, val loss, lr, grad norm, loss scale, "
       "throughput, step time, bytes moved and memory per tier, every step; a resumed run adds a file that continues "
       "the curves. DeepSpeed's tensorboard section sets it to output_path/job_name"},
      {"log.csv", F(log.csv), KnobType::path, nullptr,
       "folder of CSV files, one per scalar (DeepSpeed's csv_monitor layout: train_loss.csv with step,loss rows); "
       "DeepSpeed's csv_monitor section sets it to output_path/job_name"},
      {"log.rank_logs", F(log.rank_logs), KnobType::path, nullptr,
       "folder of each rank's stdout and stderr (rankN.out, rankN.err, appended to; torchrun's --log-dir): rank 0's "
       "stdout and every rank's stderr still print too; ferry launch --log-dir sets it; the watchdog's report "
       "names the files"},
      {"log.every", F(log.every), KnobType::integer, 10, "print a step line every this many steps", 1, {}},
      {"log.progress", F(log.progress), KnobType::string, "auto",
       "a progress bar with ETA redrawn after every step (bar), plain step lines only (lines), or a bar when "
       "stdout is a terminal (auto)", {}, {}, false, {"auto", "bar", "lines"}},
      {"log.peak_tflops", F(log.peak_tflops), KnobType::number, nullptr,
       "peak TFLOP/s of one rank's device, for the model FLOPs utilisation (MFU) in step lines and metrics; "
       "ferry-bench model measures a CPU's, an H200's dense bf16 peak is 989", 0, {}, true},
      {"log.trace", F(log.trace), KnobType::path, nullptr,
       "Chrome trace event file; every rank writes its own (trace.json -> trace.rank0.json, ...): one track per "
       "activity (compute, nvme reads and writes, each collective, cpu adam), steps marked"},
      {"checkpoint.dir", F(checkpoint.dir), KnobType::path, nullptr,
       "directory of checkpoints (one step-N folder each, `latest` naming the newest); set: a checkpoint is "
       "also written at the end of the run and on SIGTERM/SIGINT"},
      {"checkpoint.every_steps", F(checkpoint.every_steps), KnobType::integer, 0, "write a checkpoint every this many steps; 0 = only at the end", 0, {}},
      {"checkpoint.keep_last", F(checkpoint.keep_last), KnobType::integer, 2, "checkpoints kept in checkpoint.dir, newest first; 0 = all", 0, {}},
      {"checkpoint.resume", F(checkpoint.resume), KnobType::string, "none",
       "none; auto: the checkpoint `latest` in checkpoint.dir names (a fresh start if there is none yet); or a "
       "checkpoint directory (ferry-train --resume sets this)"},
  };
  return knobs;
}

#undef F

const std::vector<EnvKnob>& environment_knobs() {
  // Declared with every other variable ferry reads in base/env.cpp (its readers sit below
  // this library); the knobs are ferry's own, those of other programs are left out.
  static const std::vector<EnvKnob> env = [] {
    std::vector<EnvKnob> out;
    for (const EnvVariable& v : environment_variables()) {
      if (v.ferrys) out.push_back({v.name, v.default_value, v.description});
    }
    return out;
  }();
  return env;
}

const Knob* find_knob(const std::string& path) {
  for (const Knob& k : config_knobs())
    if (k.path == path) return &k;
  return nullptr;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_key(const std::string& path) {
  std::vector<std::string> candidates;
  for (const Knob& k : config_knobs()) {
    candidates.push_back(k.path);
    for (size_t dot = k.path.find('.'); dot != std::string::npos; dot = k.path.find('.', dot + 1)) {
      candidates.push_back(k.path.substr(0, dot));  // sections too
    }
  }
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(path, c);
    if (d < best_d) best_d = d, best = c;
  }
  const size_t limit = std::max<size_t>(2, path.size() / 3);
  return best_d <= limit ? best : "";
}

std::string knob_type_name(KnobType t) {
  switch (t) {
    case KnobType::integer: return "an integer";
    case KnobType::number: return "a number";
    case KnobType::boolean: return "true or false";
    case KnobType::string: return "a string";
    case KnobType::path: return "a path (string)";
    case KnobType::bytes: return "a byte count (integer, or a string such as \"512MiB\")";
    case KnobType::betas: return "a pair [beta1, beta2] of numbers in [0, 1)";
    case KnobType::names: return "a list of names (a JSON list of strings, or one string with names separated by commas)";
  }
  return "?";
}

}  // namespace ferry::runtime
