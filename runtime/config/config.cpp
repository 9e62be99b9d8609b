#include "runtime/config/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/config/config_schema.h"
#include "runtime/config/deepspeed_config.h"

namespace ferry::runtime {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const std::string& source, const std::string& msg) {
  throw ConfigError(source + ": " + msg);
}

std::string unknown_key_message(const std::string& path) {
  std::string msg = "unknown key '" + path + "'";
  const std::string near = closest_key(path);
  if (!near.empty()) msg += " (did you mean '" + near + "'?)";
  return msg;
}

bool is_section(const std::string& path) {
  for (const Knob& k : config_knobs())
    if (k.path.starts_with(path + ".")) return true;
  return false;
}

std::string range_text(const Knob& k) {
  std::ostringstream os;
  if (k.min && k.max) {
    os << "in " << (k.min_exclusive ? "(" : "[") << *k.min << ", " << *k.max << "]";
  } else if (k.min) {
    os << (k.min_exclusive ? "> " : ">= ") << *k.min;
  } else if (k.max) {
    os << "<= " << *k.max;
  }
  return os.str();
}

void check_range(const Knob& k, double v, const std::string& source) {
  const bool low = k.min && (k.min_exclusive ? v <= *k.min : v < *k.min);
  const bool high = k.max && v > *k.max;
  if (low || high || !std::isfinite(v)) {
    std::ostringstream os;
    os << "key '" << k.path << "' must be " << range_text(k) << ", got " << v;
    fail(source, os.str());
  }
}

// Checks one value against its knob; returns the value to store (relative paths resolved).
json check_value(const Knob& k, const json& v, const std::string& source, const std::string& base_dir) {
  auto type_error = [&]() {
    fail(source, "key '" + k.path + "' must be " + knob_type_name(k.type) + ", got " + v.dump());
  };
  if (v.is_null()) {
    if (!k.default_value.is_null()) fail(source, "key '" + k.path + "' cannot be null");
    return v;
  }
  switch (k.type) {
    case KnobType::integer:
      if (!v.is_number_integer()) type_error();
      check_range(k, v.get<double>(), source);
      return v;
    case KnobType::number:
      if (!v.is_number()) type_error();
      check_range(k, v.get<double>(), source);
      return v;
    case KnobType::boolean:
      if (!v.is_boolean()) type_error();
      return v;
    case KnobType::string:
      if (!v.is_string()) type_error();
      if (!k.choices.empty() &&
          std::find(k.choices.begin(), k.choices.end(), v.get<std::string>()) == k.choices.end()) {
        std::string list;
        for (const auto& c : k.choices) list += (list.empty() ? "" : ", ") + c;
        std::string msg = "key '" + k.path + "' must be one of " + list + ", got " + v.dump();
        fail(source, msg);
      }
      return v;
    case KnobType::path: {
      // One path, or several separated by commas (striped NVMe folders).
      if (!v.is_string() || v.get<std::string>().empty()) type_error();
      std::string out, item;
      std::stringstream list(v.get<std::string>());
      while (std::getline(list, item, ',')) {
        if (item.empty()) fail(source, "key '" + k.path + "' has an empty path in " + v.dump());
        fs::path p(item);
        if (p.is_relative() && !base_dir.empty()) p = fs::path(base_dir) / p;
        out += (out.empty() ? "" : ",") + p.lexically_normal().string();
      }
      return out;
    }
    case KnobType::bytes: {
      const size_t bytes = parse_bytes(v, source + ": key '" + k.path + "'");
      check_range(k, static_cast<double>(bytes), source);
      return v;
    }
    case KnobType::betas: {
      if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number()) type_error();
      for (const json& b : v) {
        const double x = b.get<double>();
        if (!(x >= 0.0 && x < 1.0)) fail(source, "key '" + k.path + "' must hold betas in [0, 1), got " + v.dump());
      }
      return v;
    }
  }
  return v;
}

void set_path(json& root, const std::string& path, const json& value) {
  json* node = &root;
  size_t start = 0;
  for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', start)) {
    node = &(*node)[path.substr(start, dot - start)];
    start = dot + 1;
  }
  (*node)[path.substr(start)] = value;
}

