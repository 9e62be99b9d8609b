#include "runtime/config/deepspeed_config.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <sstream>

#include "runtime/config/config.h"
#include "runtime/config/config_json.h"
#include "runtime/config/config_schema.h"

namespace ferry::runtime {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// DeepSpeed key path -> ferry key path, for keys with the same meaning: every knob of the
// table under DeepSpeed's own sections (config_schema.cpp; the types are special-cased in
// Translator::walk), plus the other spellings DeepSpeed accepts for some (its pydantic
// aliases).
bool deepspeed_section(const std::string& path) {
  static const std::vector<std::string> sections = {
      "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "gradient_clipping",
      "optimizer.params.", "scheduler.params.", "zero_optimization.", "aio.", "bf16.", "fp16."};
  for (const std::string& s : sections)
    if (s.ends_with('.') ? path.starts_with(s) : path == s) return true;
  return false;
}

const std::map<std::string, std::string>& mapped_keys() {
  static const std::map<std::string, std::string> m = [] {
    std::map<std::string, std::string> k;
    for (const Knob& knob : config_knobs())
      if (deepspeed_section(knob.path)) k[knob.path] = knob.path;
    k["zero_optimization.prefetch_bucket_size"] = "zero_optimization.stage3_prefetch_bucket_size";
    k["zero_optimization.max_live_parameters"] = "zero_optimization.stage3_max_live_parameters";
    k["zero_optimization.mics_shard_size"] = "zero_optimization.shard_group_size";  // -1 (off) = 0
    k["aio.thread_count"] = "aio.intra_op_parallelism";  // DeepSpeed >= 0.15's name
    k["bfloat16.enabled"] = "bf16.enabled";              // DeepSpeed's alias
    return k;
  }();
  return m;
}

// Keys that change how DeepSpeed lays out memory, logs or profiles, never what it computes.
const std::vector<std::string>& ignorable_keys() {
  static const std::vector<std::string> prefixes = {
      "steps_per_print", "wall_clock_breakdown", "dump_state", "memory_breakdown", "wandb", "comet", "flops_profiler", "comms_logger", "activation_checkpointing", "checkpoint",
      "timers", "autotuning", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
      "prescale_gradients", "gradient_predivide_factor", "sparse_gradients",
      "zero_optimization.contiguous_gradients", "zero_optimization.reduce_scatter",
      "zero_optimization.allgather_partitions", "zero_optimization.round_robin_gradients",
      "zero_optimization.sub_group_size", "zero_optimization.stage3_max_reuse_distance",
      "zero_optimization.max_reuse_distance", "zero_optimization.stage3_param_persistence_threshold",
      "zero_optimization.param_persistence_threshold", "zero_optimization.model_persistence_threshold",
      "zero_optimization.stage3_gather_16bit_weights_on_model_save",
      "zero_optimization.stage3_gather_fp16_weights_on_model_save",
      "zero_optimization.gather_16bit_weights_on_model_save", "zero_optimization.elastic_checkpoint",
      "zero_optimization.load_from_fp32_weights", "zero_optimization.memory_efficient_linear",
      "zero_optimization.ignore_unused_parameters", "zero_optimization.legacy_stage1",
      "zero_optimization.use_multi_rank_bucket_allreduce", "zero_optimization.offload_optimizer.fast_init",
      "zero_optimization.offload_optimizer.pipeline_read", "zero_optimization.offload_optimizer.pipeline_write",
      "zero_optimization.offload_optimizer.pipeline", "zero_optimization.offload_optimizer.ratio",
      "zero_optimization.stage3_module_granularity_threshold", "aio.use_gds", "optimizer.params.torch_adam",
      "optimizer.params.adam_w_mode", "optimizer.params.bias_correction", "optimizer.params.amsgrad",
      "data_types.grad_accum_dtype", "communication_data_type", "zero_optimization.zero_quantized_weights",
      "zero_optimization.zero_quantized_gradients", "zero_optimization.zero_quantized_nontrainable_weights",
      "seq_parallel_communication_data_type", "compile",
      // LoCo's error feedback acts only on ZeRO++'s quantized gradients, refused above;
      // hierarchical MiCS gathers and the legacy pinning switch change how, not what.
      "zero_optimization.zeropp_loco_param", "zero_optimization.mics_hierarchical_params_gather",
      "zero_optimization.cpu_offload_use_pin_memory", "zero_optimization.stage3_use_all_reduce_for_fetch_params",
      "zero_optimization.log_trace_cache_warnings", "zero_optimization.override_module_apply",
      // Checked in check_refused: tensor and sequence parallelism of one rank, fp32 gradient
      // accumulation, bf16 master weights off, autocast off, a schedule from its start.
      "tensor_parallel", "sequence_parallel_size", "data_types", "bf16.bf16_master_weights_and_grads",
      "bf16.bf16_optimizer_states", "torch_autocast", "scheduler.params.last_batch_iteration",
      // fp16 inputs are cast where the first layer reads them anyway; bf16's fused-update and
      // overflow-check switches only change when DeepSpeed does the same arithmetic.
      "fp16.auto_cast", "bf16.immediate_grad_update", "bf16.check_grad_overflow"};
  return prefixes;
}

bool ignorable(const std::string& path) {
  for (const std::string& p : ignorable_keys())
    if (path == p || path.starts_with(p + ".")) return true;
  return false;
}

using detail::lower;

class Translator {
 public:
  Translator(const std::string& source, const std::string& base_dir, const std::map<std::string, std::string>& names)
      : source_(source), base_dir_(base_dir), names_(names) {}

