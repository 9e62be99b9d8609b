#include "runtime/config/hf_config.h"

#include <cmath>
#include <fstream>

#include "base/nesting_limit.h"
#include "runtime/config/config.h"

namespace ferry::runtime {

using nlohmann::json;

namespace {

[[noreturn]] void refuse(const std::string& path, const std::string& what) { throw ConfigError(path + ": " + what); }

// A key's value, or nullptr when absent or null.
const json* opt(const json& hf, const char* key) {
  const auto it = hf.find(key);
  return it == hf.end() || it->is_null() ? nullptr : &*it;
}

int64_t positive(const json& hf, const char* key, const std::string& path) {
  const json* v = opt(hf, key);
  if (!v || !v->is_number_integer() || v->get<int64_t>() < 1) {
    refuse(path, std::string("key '") + key + "' must be a positive integer" + (v ? ", got " + v->dump() : " (absent)"));
  }
  return v->get<int64_t>();
}

double number(const json& hf, const char* key, double fallback, const std::string& path) {
  const json* v = opt(hf, key);
  if (!v) return fallback;
  if (!v->is_number() || !std::isfinite(v->get<double>())) refuse(path, std::string("key '") + key + "' must be a number, got " + v->dump());
  return v->get<double>();
}

bool flag(const json& hf, const char* key, bool fallback, const std::string& path) {
  const json* v = opt(hf, key);
  if (!v) return fallback;
  if (!v->is_boolean()) refuse(path, std::string("key '") + key + "' must be true or false, got " + v->dump());
  return v->get<bool>();
}

// A key that must be absent, null or one of `allowed` (what ferry computes).
void only(const json& hf, const char* key, const std::vector<json>& allowed, const std::string& path,
          const std::string& why) {
  const json* v = opt(hf, key);
  if (!v) return;
  for (const json& a : allowed)
    if (*v == a) return;
  refuse(path, std::string("key '") + key + "' is " + v->dump() + ", which ferry does not compute (" + why + ")");
}

void gpt2_keys(const json& hf, const std::string& path, HfModelConfig& out) {
  json& k = out.keys;
  k["arch"] = "gpt2";
  k["n_layer"] = positive(hf, "n_layer", path);
  k["n_head"] = positive(hf, "n_head", path);
  k["n_embd"] = positive(hf, "n_embd", path);
  k["vocab_size"] = positive(hf, "vocab_size", path);
  out.max_positions = opt(hf, "n_positions") ? positive(hf, "n_positions", path) : positive(hf, "n_ctx", path);
  k["n_positions"] = out.max_positions;
  const int64_t C = k["n_embd"].get<int64_t>();
  // 4 x n_embd where it fits (an n_embd past 2^60 is refused by model.n_embd's checks).
  only(hf, "n_inner", {json(C < (int64_t{1} << 60) ? 4 * C : 0)}, path, "the MLP is 4 x n_embd wide");
  only(hf, "activation_function", {"gelu_new", "gelu_pytorch_tanh"}, path, "GELU is the tanh approximation");
  if (std::abs(number(hf, "layer_norm_epsilon", 1e-5, path) - 1e-5) > 1e-12)
    refuse(path, "key 'layer_norm_epsilon' must be 1e-5, ferry's LayerNorm epsilon, got " + hf["layer_norm_epsilon"].dump());
  only(hf, "scale_attn_weights", {true}, path, "attention is scaled by 1/sqrt(head size)");
  only(hf, "scale_attn_by_inverse_layer_idx", {false}, path, "no per-layer attention scaling");
  only(hf, "add_cross_attention", {false}, path, "a decoder without cross-attention");
  only(hf, "tie_word_embeddings", {true}, path, "GPT-2's head is its token embedding");
}

void llama_keys(const json& hf, const std::string& path, const nn::Arch& arch, HfModelConfig& out) {
  json& k = out.keys;
  k["arch"] = std::string(arch.name);
  k["n_layer"] = positive(hf, "num_hidden_layers", path);
  k["n_head"] = positive(hf, "num_attention_heads", path);
  k["n_embd"] = positive(hf, "hidden_size", path);
  k["vocab_size"] = positive(hf, "vocab_size", path);
  k["n_kv_head"] = opt(hf, "num_key_value_heads") ? positive(hf, "num_key_value_heads", path) : k["n_head"].get<int64_t>();
  k["intermediate_size"] = positive(hf, "intermediate_size", path);
  k["norm_eps"] = number(hf, "rms_norm_eps", 1e-6, path);
  out.max_positions = positive(hf, "max_position_embeddings", path);
  k["max_position_embeddings"] = out.max_positions;
  const int64_t C = k["n_embd"].get<int64_t>(), NH = k["n_head"].get<int64_t>();
  if (C % NH != 0) refuse(path, "hidden_size " + std::to_string(C) + " is not a multiple of num_attention_heads " + std::to_string(NH));
  if (arch.free_head_dim && opt(hf, "head_dim")) {
    k["head_dim"] = positive(hf, "head_dim", path);
    if (k["head_dim"].get<int64_t>() == C / NH) k.erase("head_dim");  // the default: resolved as before
  } else {
    only(hf, "head_dim", {json(C / NH)}, path, "the head size is hidden_size / num_attention_heads = " + std::to_string(C / NH));
  }
  only(hf, "hidden_act", {"silu"}, path, "the MLP is SwiGLU");
  only(hf, "mlp_bias", {false}, path, "the MLP has no biases");
  only(hf, "attention_bias", {false}, path, "Llama's attention has no biases (Qwen2's q/k/v biases are Qwen2ForCausalLM)");
  k["tie_word_embeddings"] = flag(hf, "tie_word_embeddings", false, path);
  // RoPE: transformers 5 nests theta and the scaling under rope_parameters.
  const json* params = opt(hf, "rope_parameters");
  if (params && !params->is_object()) refuse(path, "key 'rope_parameters' must be an object");
  const json& rope_src = params ? *params : hf;
  k["rope_theta"] = number(rope_src, "rope_theta", 10000.0, path);
  const json* scaling = params ? params : opt(hf, "rope_scaling");
  if (scaling) {
    if (!scaling->is_object()) refuse(path, "key 'rope_scaling' must be an object or null");
    std::string type;
    if (const json* t = opt(*scaling, "rope_type")) type = t->is_string() ? t->get<std::string>() : t->dump();
    else if (const json* t2 = opt(*scaling, "type")) type = t2->is_string() ? t2->get<std::string>() : t2->dump();
    if (type == "llama3") {
      const std::string key = params ? "rope_parameters" : "rope_scaling";
      const double factor = number(*scaling, "factor", 0.0, path);
      if (!(factor > 0)) refuse(path, "key '" + key + ".factor' must be a positive number");
      const double original = number(*scaling, "original_max_position_embeddings", 8192.0, path);
      if (!(original >= 1 && original < 0x1p62)) {  // converting one outside int64_t was undefined
        refuse(path, std::string("key '") + key + ".original_max_position_embeddings' must be a positive integer");
      }
      k["rope_scaling"] = {{"factor", factor},
                           {"low_freq_factor", number(*scaling, "low_freq_factor", 1.0, path)},
                           {"high_freq_factor", number(*scaling, "high_freq_factor", 4.0, path)},
                           {"original_max_position_embeddings", static_cast<int64_t>(original)}};
    } else if (!type.empty() && type != "default") {
      refuse(path, std::string("key '") + (params ? "rope_parameters" : "rope_scaling") + "' has rope type '" + type +
                       "'; ferry computes 'default' and 'llama3'");
    }
  }
  if (arch.sliding_window != nn::SlidingWindow::none) {
    const bool use = arch.sliding_window == nn::SlidingWindow::always || flag(hf, "use_sliding_window", false, path);
    if (use && opt(hf, "sliding_window")) {
      const json& w = hf["sliding_window"];
      if (!w.is_number_integer() || w.get<int64_t>() < 1) refuse(path, "key 'sliding_window' must be a positive integer or null");
      out.sliding_window = w.get<int64_t>();
    }
  }
}

}  // namespace

std::string hf_architecture(const std::string& arch) {
  if (const nn::Arch* a = nn::find_arch(arch)) return std::string(a->hf_architecture);
  throw ConfigError("model.arch '" + arch + "' has no Hugging Face architecture");
}

HfModelConfig hf_model_config(const json& hf, const std::string& path) {
  if (!hf.is_object()) refuse(path, "not a JSON object");
  HfModelConfig out;
  const json* archs = opt(hf, "architectures");
  if (!archs || !archs->is_array() || archs->size() != 1 || !(*archs)[0].is_string()) {
    refuse(path, "key 'architectures' must list one class, got " + (archs ? archs->dump() : std::string("nothing")));
  }
  out.architecture = (*archs)[0].get<std::string>();
  // A folder saved already quantized holds packed integers, not the weights' values: ferry
  // reads bitsandbytes' 4-bit NF4 (transformers' BitsAndBytesConfig, load_in_4bit) only.
  if (const json* q = opt(hf, "quantization_config"); q && !q->is_null()) {
    const json* method = q->is_object() ? opt(*q, "quant_method") : nullptr;
    auto key_is = [&](const char* key, const json& want) {
      const json* v = opt(*q, key);
      return v && *v == want;
    };
    const bool nf4 = method && *method == "bitsandbytes" && key_is("load_in_4bit", true) &&
                     key_is("bnb_4bit_quant_type", "nf4") &&
                     (!opt(*q, "bnb_4bit_quant_storage") || key_is("bnb_4bit_quant_storage", "uint8"));
    if (!nf4) {
      refuse(path, "key 'quantization_config' (quant_method " + (method ? method->dump() : std::string("absent")) +
                       "): ferry reads folders bitsandbytes saved in 4-bit NF4 with uint8 storage only (load_in_4bit, "
                       "bnb_4bit_quant_type nf4); give the unquantized base folder, and lora.base_dtype \"nf4\" "
                       "quantizes it at start as bitsandbytes does");
    }
    out.nf4 = true;
    const json* dq = opt(*q, "bnb_4bit_use_double_quant");
    out.nf4_double_quant = dq && dq->is_boolean() && dq->get<bool>();
  }
  if (const json* d = opt(hf, "torch_dtype"); d && d->is_string()) out.dtype = d->get<std::string>();
  if (const json* d = opt(hf, "dtype"); d && d->is_string()) out.dtype = d->get<std::string>();
  const nn::Arch* arch = nn::find_hf_arch(out.architecture);
  if (!arch) {
    refuse(path, "architecture '" + out.architecture + "' is not supported (ferry loads " +
                     nn::hf_architecture_names() + ")");
  }
  if (arch->family == nn::ArchFamily::gpt2) {
    if (out.nf4) {
      refuse(path, "key 'quantization_config': a GPT-2 folder saved in NF4 is not read (its Conv1D weights are stored "
                   "transposed); give the unquantized folder, and lora.base_dtype \"nf4\" quantizes it at start");
    }
    gpt2_keys(hf, path, out);
  } else {
    llama_keys(hf, path, *arch, out);
  }
  return out;
}

HfModelConfig read_hf_model_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open (model.init_from must be a Hugging Face model folder)");
  const json hf = base::parse_json<ConfigError>(in, path, /*allow_exceptions=*/false);
  if (hf.is_discarded()) throw ConfigError(path + ": not valid JSON");
  return hf_model_config(hf, path);
}

