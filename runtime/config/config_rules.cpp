// The cross-key rules of the configuration: what no single knob's type and range can say.
// Each knob's own value is already checked and stored (config.cpp); here the keys meet.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/config/config.h"
#include "runtime/config/config_json.h"
#include "runtime/config/peft_config.h"
#include "runtime/config/config_schema.h"
#include "runtime/config/hf_config.h"

namespace ferry::runtime::detail {

using nlohmann::json;

namespace {

// The registry's llama-family names ("llama, mistral, qwen2, qwen3"), and those whose head
// size is a key of its own, for the messages.
std::string llama_archs(bool free_head_only = false) {
  std::string out;
  for (const nn::Arch& a : nn::architectures()) {
    if (a.family != nn::ArchFamily::llama || (free_head_only && !a.free_head_dim)) continue;
    out += (out.empty() ? "" : ", ") + std::string(a.name);
  }
  return out;
}
std::string free_head_archs() { return llama_archs(true); }

bool given(const json& user, const std::string& path) {
  const json* v = get_path(user, path);
  return v && !v->is_null();
}

// The shape's element counts must leave 64-bit offsets room for bytes and for the three
// arrays kept per parameter: at most 2^50 parameters (Llama 3 405B has 2^38.6). Counted in
// double, an upper bound, before anything multiplies the dimensions (the layout's products
// overflowed for an n_embd of 2^40).
void size_rule(const Config& c, const std::string& source) {
  const double C = static_cast<double>(c.model.n_embd), L = static_cast<double>(c.model.n_layer);
  const double rows = static_cast<double>(c.model.vocab_size) + static_cast<double>(c.model.positions()) +
                      static_cast<double>(c.model.block_size);
  const double inter = std::max(4 * C, static_cast<double>(c.llama.intermediate));
  // model.head_dim (qwen3) makes attention's width n_head x head_dim: q, k, v and o at most 4 x that x C.
  const double heads = static_cast<double>(c.model.n_head) * static_cast<double>(c.llama.head_size);
  const double params = L * (4 * std::max(C, heads) * C + 3 * inter * C + 16 * C) + 2 * rows * C + 4 * C;
  if (!(params <= 0x1p50)) {
    std::ostringstream n;
    n << params;
    fail(source, "model.n_layer " + std::to_string(c.model.n_layer) + ", n_embd " + std::to_string(c.model.n_embd) +
                     ", vocab_size " + std::to_string(c.model.vocab_size) + ", block_size " +
                     std::to_string(c.model.block_size) + " give a model of about " + n.str() +
                     " parameters, beyond 2^50");
  }
}

void model_rules(json& resolved, Config& c, const std::string& source) {
  if (c.bf16 && c.fp16) fail(source, "bf16.enabled and fp16.enabled are both true; choose one");
  size_rule(c, source);
  c.zero.compute = c.bf16 ? nn::DType::bf16 : c.fp16 ? nn::DType::f16 : nn::DType::f32;
  if (c.model.n_embd % c.model.n_head != 0) {
    fail(source, "model.n_embd (" + std::to_string(c.model.n_embd) +
                     ") must be a multiple of model.n_head (" + std::to_string(c.model.n_head) +
                     ")");
  }
  if (c.data.path.empty()) fail(source, "key 'data.path' is required (the training corpus)");
  if (c.data.packing == "packed" && c.data.format != "jsonl" && c.data.format != "tokens") {
    fail(source, "data.packing 'packed' packs records: it needs data.format 'jsonl' (or a ferry tokenize folder)");
  }
  if (c.data.packing == "packed" && !c.arch().rotary()) {
    fail(source, "data.packing 'packed' needs rotary positions (model.arch " + llama_archs() + "): with GPT-2's "
                 "learned positions a packed record would see the positions of its place in the row");
  }
  const bool bytes = c.data.tokenizer == "bytes" || (c.data.tokenizer == "auto" && c.init_from.empty());
  if (c.data.format != "uint16" && c.data.format != "tokens" && bytes && c.model.vocab_size < 256) {
    fail(source, "data.format '" + c.data.format + "' with bytes as tokens (data.tokenizer " + c.data.tokenizer +
                     ") needs model.vocab_size >= 256, got " + std::to_string(c.model.vocab_size));
  }
  if (c.data.format == "uint16" && c.model.vocab_size > 65536) {
    fail(source, "data.format 'uint16' holds token ids below 65536 but model.vocab_size is " +
                     std::to_string(c.model.vocab_size));
  }
  const bool kv_given = !get_path(resolved, "model.n_kv_head")->is_null();
  const bool inter_given = !get_path(resolved, "model.intermediate_size")->is_null();
  auto llama_only = [&](const char* key) {
    if (!get_path(resolved, std::string("model.") + key)->is_null()) {
      fail(source, std::string("model.") + key + " applies to the llama family (" + llama_archs() + ") only");
    }
  };
  if (!c.llama_family()) {
    llama_only("n_kv_head");
    llama_only("intermediate_size");
    llama_only("tie_word_embeddings");
    llama_only("rope_scaling.factor");
    llama_only("rope_scaling.low_freq_factor");
    llama_only("rope_scaling.high_freq_factor");
    llama_only("rope_scaling.original_max_position_embeddings");
    llama_only("max_position_embeddings");
    llama_only("head_dim");
    resolved["model"].erase("rope_theta");
    resolved["model"].erase("norm_eps");
    if (c.model.positions() < c.model.block_size) {
      fail(source, "model.block_size (" + std::to_string(c.model.block_size) + ") exceeds model.n_positions (" +
                       std::to_string(c.model.positions()) + ")");
    }
    return;
  }
  if (given(resolved, "model.n_positions")) fail(source, "model.n_positions applies to model.arch 'gpt2' only");
  if (c.max_positions > 0 && c.model.block_size > c.max_positions) {
    fail(source, "model.block_size (" + std::to_string(c.model.block_size) + ") exceeds model.max_position_embeddings (" +
                     std::to_string(c.max_positions) + ")");
  }
  // Llama takes the common dimensions from model.*; its own keys are stored by their knobs.
  nn::LlamaConfig& l = c.llama;
  l.n_layer = c.model.n_layer;
  l.n_head = c.model.n_head;
  l.n_embd = c.model.n_embd;
  l.vocab_size = c.model.vocab_size;
  l.block_size = c.model.block_size;
  c.arch().apply(l);
  if (given(resolved, "model.head_dim") && !c.arch().free_head_dim) {
    fail(source, "model.head_dim applies to model.arch " + free_head_archs() + " only (" + c.model_arch +
                     "'s head size is n_embd / n_head)");
  }
  if ((given(resolved, "model.rope_scaling.low_freq_factor") || given(resolved, "model.rope_scaling.high_freq_factor") ||
       given(resolved, "model.rope_scaling.original_max_position_embeddings")) &&
      !(l.rope_factor > 0)) {
    fail(source, "model.rope_scaling needs model.rope_scaling.factor");
  }
  if (l.rope_factor > 0 && !(l.rope_high_freq_factor > l.rope_low_freq_factor)) {
    fail(source, "model.rope_scaling.high_freq_factor must exceed low_freq_factor");
  }
  if (!kv_given) l.n_kv_head = l.n_head;
  if (!inter_given) l.intermediate = (8 * l.n_embd / 3 + 63) / 64 * 64;
  if (l.n_head % l.n_kv_head != 0) {
    fail(source, "model.n_head (" + std::to_string(l.n_head) +
                     ") must be a multiple of model.n_kv_head (" + std::to_string(l.n_kv_head) +
                     ")");
  }
  if (l.head_dim() % 2 != 0) {
    fail(
        source,
        "model.arch '" + c.model_arch + "' needs an even head size (n_embd / n_head, or model.head_dim) for rotary "
        "embeddings, got " +
            std::to_string(l.head_dim()));
  }
  resolved["model"]["n_kv_head"] = l.n_kv_head;
  resolved["model"]["intermediate_size"] = l.intermediate;
}

// A validation file is the whole validation split: a fraction of data.path as well would
// take training records away for nothing.
void data_rules(json& resolved, const json& user, Config& c, const std::string& source) {
  if (c.data.val_path.empty()) return;
  if (const json* f = get_path(user, "data.val_fraction"); f && f->is_number() && f->get<double>() > 0) {
    fail(source, "data.val_path and data.val_fraction " + f->dump() +
                     " both choose the validation data; keep one (with data.val_path all of data.path trains)");
  }
  c.data.val_fraction = 0;
  resolved["data"]["val_fraction"] = 0;
}

void checkpoint_rules(const Config& c, const std::string& source) {
  if (c.checkpoint.dir.empty() && (c.checkpoint.every_steps > 0 || c.checkpoint.resume == "auto")) {
    fail(source, std::string(c.checkpoint.every_steps > 0 ? "checkpoint.every_steps"
                                                          : "checkpoint.resume 'auto'") +
                     " needs checkpoint.dir (where checkpoints are written)");
  }
}

// DeepSpeed's placement rules: parameters move off the device only at stage 3 (they are
// sharded only there); the optimizer state from stage 1 on; nvme needs a folder.
void offload_rules(const Config& c, const std::string& source) {
  const OffloadConfig& o = c.offload;
  if (o.aio.block_size % 4096 != 0)
    fail(source, "key 'aio.block_size' must be a multiple of 4096 (O_DIRECT)");
  const int stage = c.zero.stage;
  using offload::Tier;
  if (o.param_device != Tier::device && stage != 3) {
    fail(source,
         std::string("zero_optimization.offload_param.device '") + offload::tier_word(o.param_device) +
             "' needs zero_optimization.stage 3 (parameters are sharded only there), got stage " +
             std::to_string(stage));
  }
  if (o.param_device != Tier::device && o.optimizer_device == Tier::device && c.device.type == "cuda") {
    // The optimizer's fp32 state would sit on the GPU while the shards it updates live in
    // host memory or on NVMe: device Adam cannot reach them, and nothing is saved on the GPU.
    fail(source, std::string("zero_optimization.offload_param.device '") + offload::tier_word(o.param_device) +
                     "' with offload_optimizer.device 'none' on a GPU: offload the optimizer too "
                     "(zero_optimization.offload_optimizer.device cpu or nvme), as DeepSpeed's ZeRO-Infinity "
                     "configurations do, or keep the parameters on the GPU");
  }
  if (o.optimizer_device != Tier::device && stage == 0) {
    fail(source, std::string("zero_optimization.offload_optimizer.device '") + offload::tier_word(o.optimizer_device) +
                     "' needs zero_optimization.stage 1, 2 or 3 (the optimizer state is sharded "
                     "from stage 1)");
  }
  if (o.optimizer_device == Tier::nvme && o.optimizer_paths.empty()) {
    fail(source,
         "zero_optimization.offload_optimizer.device 'nvme' needs "
         "zero_optimization.offload_optimizer.nvme_path");
  }
  if (o.param_device == Tier::nvme && o.param_paths.empty()) {
    fail(source,
         "zero_optimization.offload_param.device 'nvme' needs "
         "zero_optimization.offload_param.nvme_path");
  }
}

void shard_group_rules(json& resolved, Config& c, const std::string& source) {
  int& g = c.zero.shard_group_size;
  if (g == -1 || g == c.world_size) g = 0;  // DeepSpeed's -1: MiCS off; the world: plain sharding
  resolved["zero_optimization"]["shard_group_size"] = g;
  if (g == 0) return;
  if (c.zero.stage == 0) {
    fail(source, "zero_optimization.shard_group_size " + std::to_string(g) +
                     " shards state within groups, but stage 0 shards nothing: use stage 1, 2 or 3 (or leave it out)");
  }
  if (c.world_size % g != 0) {
    fail(source, "zero_optimization.shard_group_size " + std::to_string(g) + " must divide the world size (" +
                     std::to_string(c.world_size) + " ranks)");
  }
}

void hpz_rules(Config& c, const std::string& source) {
  const int h = c.zero.hpz_partition_size;
  const int group = c.zero.shard_group_size > 0 ? c.zero.shard_group_size : c.world_size;
  if (h <= 1) return;
  if (c.zero.stage != 3) {
    fail(source, "zero_optimization.zero_hpz_partition_size " + std::to_string(h) +
                     " keeps a second copy of stage 3's gathered weights; at stage " + std::to_string(c.zero.stage) +
                     " the weights are not gathered (use stage 3, or leave it at 1)");
  }
  if (group % h != 0) {
    fail(source, "zero_optimization.zero_hpz_partition_size " + std::to_string(h) + " must divide the " +
                     (c.zero.shard_group_size > 0 ? "shard group size (" : "world size (") + std::to_string(group) +
                     " ranks)");
  }
}

// model.adapter_from: a PEFT folder's adapter_config.json sets the lora.* keys; a key the
// configuration also gives must agree with it (lora_dropout aside: a training choice).
void adapter_from_rules(json& resolved, const json& user, Config& c, const std::string& source) {
  if (c.adapter_from.empty()) return;
  if (c.init_from.empty()) {
    fail(source, "model.adapter_from needs model.init_from: the base model folder the adapter was trained on");
  }
  const std::string file = c.adapter_from + "/adapter_config.json";
  nn::LoraOptions f = read_peft_config(c.adapter_from);
  auto clash = [&](const std::string& key, const json& mine, const json& theirs) {
    if (given(user, key) && mine != theirs) {
      fail(source, "key '" + key + "' is " + mine.dump() + " but " + file + " has " + theirs.dump() +
                       " (the adapter model.adapter_from starts from); leave the key out or make them agree");
    }
  };
  std::vector<std::string> mine_targets = c.lora.target_modules, mine_saved = c.lora.modules_to_save;
  std::sort(mine_targets.begin(), mine_targets.end());
  std::sort(mine_saved.begin(), mine_saved.end());
  clash("lora.r", c.lora.r, f.r);
  clash("lora.lora_alpha", c.lora.alpha, f.alpha);
  clash("lora.use_rslora", c.lora.rslora, f.rslora);
  clash("lora.target_modules", mine_targets, f.target_modules);
  clash("lora.modules_to_save", mine_saved, f.modules_to_save);
  // Dropout is a training choice, not part of the adapter: the file's unless the run sets its own.
  if (!given(user, "lora.lora_dropout")) c.lora.dropout = f.dropout;
  if (c.lora.dropout >= 1.0) fail(source, file + " has lora_dropout " + json(c.lora.dropout).dump() + ": it must be below 1");
  f.dropout = c.lora.dropout;
  c.lora = f;
  for (const char* key : {"lora.r", "lora.lora_alpha", "lora.use_rslora", "lora.lora_dropout", "lora.target_modules",
                          "lora.modules_to_save"}) {
    set_path(resolved, key, find_knob(key)->bind.read(c));
  }
}

}  // namespace

// The blobs are bytes in the units' frozen span, which must then be 16-bit wherever it is
// kept (nn/unit.h: kNf4ElementBytes): the compute dtype's, bf16 or f16, at every stage
// (docs/design/adapters.md section 5).
std::string nf4_rule(const Config& c) {
  if (!c.lora.nf4) return "";
  if (!nn::is_low_precision(c.zero.compute)) {
    return "lora.base_dtype \"nf4\" computes in bf16 or fp16 (QLoRA's bnb_4bit_compute_dtype): set bf16.enabled "
           "(or fp16.enabled) to true";
  }
  return "";
}

namespace {

// lora.*: the targets must name modules the model has (nn/lora.h says why not), and
// hpZ's node copies would keep the frozen base (not built for frozen tensors).
void lora_rules(Config& c, const std::string& source) {
  c.lora.nf4 = c.lora_base_dtype == "nf4";
  if (!c.init_from.empty()) {  // a folder bitsandbytes saved in NF4: read as QLoRA's base, as it is
    const HfModelConfig hf = read_hf_model_config(c.init_from);
    if (hf.nf4 && !(c.lora.enabled() && c.lora.nf4)) {
      fail(source, c.init_from + "/config.json holds a base bitsandbytes quantized to NF4 (quantization_config): train "
                   "adapters on it with lora.r > 0 and lora.base_dtype \"nf4\" (QLoRA)");
    }
    if (hf.nf4 && hf.nf4_double_quant != c.lora.double_quant) {
      fail(source, std::string("lora.double_quant is ") + (c.lora.double_quant ? "true" : "false") + " but " + c.init_from +
                       "/config.json's bnb_4bit_use_double_quant is " + (hf.nf4_double_quant ? "true" : "false") +
                       ": make the two agree");
    }
  }
  if (!c.lora.enabled()) {
    if (!c.lora.target_modules.empty() || !c.lora.modules_to_save.empty()) {
      fail(source, "lora.target_modules and lora.modules_to_save need lora.r > 0 (the adapters' rank)");
    }
    if (c.lora.nf4) fail(source, "lora.base_dtype \"nf4\" quantizes a frozen base: it needs lora.r > 0 (QLoRA)");
    return;
  }
  if (const std::string why = nf4_rule(c); !why.empty()) fail(source, why);
  try {
    (void)model_layout(c);
  } catch (const std::invalid_argument& e) {
    fail(source, e.what());
  }
}

// DeepSpeed's _set_batch_related_parameters: with train_batch_size given, a micro batch
// or accumulation count the configuration leaves out is derived from it (accumulation 1
// when both are out); then the three must multiply out exactly.
void batch_rules(json& resolved, const json& user, Config& c, const std::string& default_source,
                 const std::map<std::string, std::string>& origins) {
  const json& tbs = *get_path(resolved, "train_batch_size");
  // The message names the file train_batch_size came from, and the others' where they differ.
  const auto origin = [&](const std::string& key) {
    const auto it = origins.find(key);
    return it == origins.end() ? default_source : it->second;
  };
  const std::string source = origin("train_batch_size");
  const auto from = [&](const std::string& key) {
    return origin(key) == source || !given(user, key) ? std::string() : ", from " + origin(key);
  };
  if (!tbs.is_null()) {
    const int64_t total = tbs.get<int64_t>(), world = c.world_size;
    const bool micro = given(user, "train_micro_batch_size_per_gpu"),
               accum = given(user, "gradient_accumulation_steps");
    if (!micro && !accum) c.grad_accum = 1;
    if (!micro) c.micro_batch = total / world / c.grad_accum;
    if (micro && !accum) c.grad_accum = total / c.micro_batch / world;
    if (c.micro_batch < 1 || c.grad_accum < 1) {
      fail(source,
           "train_batch_size (" + tbs.dump() + ") is too small for world size " +
               std::to_string(world) +
               (micro ? " and train_micro_batch_size_per_gpu " + std::to_string(c.micro_batch) +
                            from("train_micro_batch_size_per_gpu")
                      : std::string()) +
               (accum ? " and gradient_accumulation_steps " + std::to_string(c.grad_accum) +
                            from("gradient_accumulation_steps")
                      : std::string()));
    }
    resolved["train_micro_batch_size_per_gpu"] = c.micro_batch;
    resolved["gradient_accumulation_steps"] = c.grad_accum;
    if (total != c.global_batch()) {
      fail(source, "train_batch_size (" + tbs.dump() +
                       ") must equal train_micro_batch_size_per_gpu (" +
                       std::to_string(c.micro_batch) + from("train_micro_batch_size_per_gpu") +
                       ") x gradient_accumulation_steps (" + std::to_string(c.grad_accum) +
                       from("gradient_accumulation_steps") + ") x world size (" + std::to_string(world) +
                       ") = " + std::to_string(c.global_batch()));
    }
  }
  resolved["train_batch_size"] = c.global_batch();
}

// DeepSpeed's schedulers take different parameters; a parameter of another schedule is an
// error rather than silently ignored (DeepSpeed's constructors refuse unknown arguments too).
void scheduler_rules(json& resolved, const json& user, Config& c, const std::string& source) {
  const json* params = get_path(user, "scheduler.params");
  std::vector<std::string> given_params;
  if (params) {
    for (const auto& [key, value] : params->items())
      if (!value.is_null()) given_params.push_back(key);
  }
  SchedulerConfig& s = c.scheduler;
  if (s.type.empty()) {
    if (!given_params.empty()) {
      fail(source,
           "scheduler.params given without scheduler.type (one of WarmupLR, WarmupDecayLR, "
           "WarmupCosineLR)");
    }
    resolved.erase("scheduler");  // its parameters' defaults mean nothing without a type
    return;
  }
  std::vector<std::string> allowed = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                      "warmup_type"};
  if (s.type == "WarmupDecayLR") allowed.push_back("total_num_steps");
  if (s.type == "WarmupCosineLR") {
    allowed = {"warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type",
               "total_num_steps"};
  }
  for (const std::string& key : given_params) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      fail(source, "key 'scheduler.params." + key + "' is not a parameter of " + s.type +
                       " (it takes " + list + ")");
    }
  }
  if (get_path(resolved, "scheduler.params.total_num_steps")->is_null())
    s.total_num_steps = c.train.steps;
  // total_num_steps below the warmup is DeepSpeed's warning, not an error: the trainer
  // prints schedule_warning() (runtime/train/lr_schedule.h).
  json filled = json::object();
  for (const std::string& a : allowed) filled[a] = find_knob("scheduler.params." + a)->bind.read(c);
  resolved["scheduler"]["params"] = filled;
}

}  // namespace