  DeepSpeedImport run(const json& ds) {
    if (!ds.is_object()) fail("", "a DeepSpeed configuration must be a JSON object");
    check_refused(ds);
    walk(ds, "");
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw ConfigError(source_ + ": " + (key.empty() ? "" : "key '" + name_of(key) + "': ") + why);
  }

  // The key as the user's file writes it (an accelerate YAML's inline names).
  std::string name_of(const std::string& path) const {
    const auto it = names_.find(path);
    return it == names_.end() ? path : it->second;
  }

  static const json* at(const json& doc, const std::string& path) {
    const json* node = &doc;
    std::stringstream parts(path);
    std::string part;
    while (std::getline(parts, part, '.')) {
      if (!node->is_object() || !node->contains(part)) return nullptr;
      node = &(*node)[part];
    }
    return node;
  }

  static bool truthy(const json* v) { return v && v->is_boolean() && v->get<bool>(); }

  // Keys whose effect ferry lacks and whose absence would change what is computed.
  void check_refused(const json& ds) {
    if (truthy(at(ds, "amp.enabled"))) {
      fail("amp.enabled", "apex AMP is not implemented by ferry; use \"bf16\" or \"fp16\" (DeepSpeed's own mixed precision)");
    }
    if (truthy(at(ds, "fp16.enabled")) && (truthy(at(ds, "bf16.enabled")) || truthy(at(ds, "bfloat16.enabled")))) {
      fail("bf16.enabled", "bf16.enabled and fp16.enabled are both true; choose one");
    }
    if (truthy(at(ds, "fp16.fp16_master_weights_and_grads"))) {
      fail("fp16.fp16_master_weights_and_grads", "ferry keeps master weights and gradients in fp32 under fp16");
    }
    for (const char* section : {"curriculum_learning", "data_efficiency", "progressive_layer_drop", "eigenvalue",
                                "quantize_training", "elasticity"}) {
      if (truthy(at(ds, std::string(section) + ".enabled"))) {
        fail(std::string(section) + ".enabled", "is not implemented by ferry and changes the training run");
      }
    }
    for (const char* present : {"pipeline", "sparse_attention", "compression_training", "moe", "hybrid_engine"}) {
      if (const json* v = at(ds, present); v && !(v->is_object() && v->contains("enabled") && !truthy(&(*v)["enabled"]))) {
        fail(present, "is not implemented by ferry and changes the training run");
      }
    }
    if (truthy(at(ds, "sparse_gradients"))) fail("sparse_gradients", "ferry reduces dense gradients only");
    for (const char* dtype_key : {"communication_data_type", "data_types.grad_accum_dtype"}) {
      if (const json* v = at(ds, dtype_key); v && !v->is_null() && (!v->is_string() || lower(v->get<std::string>()) != "fp32")) {
        fail(dtype_key, "ferry reduces and accumulates gradients in fp32 only, got " + v->dump());
      }
    }
    for (const char* q : {"zero_optimization.zero_quantized_weights", "zero_optimization.zero_quantized_gradients",
                          "zero_optimization.zero_quantized_nontrainable_weights"}) {
      if (truthy(at(ds, q))) fail(q, "quantized communication (ZeRO++) is not implemented by ferry");
    }
    if (const json* t = at(ds, "optimizer.type")) {
      const std::string type = t->is_string() ? lower(t->get<std::string>()) : "";
      if (type != "adam" && type != "adamw") {
        fail("optimizer.type", "ferry implements Adam and AdamW (decoupled weight decay), got " + t->dump());
      }
      const json* mode = at(ds, "optimizer.params.adam_w_mode");
      if (type == "adam" && mode && mode->is_boolean() && !mode->get<bool>()) {
        fail("optimizer.params.adam_w_mode", "false asks for L2-regularised Adam; ferry implements AdamW only");
      }
      if (const json* bc = at(ds, "optimizer.params.bias_correction"); bc && bc->is_boolean() && !bc->get<bool>()) {
        fail("optimizer.params.bias_correction", "ferry's Adam always corrects the bias");
      }
      if (truthy(at(ds, "optimizer.params.amsgrad"))) fail("optimizer.params.amsgrad", "AMSGrad is not implemented");
    }
    if (const json* t = at(ds, "scheduler.type")) {
      static const std::vector<std::string> ok = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
      if (!t->is_string() || std::find(ok.begin(), ok.end(), t->get<std::string>()) == ok.end()) {
        fail("scheduler.type", "ferry implements WarmupLR, WarmupDecayLR and WarmupCosineLR, got " + t->dump());
      }
    }
    if (const json* gc = at(ds, "gradient_predivide_factor"); gc && gc->is_number() && gc->get<double>() <= 0) {
      fail("gradient_predivide_factor", "must be positive");
    }
    check_parallelism(ds);
    for (const char* bf : {"bf16.bf16_master_weights_and_grads", "bf16.bf16_optimizer_states"}) {
      if (truthy(at(ds, bf))) fail(bf, "ferry keeps master weights, gradients and Adam state in fp32 under bf16");
    }
    if (const json* a = at(ds, "torch_autocast"); a && !a->is_null() && !(a->is_object() && !truthy(at(*a, "enabled")))) {
      fail("torch_autocast", "torch.autocast's per-op precision is not implemented by ferry (bf16.enabled computes every "
                             "layer in bf16); leave it disabled");
    }
    if (const json* z = at(ds, "zero_optimization.zenflow"); z && !z->is_null()) {
      fail("zero_optimization.zenflow", "ZenFlow's deferred updates of less important gradients are not implemented "
                                        "by ferry and change the training run");
    }
    if (const json* it = at(ds, "scheduler.params.last_batch_iteration");
        it && !(it->is_number_integer() && it->get<int64_t>() == -1)) {
      fail("scheduler.params.last_batch_iteration", "ferry's schedule starts at step 0 (-1, DeepSpeed's default); to "
                                                    "continue a run resume its checkpoint, got " + it->dump());
    }
  }

