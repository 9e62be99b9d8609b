#include "nn/arch.h"

#include <stdexcept>

namespace ferry::nn {

namespace {

// GPT-2: ferry's names are Hugging Face's without "transformer."; Conv1D weights transposed.
const std::vector<HfTensorName> kGpt2Tensors = {
    {"wte", HfSplit::whole, {"transformer.wte.weight"}},
    {"wpe", HfSplit::whole, {"transformer.wpe.weight"}},
    {"h.{l}.ln_1.weight", HfSplit::whole, {"transformer.h.{l}.ln_1.weight"}},
    {"h.{l}.ln_1.bias", HfSplit::whole, {"transformer.h.{l}.ln_1.bias"}},
    {"h.{l}.attn.c_attn.weight", HfSplit::transposed, {"transformer.h.{l}.attn.c_attn.weight"}},
    {"h.{l}.attn.c_attn.bias", HfSplit::whole, {"transformer.h.{l}.attn.c_attn.bias"}},
    {"h.{l}.attn.c_proj.weight", HfSplit::transposed, {"transformer.h.{l}.attn.c_proj.weight"}},
    {"h.{l}.attn.c_proj.bias", HfSplit::whole, {"transformer.h.{l}.attn.c_proj.bias"}},
    {"h.{l}.ln_2.weight", HfSplit::whole, {"transformer.h.{l}.ln_2.weight"}},
    {"h.{l}.ln_2.bias", HfSplit::whole, {"transformer.h.{l}.ln_2.bias"}},
    {"h.{l}.mlp.c_fc.weight", HfSplit::transposed, {"transformer.h.{l}.mlp.c_fc.weight"}},
    {"h.{l}.mlp.c_fc.bias", HfSplit::whole, {"transformer.h.{l}.mlp.c_fc.bias"}},
    {"h.{l}.mlp.c_proj.weight", HfSplit::transposed, {"transformer.h.{l}.mlp.c_proj.weight"}},
    {"h.{l}.mlp.c_proj.bias", HfSplit::whole, {"transformer.h.{l}.mlp.c_proj.bias"}},
    {"ln_f.weight", HfSplit::whole, {"transformer.ln_f.weight"}},
    {"ln_f.bias", HfSplit::whole, {"transformer.ln_f.bias"}},
};

// The llama family (Llama, Mistral, Qwen2, Qwen3): rows a layout lacks are never asked for.
// Hugging Face's and ferry's RoPE both rotate halves: q and k need no permutation.
const std::vector<HfTensorName> kLlamaTensors = {
    {"tok_embeddings.weight", HfSplit::whole, {"model.embed_tokens.weight"}},
    {"norm.weight", HfSplit::whole, {"model.norm.weight"}},
    {"output.weight", HfSplit::whole, {"lm_head.weight"}},
    {"layers.{l}.attention_norm.weight", HfSplit::whole, {"model.layers.{l}.input_layernorm.weight"}},
    {"layers.{l}.attention.wqkv.weight",
     HfSplit::qkv,
     {"model.layers.{l}.self_attn.q_proj.weight", "model.layers.{l}.self_attn.k_proj.weight",
      "model.layers.{l}.self_attn.v_proj.weight"}},
    {"layers.{l}.attention.bqkv.bias",
     HfSplit::qkv,
     {"model.layers.{l}.self_attn.q_proj.bias", "model.layers.{l}.self_attn.k_proj.bias",
      "model.layers.{l}.self_attn.v_proj.bias"}},
    {"layers.{l}.attention.q_norm.weight", HfSplit::whole, {"model.layers.{l}.self_attn.q_norm.weight"}},
    {"layers.{l}.attention.k_norm.weight", HfSplit::whole, {"model.layers.{l}.self_attn.k_norm.weight"}},
    {"layers.{l}.attention.wo.weight", HfSplit::whole, {"model.layers.{l}.self_attn.o_proj.weight"}},
    {"layers.{l}.ffn_norm.weight", HfSplit::whole, {"model.layers.{l}.post_attention_layernorm.weight"}},
    {"layers.{l}.feed_forward.w_gate_up.weight",
     HfSplit::gate_up,
     {"model.layers.{l}.mlp.gate_proj.weight", "model.layers.{l}.mlp.up_proj.weight"}},
    {"layers.{l}.feed_forward.w_down.weight", HfSplit::whole, {"model.layers.{l}.mlp.down_proj.weight"}},
};

Arch gpt2() {
  Arch a;
  a.name = "gpt2";
  a.family = ArchFamily::gpt2;
  a.summary = "gpt2: LayerNorm, learned positions, GELU MLP, biases, tied head";
  a.hf_architecture = "GPT2LMHeadModel";
  a.fsdp_block_class = "GPT2Block";
  a.hf_tensors = &kGpt2Tensors;
  a.hf_ignored_suffixes = {".attn.bias", ".attn.masked_bias"};
  a.hf_optional_prefix = "transformer.";
  a.always_tied = true;
  return a;
}

Arch llama_like(std::string_view name, std::string_view summary, std::string_view hf, std::string_view block) {
  Arch a;
  a.name = name;
  a.family = ArchFamily::llama;
  a.summary = summary;
  a.hf_architecture = hf;
  a.fsdp_block_class = block;
  a.hf_tensors = &kLlamaTensors;
  a.hf_ignored_suffixes = {".rotary_emb.inv_freq"};
  return a;
}

std::vector<Arch> build() {
  std::vector<Arch> all;
  all.push_back(gpt2());
  Arch llama = llama_like("llama",
                          "llama: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU MLP, no biases, "
                          "untied head unless tied",
                          "LlamaForCausalLM", "LlamaDecoderLayer");
  llama.hf_export_keys = R"({"attention_bias": false, "mlp_bias": false})";
  all.push_back(llama);
  Arch mistral = llama_like("mistral", "mistral: llama's computation (Hugging Face's MistralForCausalLM)",
                            "MistralForCausalLM", "MistralDecoderLayer");
  mistral.sliding_window = SlidingWindow::always;
  mistral.hf_export_keys = R"({"sliding_window": null})";
  all.push_back(mistral);
  Arch qwen2 = llama_like("qwen2", "qwen2: llama with q/k/v biases", "Qwen2ForCausalLM", "Qwen2DecoderLayer");
  qwen2.qkv_bias = true;
  qwen2.sliding_window = SlidingWindow::when_used;
  qwen2.hf_export_keys = R"({"use_sliding_window": false, "sliding_window": null})";
  all.push_back(qwen2);
  Arch qwen3 = llama_like("qwen3",
                          "qwen3: llama with an RMSNorm on each query and key head before the rotation and a "
                          "head size of its own (model.head_dim)",
                          "Qwen3ForCausalLM", "Qwen3DecoderLayer");
  qwen3.qk_norm = true;
  qwen3.free_head_dim = true;
  qwen3.sliding_window = SlidingWindow::when_used;
  qwen3.hf_export_keys = R"({"attention_bias": false, "use_sliding_window": false, "sliding_window": null})";
  all.push_back(qwen3);
  return all;
}

std::string join(std::string_view Arch::*field) {
  std::string out;
  for (const Arch& a : architectures()) out += (out.empty() ? "" : ", ") + std::string(a.*field);
  return out;
}

}  // namespace

void Arch::apply(LlamaConfig& l) const {
  l.qkv_bias = qkv_bias;
  l.qk_norm = qk_norm;
}

std::unique_ptr<Model> Arch::make(const GPTConfig& g, const LlamaConfig& l, Device& device, DType dtype) const {
  if (family == ArchFamily::gpt2) return std::make_unique<GPT>(g, device, dtype);
  return std::make_unique<Llama>(l, device, dtype);
}

std::vector<UnitSpec> Arch::layout(const GPTConfig& g, const LlamaConfig& l) const {
  return family == ArchFamily::gpt2 ? GPT::layout(g) : Llama::layout(l);
}

double Arch::flops_per_token(const GPTConfig& g, const LlamaConfig& l, int64_t T) const {
  return family == ArchFamily::gpt2 ? GPT::flops_per_token(g, T) : Llama::flops_per_token(l, T);
}

const std::vector<Arch>& architectures() {
  static const std::vector<Arch> all = build();
  return all;
}

const Arch* find_arch(std::string_view name) {
  for (const Arch& a : architectures())
    if (a.name == name) return &a;
  return nullptr;
}

const Arch& arch(std::string_view name) {
  if (const Arch* a = find_arch(name)) return *a;
  throw std::invalid_argument("model.arch '" + std::string(name) + "' is not one ferry computes (" + arch_names() + ")");
}

const Arch* find_hf_arch(std::string_view hf_architecture) {
  for (const Arch& a : architectures())
    if (a.hf_architecture == hf_architecture) return &a;
  return nullptr;
}

std::string arch_names() { return join(&Arch::name); }
std::string hf_architecture_names() { return join(&Arch::hf_architecture); }

}  // namespace ferry::nn