const json* get_path(const json& root, const std::string& path) {
  const json* node = &root;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->is_object() || !node->contains(key)) return nullptr;
    node = &(*node)[key];
    if (dot == std::string::npos) return node;
    start = dot + 1;
  }
}

// Walks the user's document: every leaf must be a knob, every object a section.
void merge_document(json& resolved, const json& doc, const std::string& prefix,
                    const std::string& source, const std::string& base_dir) {
  for (const auto& [key, value] : doc.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (const Knob* k = find_knob(path)) {
      set_path(resolved, path, check_value(*k, value, source, base_dir));
    } else if (is_section(path)) {
      if (!value.is_object()) fail(source, "key '" + path + "' is a section and must be an object, got " + value.dump());
      merge_document(resolved, value, path, source, base_dir);
    } else {
      fail(source, unknown_key_message(path));
    }
  }
}

void apply_override(json& resolved, const std::string& arg) {
  const std::string source = "--set " + arg;
  const size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0) fail(source, "expected key.path=value");
  const std::string path = arg.substr(0, eq), text = arg.substr(eq + 1);
  const Knob* k = find_knob(path);
  if (!k) {
    if (is_section(path)) fail(source, "'" + path + "' is a section; set one of its keys");
    fail(source, unknown_key_message(path));
  }
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;  // bare words are strings: device.memory=2GiB
  set_path(resolved, path, check_value(*k, value, source, fs::current_path().string()));
}

void drop_nulls(json& node) {
  if (!node.is_object()) return;
  for (auto it = node.begin(); it != node.end();) {
    drop_nulls(*it);
    if (it->is_null() || (it->is_object() && it->empty())) {
      it = node.erase(it);
    } else {
      ++it;
    }
  }
}

// Replaces the leaves of `base` with those of `top`, recursing into objects.
void overlay(json& base, const json& top) {
  for (const auto& [key, value] : top.items()) {
    if (value.is_object() && base.contains(key) && base[key].is_object()) {
      overlay(base[key], value);
    } else {
      base[key] = value;
    }
  }
}

// Published shapes (Llama 3.x: Meta's model cards; GPT-2 small: OpenAI's). The context is
// a training choice, 2048 here for the Llama presets; set model.block_size to change it.
json model_preset(const std::string& name) {
  auto llama = [](int64_t layers, int64_t heads, int64_t kv, int64_t embd, int64_t inter, int64_t vocab, int64_t ctx,
                  double theta) {
    return json{{"arch", "llama"},          {"n_layer", layers}, {"n_head", heads},       {"n_kv_head", kv},
                {"n_embd", embd},           {"intermediate_size", inter}, {"vocab_size", vocab},
                {"block_size", ctx},        {"rope_theta", theta}};
  };
  if (name == "llama-tiny") return llama(4, 4, 2, 128, 384, 256, 128, 10000.0);
  if (name == "llama-1b") return llama(16, 32, 8, 2048, 8192, 128256, 2048, 500000.0);
  if (name == "llama-8b") return llama(32, 32, 8, 4096, 14336, 128256, 2048, 500000.0);
  if (name == "llama-70b") return llama(80, 64, 8, 8192, 28672, 128256, 2048, 500000.0);
  if (name == "llama-405b") return llama(126, 128, 8, 16384, 53248, 128256, 2048, 500000.0);
  return json{{"arch", "gpt2"}, {"n_layer", 12}, {"n_head", 12}, {"n_embd", 768}, {"vocab_size", 50257},
              {"block_size", 1024}};  // gpt2-small (the schema admits no other name)
}