  // A DeepSpeed size of 0 or 1 (or absent) is one rank; more would split each layer (tensor
  // parallelism) or each sequence (Ulysses) over ranks, which ferry does not do: it would run
  // those ranks as data parallelism instead, with a larger global batch.
  void check_parallelism(const json& ds) {
    for (const char* key : {"tensor_parallel.autotp_size", "tensor_parallel.tp_size", "tensor_parallel.tp.tp_size",
                            "sequence_parallel_size"}) {
      const json* v = at(ds, key);
      if (!v || v->is_null()) continue;
      if (!v->is_number_integer() || v->get<int64_t>() < 0) fail(key, "must be a whole number >= 0, got " + v->dump());
      if (v->get<int64_t>() > 1) {
        const bool tp = std::string(key).starts_with("tensor_parallel");
        fail(key, std::string(tp ? "tensor parallelism (AutoTP)" : "sequence parallelism (Ulysses)") + " over " +
                      v->dump() + " ranks is not implemented by ferry: its ranks would train as data parallelism, " +
                      "each with its own batch, so the global batch and the run would change; shard with " +
                      "zero_optimization.stage 3 instead (size 1 or absent)");
      }
    }
    if (const json* tp = at(ds, "tensor_parallel"); tp && !tp->is_null() && !tp->is_object()) {
      fail("tensor_parallel", "must be an object like {\"autotp_size\": 1}, got " + tp->dump());
    }
  }