void apply_rules(json& resolved, const json& user, Config& c, const std::string& source,
                 const std::map<std::string, std::string>& origins) {
  model_rules(resolved, c, source);
  checkpoint_rules(c, source);
  data_rules(resolved, user, c, source);
  offload_rules(c, source);
  batch_rules(resolved, user, c, source, origins);
  shard_group_rules(resolved, c, source);
  hpz_rules(c, source);
  adapter_from_rules(resolved, user, c, source);
  lora_rules(c, source);
  scheduler_rules(resolved, user, c, source);
}

// Published shapes (Llama 3.x: Meta's model cards; GPT-2 small: OpenAI's). The context is
// a training choice, 2048 here for the Llama presets; set model.block_size to change it.
json model_preset(const std::string& name) {
  auto llama = [](int64_t layers, int64_t heads, int64_t kv, int64_t embd, int64_t inter,
                  int64_t vocab, int64_t ctx, double theta) {
    return json{{"arch", "llama"},     {"n_layer", layers}, {"n_head", heads},
                {"n_kv_head", kv},     {"n_embd", embd},    {"intermediate_size", inter},
                {"vocab_size", vocab}, {"block_size", ctx}, {"rope_theta", theta}};
  };
  if (name == "llama-tiny") return llama(4, 4, 2, 128, 384, 256, 128, 10000.0);
  if (name == "llama-1b") return llama(16, 32, 8, 2048, 8192, 128256, 2048, 500000.0);
  if (name == "llama-8b") return llama(32, 32, 8, 4096, 14336, 128256, 2048, 500000.0);
  if (name == "llama-70b") return llama(80, 64, 8, 8192, 28672, 128256, 2048, 500000.0);
  if (name == "llama-405b") return llama(126, 128, 8, 16384, 53248, 128256, 2048, 500000.0);
  return json{
      {"arch", "gpt2"},      {"n_layer", 12},     {"n_head", 12}, {"n_embd", 768},
      {"vocab_size", 50257}, {"block_size", 1024}};  // gpt2-small (the schema admits no other name)
}

}  // namespace ferry::runtime::detail

namespace ferry::runtime {
std::string nf4_refusal(const Config& c) { return detail::nf4_rule(c); }
}  // namespace ferry::runtime