// DeepSpeed's schedulers take different parameters; a parameter of another schedule is an
// error rather than silently ignored. Missing ones get DeepSpeed's defaults.
void resolve_scheduler(json& resolved, Config& c, const std::string& source) {
  const json* type = get_path(resolved, "scheduler.type");
  const json* params = get_path(resolved, "scheduler.params");
  if (!type || type->is_null()) {
    const bool any = params && std::any_of(params->begin(), params->end(), [](const json& v) { return !v.is_null(); });
    if (any) {
      fail(source, "scheduler.params given without scheduler.type (one of WarmupLR, WarmupDecayLR, WarmupCosineLR)");
    }
    return;
  }
  SchedulerConfig& s = c.scheduler;
  s.type = type->get<std::string>();
  std::vector<std::string> allowed;
  if (s.type == "WarmupLR") allowed = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"};
  if (s.type == "WarmupDecayLR") {
    allowed = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps"};
  }
  if (s.type == "WarmupCosineLR") {
    allowed = {"warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type", "total_num_steps"};
  }
  json p = params ? *params : json::object();
  for (const auto& [key, value] : p.items()) {
    if (value.is_null()) continue;
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      fail(source, "key 'scheduler.params." + key + "' is not a parameter of " + s.type + " (it takes " + list + ")");
    }
  }
  auto num = [&](const char* key, double dflt) { return p.contains(key) && !p[key].is_null() ? p[key].get<double>() : dflt; };
  s.warmup_min_lr = num("warmup_min_lr", 0.0);
  s.warmup_max_lr = num("warmup_max_lr", 1e-3);
  s.warmup_num_steps = static_cast<int64_t>(num("warmup_num_steps", 1000));
  s.warmup_type = p.contains("warmup_type") && !p["warmup_type"].is_null() ? p["warmup_type"].get<std::string>() : "log";
  s.total_num_steps = static_cast<int64_t>(num("total_num_steps", static_cast<double>(c.train.steps)));
  s.warmup_min_ratio = num("warmup_min_ratio", 0.0);
  s.cos_min_ratio = num("cos_min_ratio", 1e-4);
  // total_num_steps below the warmup is DeepSpeed's warning, not an error: the trainer
  // prints schedule_warning() (runtime/train/lr_schedule.h).
  json filled = json::object();
  for (const auto& a : allowed) {
    if (a == "warmup_min_lr") filled[a] = s.warmup_min_lr;
    if (a == "warmup_max_lr") filled[a] = s.warmup_max_lr;
    if (a == "warmup_num_steps") filled[a] = s.warmup_num_steps;
    if (a == "warmup_type") filled[a] = s.warmup_type;
    if (a == "total_num_steps") filled[a] = s.total_num_steps;
    if (a == "warmup_min_ratio") filled[a] = s.warmup_min_ratio;
    if (a == "cos_min_ratio") filled[a] = s.cos_min_ratio;
  }
  resolved["scheduler"]["params"] = filled;
}

std::vector<std::string> split_paths(const json* v) {
  std::vector<std::string> out;
  if (!v || v->is_null()) return out;
  std::string item;
  std::stringstream list(v->get<std::string>());
  while (std::getline(list, item, ',')) out.push_back(item);
  return out;
}

// DeepSpeed's placement rules: parameters move off the device only at stage 3 (they are
// sharded only there); the optimizer state from stage 1 on; nvme needs a folder.
void resolve_offload(const json& resolved, Config& c, const std::string& source) {
  auto at = [&](const std::string& path) -> const json& { return *get_path(resolved, path); };
  OffloadConfig& o = c.offload;
  o.optimizer_device = at("zero_optimization.offload_optimizer.device").get<std::string>();
  o.param_device = at("zero_optimization.offload_param.device").get<std::string>();
  o.optimizer_paths = split_paths(get_path(resolved, "zero_optimization.offload_optimizer.nvme_path"));
  o.param_paths = split_paths(get_path(resolved, "zero_optimization.offload_param.nvme_path"));
  o.optimizer_pin = at("zero_optimization.offload_optimizer.pin_memory").get<bool>();
  o.param_pin = at("zero_optimization.offload_param.pin_memory").get<bool>();
  o.optimizer_buffers = at("zero_optimization.offload_optimizer.buffer_count").get<int>();
  o.param_buffers = at("zero_optimization.offload_param.buffer_count").get<int>();
  o.param_buffer_size = static_cast<int64_t>(at("zero_optimization.offload_param.buffer_size").get<double>());
  o.max_in_cpu = static_cast<int64_t>(at("zero_optimization.offload_param.max_in_cpu").get<double>());
  o.aio.block_size = parse_bytes(at("aio.block_size"), source + ": key 'aio.block_size'");
  if (o.aio.block_size % 4096 != 0) fail(source, "key 'aio.block_size' must be a multiple of 4096 (O_DIRECT)");
  o.aio.queue_depth = at("aio.queue_depth").get<int>();
  o.aio.intra_op_parallelism = at("aio.intra_op_parallelism").get<int>();
  o.aio.single_submit = at("aio.single_submit").get<bool>();
  o.aio.overlap_events = at("aio.overlap_events").get<bool>();
  const int stage = c.zero.stage;
  if (o.param_device != "none" && stage != 3) {
    fail(source, "zero_optimization.offload_param.device '" + o.param_device +
                     "' needs zero_optimization.stage 3 (parameters are sharded only there), got stage " +
                     std::to_string(stage));
  }
  if (o.optimizer_device != "none" && stage == 0) {
    fail(source, "zero_optimization.offload_optimizer.device '" + o.optimizer_device +
                     "' needs zero_optimization.stage 1, 2 or 3 (the optimizer state is sharded from stage 1)");
  }
  if (o.optimizer_device == "nvme" && o.optimizer_paths.empty()) {
    fail(source, "zero_optimization.offload_optimizer.device 'nvme' needs zero_optimization.offload_optimizer.nvme_path");
  }
  if (o.param_device == "nvme" && o.param_paths.empty()) {
    fail(source, "zero_optimization.offload_param.device 'nvme' needs zero_optimization.offload_param.nvme_path");
  }
}

}  // namespace