json hf_config_json(const json& model, const std::string& dtype) {
  const std::string arch = model.at("arch").get<std::string>();
  const int64_t block = model.at("block_size").get<int64_t>();
  json c = {{"architectures", {hf_architecture(arch)}}, {"torch_dtype", dtype}};
  const nn::Arch& a = nn::arch(arch);
  if (a.family == nn::ArchFamily::gpt2) {
    const int64_t positions = model.value("n_positions", block);
    c.update({{"model_type", "gpt2"},
              {"n_layer", model.at("n_layer")},
              {"n_head", model.at("n_head")},
              {"n_embd", model.at("n_embd")},
              {"vocab_size", model.at("vocab_size")},
              {"n_positions", positions},
              {"n_ctx", positions},
              {"n_inner", nullptr},
              {"activation_function", "gelu_new"},
              {"layer_norm_epsilon", 1e-5},
              // ferry trains without dropout; the folder says so.
              {"resid_pdrop", 0.0},
              {"embd_pdrop", 0.0},
              {"attn_pdrop", 0.0},
              {"tie_word_embeddings", true}});
    return c;
  }
  const int64_t C = model.at("n_embd").get<int64_t>(), NH = model.at("n_head").get<int64_t>();
  c.update({{"model_type", arch},
            {"hidden_size", C},
            {"num_hidden_layers", model.at("n_layer")},
            {"num_attention_heads", NH},
            {"num_key_value_heads", model.at("n_kv_head")},
            {"head_dim", model.value("head_dim", C / NH)},
            {"intermediate_size", model.at("intermediate_size")},
            {"vocab_size", model.at("vocab_size")},
            {"max_position_embeddings", model.value("max_position_embeddings", block)},
            {"rms_norm_eps", model.at("norm_eps")},
            {"rope_theta", model.at("rope_theta")},
            {"hidden_act", "silu"},
            {"attention_dropout", 0.0},
            {"tie_word_embeddings", model.value("tie_word_embeddings", false)}});
  if (!a.hf_export_keys.empty()) c.update(json::parse(std::string(a.hf_export_keys)));
  if (model.contains("rope_scaling") && model["rope_scaling"].is_object()) {
    json s = model["rope_scaling"];
    s["rope_type"] = "llama3";
    c["rope_scaling"] = s;
  } else {
    c["rope_scaling"] = nullptr;
  }
  return c;
}

}  // namespace ferry::runtime
