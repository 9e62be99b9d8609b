#include "runtime/config/config_schema.h"

#include <algorithm>

namespace ferry::runtime {

using nlohmann::json;

const std::vector<Knob>& config_knobs() {
  static const std::vector<Knob> knobs = {
      // DeepSpeed's names for the runtime keys.
      {"train_micro_batch_size_per_gpu", KnobType::integer, 16, "sequences per micro-batch per rank", 1, {}},
      {"gradient_accumulation_steps", KnobType::integer, 1, "micro-batches summed into one optimizer step", 1, {}},
      {"train_batch_size", KnobType::integer, nullptr,
       "global batch in sequences; when given it must equal micro batch x accumulation steps x world size", 1, {}},
      {"gradient_clipping", KnobType::number, 1.0, "clip the global gradient L2 norm to this; 0 disables", 0, {}},
      {"optimizer.type", KnobType::string, "AdamW", "optimizer (decoupled weight decay, bias correction)", {}, {}, false, {"AdamW"}},
      {"optimizer.params.lr", KnobType::number, 1e-3, "peak learning rate", 0, {}, true},
      {"optimizer.params.betas", KnobType::betas, json::array({0.9, 0.999}), "Adam [beta1, beta2]"},
      {"optimizer.params.eps", KnobType::number, 1e-8, "Adam epsilon", 0, {}, true},
      {"optimizer.params.weight_decay", KnobType::number, 0.0,
       "decoupled weight decay, applied to matrices and embeddings (not biases or norms)", 0, {}},
      {"scheduler.type", KnobType::string, nullptr,
       "learning-rate schedule; absent: constant optimizer.params.lr", {}, {}, false,
       {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}},
      {"scheduler.params.warmup_min_lr", KnobType::number, nullptr, "WarmupLR/WarmupDecayLR: lr at step 0 (default 0)", 0, {}},
      {"scheduler.params.warmup_max_lr", KnobType::number, nullptr, "WarmupLR/WarmupDecayLR: lr after warmup (default 0.001)", 0, {}},
      {"scheduler.params.warmup_num_steps", KnobType::integer, nullptr, "steps of warmup (default 1000)", 0, {}},
      {"scheduler.params.warmup_type", KnobType::string, nullptr, "warmup curve (default log)", {}, {}, false, {"log", "linear"}},
      {"scheduler.params.total_num_steps", KnobType::integer, nullptr,
       "WarmupDecayLR/WarmupCosineLR: step at which decay ends (default train.steps)", 1, {}},
      {"scheduler.params.warmup_min_ratio", KnobType::number, nullptr,
       "WarmupCosineLR: lr/optimizer lr at step 0 (default 0)", 0, 1},
      {"scheduler.params.cos_min_ratio", KnobType::number, nullptr,
       "WarmupCosineLR: lr/optimizer lr at the end of decay (default 0.0001)", 0, 1},
      {"zero_optimization.stage", KnobType::integer, 0,
       "ZeRO stage: 0 replicated (DDP), 1 + optimizer state sharded, 2 + gradients, 3 + parameters", 0, 3},
      {"zero_optimization.reduce_bucket_size", KnobType::number, 5e8,
       "elements (over all ranks) per gradient reduce-scatter / all-reduce call", 1, {}},
      {"zero_optimization.allgather_bucket_size", KnobType::number, 5e8,
       "elements (over all ranks) per parameter all-gather call", 1, {}},
      {"zero_optimization.overlap_comm", KnobType::boolean, true,
       "issue collectives ahead of use and without waiting: parameter all-gathers prefetched, gradient "
       "reductions overlapping backward; false: each collective waited for where it is needed"},
      {"zero_optimization.stage3_prefetch_bucket_size", KnobType::number, 5e7,
       "stage 3: elements of parameters all-gathered ahead of use, at most", 0, {}},
      {"zero_optimization.stage3_max_live_parameters", KnobType::number, 1e9,
       "stage 3: elements of gathered parameters alive at once (in use and prefetched), at most", 1, {}},
      {"zero_optimization.offload_optimizer.device", KnobType::string, "none",
       "where the fp32 master weights, Adam m and v and the gradient shards live (stages 1-3)", {}, {}, false,
       {"none", "cpu", "nvme"}},
      {"zero_optimization.offload_optimizer.nvme_path", KnobType::path, nullptr,
       "folder for the optimizer state when device is nvme (several: comma-separated, striped)"},
      {"zero_optimization.offload_optimizer.pin_memory", KnobType::boolean, true,
       "page-lock the host staging pool; false runs unpinned when RLIMIT_MEMLOCK is too low"},
      {"zero_optimization.offload_optimizer.buffer_count", KnobType::integer, 6,
       "pinned buffers for the optimizer's nvme tiles: 3 per tile (master, m, v); 6 or more lets the next "
       "tile's reads overlap the update (DeepSpeed's default, 4, would not)", 3, 1024},
      {"zero_optimization.offload_param.device", KnobType::string, "none",
       "where the parameter shards live between uses (stage 3 only)", {}, {}, false, {"none", "cpu", "nvme"}},
      {"zero_optimization.offload_param.nvme_path", KnobType::path, nullptr,
       "folder for the parameter shards when device is nvme (several: comma-separated, striped)"},
      {"zero_optimization.offload_param.pin_memory", KnobType::boolean, true, "as offload_optimizer.pin_memory"},
      {"zero_optimization.offload_param.buffer_count", KnobType::integer, 5,
       "pinned buffers for nvme parameter shards: up to 2 read ahead of use, 1 for reads on demand", 1, 1024},
      {"zero_optimization.offload_param.buffer_size", KnobType::number, 1e8,
       "elements per parameter staging buffer (a unit shard larger than this moves in pieces)", 1024, {}},
      {"zero_optimization.offload_param.max_in_cpu", KnobType::number, 0,
       "with device nvme: elements of parameter shards (the first units') kept in host memory instead "
       "(DeepSpeed's default is 1e9, which would keep small models entirely in memory)", 0, {}},
      {"aio.block_size", KnobType::bytes, 1048576, "bytes per NVMe request", 4096, {}},
      {"aio.queue_depth", KnobType::integer, 8, "NVMe requests in flight per transfer", 1, 4096},
      {"aio.intra_op_parallelism", KnobType::integer, 1, "threads per transfer on the pread/pwrite path", 1, 256},
      {"aio.single_submit", KnobType::boolean, false, "submit NVMe requests one at a time"},
      {"aio.overlap_events", KnobType::boolean, true, "refill the queue as each request completes"},
      // ferry's own sections.
      {"schedule.prefetch_depth", KnobType::integer, 2,
       "units fetched ahead of use, in the order the first step recorded: nvme reads this many ahead, "
       "all-gathers max(1, this - 1) ahead; at most offload_param.buffer_count - 1 with nvme parameters", 0, 64},
      {"schedule.overlap_offload", KnobType::boolean, true,
       "overlap the offload tiers with compute: nvme parameter reads ahead of use, and CPU Adam with its "
       "nvme traffic on a thread of its own (each unit updated as soon as its gradient is final); false: "
       "everything in the plain sequential order"},
      {"comm.progress", KnobType::string, "auto",
       "how MPI collectives are driven: blocking calls (fastest, spin a core), polling non-blocking calls "
       "(leave the core to others), or auto: blocking unless the node's ranks outnumber its cores",
       {}, {}, false, {"auto", "blocking", "polling"}},
      {"comm.timeout_s", KnobType::number, 300.0,
       "a collective not finished this long after it was issued ends the job with a report", 0, {}, true},
      {"model.preset", KnobType::string, nullptr,
       "named shape: sets arch and every dimension the configuration does not set itself; llama-tiny for tests, "
       "llama-1b, llama-8b, llama-70b, llama-405b (the published Llama 3.x shapes), gpt2-small", {}, {}, false,
       {"llama-tiny", "llama-1b", "llama-8b", "llama-70b", "llama-405b", "gpt2-small"}},
      {"model.arch", KnobType::string, "gpt2",
       "gpt2: LayerNorm, learned positions, GELU MLP, biases, tied head; llama: RMSNorm, rotary embeddings, "
       "grouped-query attention, SwiGLU MLP, no biases, untied head", {}, {}, false, {"gpt2", "llama"}},
      {"model.n_layer", KnobType::integer, 4, "transformer blocks", 1, {}},
      {"model.n_head", KnobType::integer, 4, "attention heads (n_embd must be a multiple)", 1, {}},
      {"model.n_kv_head", KnobType::integer, nullptr,
       "llama: key/value heads shared by the query heads (n_head a multiple); absent: n_head", 1, {}},
      {"model.n_embd", KnobType::integer, 128, "channels of the residual stream", 1, {}},
      {"model.intermediate_size", KnobType::integer, nullptr,
       "llama: SwiGLU hidden width; absent: 8/3 n_embd rounded up to a multiple of 64", 1, {}},
      {"model.rope_theta", KnobType::number, 10000.0, "llama: rotary embedding base", 1, {}},
      {"model.norm_eps", KnobType::number, 1e-5, "llama: RMSNorm epsilon", 0, {}, true},
      {"model.vocab_size", KnobType::integer, 256, "vocabulary; 256 for the byte-level tokenizer, at most 65536 "
       "with data.format uint16", 1, 1 << 20},
      {"model.block_size", KnobType::integer, 128, "context length in tokens", 1, {}},
      {"model.seed", KnobType::integer, 1337, "seed of the weight initialisation", 0, {}},
      {"activation_checkpointing.enabled", KnobType::boolean, false,
       "keep only each block's input in forward and recompute the block's forward in backward: identical "
       "gradients, activation memory of about one block instead of all, one more forward of the blocks"},
      {"bf16.enabled", KnobType::boolean, false,
       "mixed precision in bf16: weights gathered and computed, activations in bf16; master weights, "
       "gradients, their reductions and Adam state stay fp32"},
      {"fp16.enabled", KnobType::boolean, false,
       "mixed precision in fp16 (as bf16.enabled) with loss scaling; steps whose gradients overflow are skipped"},
      {"fp16.loss_scale", KnobType::number, 0.0, "fp16: 0 = dynamic loss scaling; > 0 a static loss scale", 0, {}},
      {"fp16.initial_scale_power", KnobType::integer, 16, "fp16: the dynamic loss scale starts at 2^this", 0, 60},
      {"fp16.loss_scale_window", KnobType::integer, 1000, "fp16: steps without overflow before the scale doubles", 1, {}},
      {"fp16.hysteresis", KnobType::integer, 2, "fp16: overflows tolerated before the scale halves", 1, {}},
      {"fp16.consecutive_hysteresis", KnobType::boolean, false,
       "fp16: refill the hysteresis on every step without overflow (else only when the scale doubles)"},
      {"fp16.min_loss_scale", KnobType::number, 1.0, "fp16: the scale never goes below this; an overflow there stops the run", 0, {}, true},
      {"data.path", KnobType::path, nullptr, "training corpus (required)"},
      {"data.format", KnobType::string, "text", "text: bytes are tokens; uint16: little-endian token ids", {}, {}, false, {"text", "uint16"}},
      {"data.seed", KnobType::integer, 1234, "seed of the batch sampler: batches are a function of (seed, step)", 0, {}},
      {"data.val_fraction", KnobType::number, 0.05, "tail of the corpus held out for validation", 0, 0.5, true},
      {"device.type", KnobType::string, "cpu",
       "where the model computes: cpu, or cuda (one GPU per rank; model states stay in host memory)", {}, {}, false,
       {"cpu", "cuda"}},
      {"device.memory", KnobType::bytes, "4GiB", "cap of the device arena: parameters, gradients, optimizer state, activations (cuda: the GPU arena of activations and the units in use)", 1, {}},
      {"device.threads", KnobType::integer, 0, "CPU threads for the cpu device; 0 = the node's cores divided among the ranks on it", 0, 4096},
      {"train.steps", KnobType::integer, 500, "optimizer steps", 1, {}},
      {"train.eval_every", KnobType::integer, 100, "validate every this many steps; 0 = only at the end", 0, {}},
      {"train.eval_batches", KnobType::integer, 8, "micro-batches per validation", 1, {}},
      {"train.sample_tokens", KnobType::integer, 200, "tokens to generate at the end; 0 = none", 0, {}},
      {"train.sample_temperature", KnobType::number, 0.8, "softmax temperature of the sample", 0, {}, true},
      {"log.metrics", KnobType::path, nullptr, "JSON-lines metrics file (one object per step and per evaluation)"},
      {"log.every", KnobType::integer, 10, "print a step line every this many steps", 1, {}},
      {"log.progress", KnobType::string, "auto",
       "a progress bar with ETA redrawn after every step (bar), plain step lines only (lines), or a bar when "
       "stdout is a terminal (auto)", {}, {}, false, {"auto", "bar", "lines"}},
      {"log.peak_tflops", KnobType::number, nullptr,
       "peak TFLOP/s of one rank's device, for the model FLOPs utilisation (MFU) in step lines and metrics; "
       "ferry-bench model measures a CPU's, an H200's dense bf16 peak is 989", 0, {}, true},
      {"log.trace", KnobType::path, nullptr,
       "Chrome trace event file; every rank writes its own (trace.json -> trace.rank0.json, ...): one track per "
       "activity (compute, nvme reads and writes, each collective, cpu adam), steps marked"},
      {"checkpoint.dir", KnobType::path, nullptr,
       "directory of checkpoints (one step-N folder each, `latest` naming the newest); set: a checkpoint is "
       "also written at the end of the run and on SIGTERM/SIGINT"},
      {"checkpoint.every_steps", KnobType::integer, 0, "write a checkpoint every this many steps; 0 = only at the end", 0, {}},
      {"checkpoint.keep_last", KnobType::integer, 2, "checkpoints kept in checkpoint.dir, newest first; 0 = all", 0, {}},
      {"checkpoint.resume", KnobType::string, "none",
       "none; auto: the checkpoint `latest` in checkpoint.dir names (a fresh start if there is none yet); or a "
       "checkpoint directory (ferry-train --resume sets this)"},
  };
  return knobs;
}

const std::vector<EnvKnob>& environment_knobs() {
  static const std::vector<EnvKnob> env = {
      {"FERRY_LOG", "warn",
       "diagnostic lines on stderr up to this level: error, warn, info (what was set up where), debug (per step), "
       "trace (per unit); each line prefixed [ferry host:pid rank LEVEL subsystem]"},
      {"FERRY_LOG_SUBSYS", "all",
       "subsystems whose info/debug/trace lines print, comma-separated, ^name excludes: init, config, comm, offload, "
       "sched, optim, ckpt, train"},
      {"FERRY_FAULT_SKIP_COLLECTIVE", "-", "tests only: RANK:SEQ makes that rank skip that collective (watchdog test)"},
      {"FERRY_FAULT_KILL_IN_CHECKPOINT", "-", "tests only: RANK:STEP kills that rank while it writes that checkpoint"},
  };
  return env;
}

const Knob* find_knob(const std::string& path) {
  for (const Knob& k : config_knobs())
    if (k.path == path) return &k;
  return nullptr;
}

namespace {

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

}  // namespace

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
  }
  return "?";
}

}  // namespace ferry::runtime