size_t parse_bytes(const json& value, const std::string& what) {
  if (value.is_number_integer()) {
    if (value.get<int64_t>() < 0) throw ConfigError(what + " must not be negative, got " + value.dump());
    return value.get<size_t>();
  }
  if (!value.is_string()) {
    throw ConfigError(what + " must be a byte count (integer, or a string such as \"512MiB\"), got " + value.dump());
  }
  const std::string s = value.get<std::string>();
  size_t used = 0;
  double number = 0;
  try {
    number = std::stod(s, &used);
  } catch (const std::exception&) {
    throw ConfigError(what + ": cannot read a byte count from \"" + s + "\"");
  }
  std::string unit = s.substr(used);
  unit.erase(0, unit.find_first_not_of(' '));
  static const std::vector<std::pair<std::string, double>> units = {
      {"", 1},       {"B", 1},          {"KB", 1e3},         {"MB", 1e6},         {"GB", 1e9},
      {"TB", 1e12},  {"KiB", 1024.0},   {"MiB", 1048576.0},  {"GiB", 1073741824.0},
      {"TiB", 1099511627776.0}};
  for (const auto& [name, mult] : units) {
    if (unit == name) {
      if (!(number >= 0) || !std::isfinite(number)) throw ConfigError(what + ": \"" + s + "\" is not a size");
      return static_cast<size_t>(std::llround(number * mult));
    }
  }
  throw ConfigError(what + ": unknown unit \"" + unit + "\" in \"" + s + "\" (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
}

Config config_from_json(const json& doc, const std::string& source, const std::string& base_dir,
                        const std::vector<std::string>& overrides, int world_size) {
  if (!doc.is_object()) fail(source, "the configuration must be a JSON object");
  // Defaults, then a preset's shape, then what the file and --set give (checked first).
  json user = json::object();
  merge_document(user, doc, "", source, base_dir);
  for (const std::string& o : overrides) apply_override(user, o);
  json resolved = json::object();
  for (const Knob& k : config_knobs()) set_path(resolved, k.path, k.default_value);
  if (const json* preset = get_path(user, "model.preset"); preset && preset->is_string()) {
    const json shape = model_preset(preset->get<std::string>());
    for (const auto& [key, value] : shape.items()) set_path(resolved, "model." + key, value);
  }
  overlay(resolved, user);

  auto at = [&](const std::string& path) -> const json& { return *get_path(resolved, path); };
  Config c;
  c.world_size = world_size;
  c.model.n_layer = at("model.n_layer").get<int64_t>();
  c.model.n_head = at("model.n_head").get<int64_t>();
  c.model.n_embd = at("model.n_embd").get<int64_t>();
  c.model.vocab_size = at("model.vocab_size").get<int64_t>();
  c.model.block_size = at("model.block_size").get<int64_t>();
  c.model_arch = at("model.arch").get<std::string>();
  c.model_seed = at("model.seed").get<uint64_t>();
  c.activation_checkpointing = at("activation_checkpointing.enabled").get<bool>();
  const bool bf16 = at("bf16.enabled").get<bool>();
  c.fp16 = at("fp16.enabled").get<bool>();
  if (bf16 && c.fp16) fail(source, "bf16.enabled and fp16.enabled are both true; choose one");
  c.zero.compute = bf16 ? nn::DType::bf16 : c.fp16 ? nn::DType::f16 : nn::DType::f32;
  c.loss_scaling.static_scale = at("fp16.loss_scale").get<double>();
  c.loss_scaling.initial_scale_power = at("fp16.initial_scale_power").get<int>();
  c.loss_scaling.window = at("fp16.loss_scale_window").get<int64_t>();
  c.loss_scaling.hysteresis = at("fp16.hysteresis").get<int>();
  c.loss_scaling.consecutive_hysteresis = at("fp16.consecutive_hysteresis").get<bool>();
  c.loss_scaling.min_scale = at("fp16.min_loss_scale").get<double>();
  if (c.model.n_embd % c.model.n_head != 0) {
    fail(source, "model.n_embd (" + std::to_string(c.model.n_embd) + ") must be a multiple of model.n_head (" +
                     std::to_string(c.model.n_head) + ")");
  }
  if (at("data.path").is_null()) fail(source, "key 'data.path' is required (the training corpus)");
  c.data.path = at("data.path").get<std::string>();
  c.data.format = at("data.format").get<std::string>();
  c.data.seed = at("data.seed").get<uint64_t>();
  c.data.val_fraction = at("data.val_fraction").get<double>();
  if (c.data.format == "text" && c.model.vocab_size < 256) {
    fail(source, "data.format 'text' is byte-level and needs model.vocab_size >= 256, got " +
                     std::to_string(c.model.vocab_size));
  }
  if (c.data.format == "uint16" && c.model.vocab_size > 65536) {
    fail(source, "data.format 'uint16' holds token ids below 65536 but model.vocab_size is " +
                     std::to_string(c.model.vocab_size));
  }
  if (c.model_arch == "llama") {
    nn::LlamaConfig& l = c.llama;
    l.n_layer = c.model.n_layer;
    l.n_head = c.model.n_head;
    l.n_embd = c.model.n_embd;
    l.vocab_size = c.model.vocab_size;
    l.block_size = c.model.block_size;
    l.n_kv_head = at("model.n_kv_head").is_null() ? l.n_head : at("model.n_kv_head").get<int64_t>();
    l.intermediate = at("model.intermediate_size").is_null() ? (8 * l.n_embd / 3 + 63) / 64 * 64
                                                              : at("model.intermediate_size").get<int64_t>();
    l.rope_theta = at("model.rope_theta").get<double>();
    l.norm_eps = at("model.norm_eps").get<double>();
    if (l.n_head % l.n_kv_head != 0) {
      fail(source, "model.n_head (" + std::to_string(l.n_head) + ") must be a multiple of model.n_kv_head (" +
                       std::to_string(l.n_kv_head) + ")");
    }
    if (l.head_dim() % 2 != 0) {
      fail(source, "model.arch 'llama' needs an even head size (n_embd / n_head) for rotary embeddings, got " +
                       std::to_string(l.head_dim()));
    }
    resolved["model"]["n_kv_head"] = l.n_kv_head;
    resolved["model"]["intermediate_size"] = l.intermediate;
  } else {
    for (const char* key : {"n_kv_head", "intermediate_size"}) {
      if (!at(std::string("model.") + key).is_null()) {
        fail(source, std::string("model.") + key + " applies to model.arch 'llama' only");
      }
    }
    resolved["model"].erase("rope_theta");
    resolved["model"].erase("norm_eps");
  }
  c.device.type = at("device.type").get<std::string>();
  c.device.memory = parse_bytes(at("device.memory"), source + ": key 'device.memory'");
  c.device.threads = at("device.threads").get<int>();
  c.train.steps = at("train.steps").get<int64_t>();
  c.train.eval_every = at("train.eval_every").get<int64_t>();
  c.train.eval_batches = at("train.eval_batches").get<int64_t>();
  c.train.sample_tokens = at("train.sample_tokens").get<int64_t>();
  c.train.sample_temperature = at("train.sample_temperature").get<double>();
  c.log.metrics = at("log.metrics").is_null() ? "" : at("log.metrics").get<std::string>();
  c.log.every = at("log.every").get<int64_t>();
  c.log.trace = at("log.trace").is_null() ? "" : at("log.trace").get<std::string>();
  c.log.progress = at("log.progress").get<std::string>();
  c.log.peak_tflops = at("log.peak_tflops").is_null() ? 0.0 : at("log.peak_tflops").get<double>();
  c.schedule.prefetch_depth = at("schedule.prefetch_depth").get<int>();
  c.schedule.overlap_offload = at("schedule.overlap_offload").get<bool>();
  c.checkpoint.dir = at("checkpoint.dir").is_null() ? "" : at("checkpoint.dir").get<std::string>();
  c.checkpoint.every_steps = at("checkpoint.every_steps").get<int64_t>();
  c.checkpoint.keep_last = at("checkpoint.keep_last").get<int>();
  c.checkpoint.resume = at("checkpoint.resume").get<std::string>();
  if (c.checkpoint.dir.empty() && (c.checkpoint.every_steps > 0 || c.checkpoint.resume == "auto")) {
    fail(source, std::string(c.checkpoint.every_steps > 0 ? "checkpoint.every_steps" : "checkpoint.resume 'auto'") +
                     " needs checkpoint.dir (where checkpoints are written)");
  }
  c.zero.stage = at("zero_optimization.stage").get<int>();
  c.zero.reduce_bucket_size = static_cast<int64_t>(at("zero_optimization.reduce_bucket_size").get<double>());
  c.zero.allgather_bucket_size = static_cast<int64_t>(at("zero_optimization.allgather_bucket_size").get<double>());
  c.zero.overlap_comm = at("zero_optimization.overlap_comm").get<bool>();
  c.zero.prefetch_bucket_size = static_cast<int64_t>(at("zero_optimization.stage3_prefetch_bucket_size").get<double>());
  c.zero.max_live_parameters = static_cast<int64_t>(at("zero_optimization.stage3_max_live_parameters").get<double>());
  c.comm_timeout_s = at("comm.timeout_s").get<double>();
  c.comm_progress = at("comm.progress").get<std::string>();
  resolve_offload(resolved, c, source);
  c.micro_batch = at("train_micro_batch_size_per_gpu").get<int64_t>();
  c.grad_accum = at("gradient_accumulation_steps").get<int64_t>();
  c.grad_clip = at("gradient_clipping").get<double>();
  if (const json& tbs = at("train_batch_size"); !tbs.is_null() && tbs.get<int64_t>() != c.global_batch()) {
    fail(source, "train_batch_size (" + tbs.dump() + ") must equal train_micro_batch_size_per_gpu (" +
                     std::to_string(c.micro_batch) + ") x gradient_accumulation_steps (" +
                     std::to_string(c.grad_accum) + ") x world size (" + std::to_string(world_size) + ") = " +
                     std::to_string(c.global_batch()));
  }
  resolved["train_batch_size"] = c.global_batch();
  c.optimizer.lr = at("optimizer.params.lr").get<double>();
  c.optimizer.beta1 = at("optimizer.params.betas")[0].get<double>();
  c.optimizer.beta2 = at("optimizer.params.betas")[1].get<double>();
  c.optimizer.eps = at("optimizer.params.eps").get<double>();
  c.optimizer.weight_decay = at("optimizer.params.weight_decay").get<double>();
  resolve_scheduler(resolved, c, source);
  drop_nulls(resolved);
  c.resolved = resolved;
  return c;
}

namespace {

json read_json_file(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open the " + std::string(what) + " file");
  json doc = json::parse(in, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (doc.is_discarded()) {
    // Parse again with exceptions for the position of the error.
    in.clear();
    in.seekg(0);
    try {
      doc = json::parse(in, nullptr, true, true);
    } catch (const json::parse_error& e) {
      throw ConfigError(path + ": not valid JSON: " + e.what());
    }
  }
  return doc;
}

std::string folder_of(const std::string& path) {
  const std::string base = fs::path(path).parent_path().string();
  return base.empty() ? "." : base;
}

// Copies every leaf of `from` (the DeepSpeed file's translation) into `into` (ferry's
// file); a key both files set to different values is an error naming both.
void merge_runtime(json& into, const json& from, const std::string& prefix, const std::string& ferry_path,
                   const std::string& ds_path) {
  for (const auto& [key, value] : from.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (value.is_object()) {
      if (!into.contains(key) || !into[key].is_object()) into[key] = json::object();
      merge_runtime(into[key], value, path, ferry_path, ds_path);
    } else if (into.contains(key) && into[key] != value) {
      fail(ds_path, "key '" + path + "' is " + value.dump() + " here but " + into[key].dump() + " in " + ferry_path +
                        "; set it in one file");
    } else {
      into[key] = value;
    }
  }
}

// "auto" values the Hugging Face integration computes rather than copies.
void compute_autos(json& doc, const DeepSpeedImport& imp, const Config& first) {
  const double h = static_cast<double>(first.model.n_embd);
  for (const std::string& key : imp.autos) {
    if (get_path(doc, key)) continue;  // ferry's file sets it: that value
    if (key == "zero_optimization.reduce_bucket_size") set_path(doc, key, h * h);
    if (key == "zero_optimization.stage3_prefetch_bucket_size") set_path(doc, key, std::floor(0.9 * h * h));
    if (key == "scheduler.params.warmup_max_lr" && first.scheduler.type != "WarmupCosineLR") {
      set_path(doc, key, first.optimizer.lr);
    }
  }
}

}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides, int world_size,
                   const std::string& deepspeed_path) {
  json doc = read_json_file(path, "configuration");
  if (deepspeed_path.empty()) return config_from_json(doc, path, folder_of(path), overrides, world_size);

  const json ds = read_json_file(deepspeed_path, "DeepSpeed configuration");
  const DeepSpeedImport imp = translate_deepspeed(ds, deepspeed_path, folder_of(deepspeed_path));
  json scratch = json::object();  // the DeepSpeed file's values checked under its own name
  merge_document(scratch, imp.runtime, "", deepspeed_path, folder_of(deepspeed_path));
  merge_runtime(doc, imp.runtime, "", path, deepspeed_path);
  // DeepSpeed's default where it differs from ferry's and changes the result: no clipping.
  if (!get_path(doc, "gradient_clipping") &&
      std::find(imp.autos.begin(), imp.autos.end(), "gradient_clipping") == imp.autos.end()) {
    doc["gradient_clipping"] = 0.0;
  }
  compute_autos(doc, imp, config_from_json(doc, path, folder_of(path), overrides, world_size));
  Config c = config_from_json(doc, path, folder_of(path), overrides, world_size);
  c.deepspeed.path = deepspeed_path;
  for (const std::string& key : imp.autos) {
    const json* v = get_path(c.resolved, key);
    c.deepspeed.autos_resolved.push_back(key + " = " + (v ? v->dump() : std::string("(unset)")));
  }
  c.deepspeed.ignored = imp.ignored;
  return c;
}

std::string describe_knobs() {
  std::ostringstream os;
  os << "| key | type | default | description |\n|---|---|---|---|\n";
  for (const Knob& k : config_knobs()) {
    std::string type = knob_type_name(k.type);
    if (!k.choices.empty()) {
      type = "one of";
      for (const auto& c : k.choices) type += " " + c;
    }
    const std::string range = range_text(k);
    if (!range.empty()) type += ", " + range;
    os << "| `" << k.path << "` | " << type << " | ";
    if (k.default_value.is_null()) {
      os << "-";
    } else {
      os << '`' << k.default_value.dump() << '`';
    }
    os << " | " << k.description << " |\n";
  }
  os << "\n| environment variable | default | description |\n|---|---|---|\n";
  for (const EnvKnob& e : environment_knobs()) {
    os << "| `" << e.name << "` | " << (e.default_value == "-" ? "-" : "`" + e.default_value + "`") << " | "
       << e.description << " |\n";
  }
  return os.str();
}

}  // namespace ferry::runtime