  void walk(const json& node, const std::string& prefix) {
    for (const auto& [key, value] : node.items()) {
      const std::string path = prefix.empty() ? key : prefix + "." + key;
      if (path == "optimizer.type" || path == "scheduler.type") {
        // Adam and AdamW are both decoupled-decay AdamW here (DeepSpeed's adam_w_mode default).
        set(path, path == "optimizer.type" ? json("AdamW") : value);
        continue;
      }
      if (path == "amp" || path == "fp16.fp16_master_weights_and_grads") continue;  // false (check_refused)
      if (path == "tensorboard" || path == "csv_monitor") {
        monitor(value, path, path == "tensorboard" ? "log.tensorboard" : "log.csv");
        continue;
      }
      if (path == "zero_optimization.cpu_offload" || path == "zero_optimization.cpu_offload_param") {
        // DeepSpeed's legacy spellings of offload_optimizer / offload_param on cpu.
        if (!value.is_boolean()) fail(path, "must be true or false, got " + value.dump());
        const std::string target = path == "zero_optimization.cpu_offload" ? "zero_optimization.offload_optimizer.device"
                                                                           : "zero_optimization.offload_param.device";
        if (value.get<bool>()) {
          set(target, "cpu");
          out_.written[target] = name_of(path);
        }
        continue;
      }
      if (const auto it = mapped_keys().find(path); it != mapped_keys().end()) {
        if (value.is_string() && value == "auto") {
          out_.autos.push_back(it->second);
        } else {
          set(it->second, value);
        }
        out_.written[it->second] = name_of(path);
        continue;
      }
      if (ignorable(path)) {
        if (!(value.is_object() && !value.empty())) out_.ignored.push_back(name_of(path));
        else walk_ignored(value, path);
        continue;
      }
      if (value.is_object() && is_known_section(path)) {
        walk(value, path);
        continue;
      }
      if (is_ferry_section(path)) {
        fail(path, "is a ferry section; put it in the --config file (the --deepspeed file holds the runtime keys)");
      }
      if (const std::string near = near_miss(path); !near.empty()) {
        // One or two letters from a key DeepSpeed reads: a typo whose setting would be lost
        // without a word (DeepSpeed itself ignores unknown top-level keys).
        fail(path, "is not a DeepSpeed key; did you mean '" + near + "'?");
      }
      out_.ignored.push_back(name_of(path) + " (unknown to ferry)");
    }
  }

  // DeepSpeed's monitors write under output_path/job_name (job_name "DeepSpeedJobName" when
  // not given); a relative output_path is taken from the DeepSpeed file's folder, like
  // nvme_path. Disabled: nothing to say.
  void monitor(const json& section, const std::string& path, const std::string& ferry_path) {
    if (!section.is_object()) fail(path, "must be an object like {\"enabled\": true, \"output_path\": ..., \"job_name\": ...}");
    const auto text = [&](const char* key, const std::string& dflt) {
      if (!section.contains(key)) return dflt;
      const json& v = section[key];
      if (!v.is_string()) fail(path + "." + key, "must be a string, got " + v.dump());
      return v.get<std::string>();
    };
    for (const auto& [key, value] : section.items()) {
      if (key == "enabled") {
        if (!value.is_boolean()) fail(path + ".enabled", "must be true or false, got " + value.dump());
      } else if (key != "output_path" && key != "job_name") {
        out_.ignored.push_back(name_of(path + "." + key));
      }
    }
    if (!truthy(at(section, "enabled"))) return;
    fs::path dir = text("output_path", "");
    if (dir.is_relative() && !base_dir_.empty()) dir = fs::path(base_dir_) / dir;
    dir /= text("job_name", "DeepSpeedJobName");
    set(ferry_path, dir.lexically_normal().string());
  }

  void walk_ignored(const json& node, const std::string& prefix) {
    for (const auto& [key, value] : node.items()) {
      const std::string path = prefix + "." + key;
      if (value.is_object() && !value.empty()) {
        walk_ignored(value, path);
      } else {
        out_.ignored.push_back(name_of(path));
      }
    }
  }

  // A key DeepSpeed reads within two edits of `path` ("" if none): the mapped and the
  // ignorable ones.
  static std::string near_miss(const std::string& path) {
    if (path.size() < 6) return "";
    std::vector<std::string> known;
    for (const auto& [ds, ferry] : mapped_keys()) known.push_back(ds);
    for (const char* k : {"optimizer.type", "scheduler.type", "zero_optimization.cpu_offload",
                          "zero_optimization.cpu_offload_param", "amp", "tensorboard", "csv_monitor"})
      known.push_back(k);
    for (const std::string& k : ignorable_keys()) known.push_back(k);
    for (const std::string& k : known)
      if (edit_distance(path, k) <= 2) return k;
    return "";
  }

  static bool is_known_section(const std::string& path) {
    for (const auto& [ds, ferry] : mapped_keys())
      if (ds.starts_with(path + ".")) return true;
    return path == "optimizer" || path == "scheduler";
  }

  static bool is_ferry_section(const std::string& path) {
    static const std::vector<std::string> own = {"model", "data", "device", "train", "log", "schedule", "comm"};
    return std::find(own.begin(), own.end(), path) != own.end();
  }

  void set(const std::string& ferry_path, json value) {
    if ((ferry_path.ends_with(".nvme_path")) && value.is_string()) {
      // Relative to the DeepSpeed file's folder, like ferry's own file paths.
      std::string joined, item;
      std::stringstream list(value.get<std::string>());
      while (std::getline(list, item, ',')) {
        fs::path p(item);
        if (p.is_relative() && !base_dir_.empty()) p = fs::path(base_dir_) / p;
        joined += (joined.empty() ? "" : ",") + p.lexically_normal().string();
      }
      value = joined;
    }
    json* node = &out_.runtime;
    std::stringstream parts(ferry_path);
    std::string part, next;
    std::getline(parts, part, '.');
    while (std::getline(parts, next, '.')) {
      node = &(*node)[part];
      part = next;
    }
    (*node)[part] = std::move(value);
  }

  std::string source_, base_dir_;
  const std::map<std::string, std::string>& names_;
  DeepSpeedImport out_;
};

}  // namespace

DeepSpeedImport translate_deepspeed(const json& ds, const std::string& source, const std::string& base_dir,
                                    const std::map<std::string, std::string>& names) {
  return Translator(source, base_dir, names).run(ds);
}

}  // namespace ferry::runtime
