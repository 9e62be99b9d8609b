// The architecture registry (nn/arch.h) and what reads it: every family's descriptor is
// whole (its layout's every tensor has Hugging Face names, no two tensors share one), the
// lists ferry prints and checks (model.arch's choices, the FSDP block classes, config.json's
// architectures) are the registry's, and the llama-family rules name the registry's
// families. Qwen3's descriptor is checked end to end by test_hf (transformers' logits, the
// export round trip) and test_gradcheck_model (its q/k norms' gradient).
#define BOOST_TEST_MODULE arch
#include <boost/test/unit_test.hpp>

#include <set>

#include "nn/arch.h"
#include "runtime/config/config.h"
#include "runtime/config/config_schema.h"
#include "runtime/config/fsdp_config.h"
#include "runtime/config/hf_config.h"
#include "runtime/hf/hf_tensors.h"
#include "error_of.h"

using namespace ferry;
using nlohmann::json;
using ferry::test::error_of;

namespace {

runtime::Config config_of(const std::string& arch, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> sets = {"model.arch=" + arch, "model.n_layer=2", "model.n_head=4", "model.n_embd=32"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return runtime::config_from_json({{"data", {{"path", "corpus.txt"}}}}, "cfg.json", "/base", sets);
}

}  // namespace

BOOST_AUTO_TEST_CASE(names_are_unique_and_found_both_ways) {
  std::set<std::string> names, hf, blocks;
  for (const nn::Arch& a : nn::architectures()) {
    BOOST_TEST(names.insert(std::string(a.name)).second, a.name);
    BOOST_TEST(hf.insert(std::string(a.hf_architecture)).second, a.hf_architecture);
    BOOST_TEST(blocks.insert(std::string(a.fsdp_block_class)).second, a.fsdp_block_class);
    BOOST_TEST(nn::find_arch(a.name) == &a);
    BOOST_TEST(nn::find_hf_arch(a.hf_architecture) == &a);
    BOOST_TEST(runtime::hf_architecture(std::string(a.name)) == a.hf_architecture);
    BOOST_TEST(runtime::fsdp_block_class(std::string(a.name)) == a.fsdp_block_class);
    if (!a.hf_export_keys.empty()) BOOST_TEST(json::parse(std::string(a.hf_export_keys)).is_object(), a.name);
  }
  BOOST_TEST(nn::arch_names() == "gpt2, llama, mistral, qwen2, qwen3");
  BOOST_TEST(nn::find_arch("qwen3")->hf_architecture == "Qwen3ForCausalLM");
  BOOST_TEST(nn::find_arch("falcon") == nullptr);
  BOOST_TEST(nn::find_hf_arch("FalconForCausalLM") == nullptr);
  const std::string err = error_of([] { nn::arch("falcon"); });
  BOOST_TEST(err == "model.arch 'falcon' is not one ferry computes (gpt2, llama, mistral, qwen2, qwen3)", err);
  BOOST_TEST(runtime::fsdp_block_class("falcon") == "falcon");  // named as it is in the refusal
}

BOOST_AUTO_TEST_CASE(model_arch_choices_are_the_registry) {
  for (const runtime::Knob& k : runtime::config_knobs()) {
    if (k.path != "model.arch") continue;
    std::vector<std::string> want;
    for (const nn::Arch& a : nn::architectures()) want.emplace_back(a.name);
    BOOST_TEST(k.choices == want, boost::test_tools::per_element());
    for (const nn::Arch& a : nn::architectures()) BOOST_TEST(k.description.find(std::string(a.summary)) != std::string::npos);
  }
  const std::string err = error_of([] { config_of("falcon"); });
  BOOST_TEST(err.find("qwen3") != std::string::npos, err);
}

// Each family at a small shape: the model the descriptor builds has the layout it lays out,
// the FLOPs are its model class's, and every tensor of the layout has Hugging Face names,
// all distinct (a family whose table lacked a row would throw here, not at a user's import).
BOOST_AUTO_TEST_CASE(every_family_is_whole) {
  for (const nn::Arch& a : nn::architectures()) {
    BOOST_TEST_CONTEXT(a.name) {
      const runtime::Config c = config_of(std::string(a.name));
      BOOST_TEST(&c.arch() == &a);
      BOOST_TEST(c.llama_family() == (a.family == nn::ArchFamily::llama));
      BOOST_TEST(c.llama.qkv_bias == (a.family == nn::ArchFamily::llama && a.qkv_bias));
      BOOST_TEST(c.llama.qk_norm == (a.family == nn::ArchFamily::llama && a.qk_norm));
      const std::vector<nn::UnitSpec> layout = runtime::model_layout(c);
      BOOST_TEST(layout.size() == 4u);  // embedding, 2 blocks, final
      const double flops = a.flops_per_token(c.model, c.llama, 16);
      BOOST_TEST(flops == (a.family == nn::ArchFamily::gpt2 ? nn::GPT::flops_per_token(c.model, 16)
                                                           : nn::Llama::flops_per_token(c.llama, 16)));
      const runtime::HfLayout hf = runtime::hf_layout(c.resolved.at("model"), layout);
      std::set<std::string> seen;
      size_t tensors = 0;
      for (const nn::UnitSpec& u : layout) tensors += u.tensors.size();
      BOOST_TEST(hf.tensors.size() == tensors);
      for (const runtime::HfTensorMap& m : hf.tensors) {
        int64_t rows = 0;
        for (const runtime::HfPiece& p : m.pieces) {
          BOOST_TEST(seen.insert(p.name).second, p.name);
          BOOST_TEST(p.row_begin == rows);
          rows += p.rows;
        }
        BOOST_TEST(rows == m.rows);
      }
      if (a.qk_norm) {
        BOOST_TEST(seen.count("model.layers.1.self_attn.q_norm.weight") == 1u);
        BOOST_TEST(seen.count("model.layers.1.self_attn.k_norm.weight") == 1u);
      }
    }
  }
}

// Qwen3's head size is a key of its own (model.head_dim); the other families refuse it.
BOOST_AUTO_TEST_CASE(head_dim_is_qwen3s) {
  const runtime::Config q = config_of("qwen3", {"model.head_dim=16", "model.n_kv_head=2"});
  BOOST_TEST(q.llama.head_dim() == 16);
  BOOST_TEST(q.llama.qkv_width() == (4 + 2 * 2) * 16);
  const std::vector<nn::UnitSpec> layout = runtime::model_layout(q);
  BOOST_TEST(layout[1].tensors.at(1).shape == (nn::Shape{8 * 16, 32}));  // wqkv
  BOOST_TEST(layout[1].tensors.at(4).shape == (nn::Shape{32, 4 * 16}));  // wo
  const runtime::HfLayout hf = runtime::hf_layout(q.resolved.at("model"), layout);
  BOOST_TEST(hf.head_dim == 16);
  BOOST_TEST(hf.tensors.at(2).pieces.at(1).name == "model.layers.0.self_attn.k_proj.weight");
  BOOST_TEST(hf.tensors.at(2).pieces.at(1).rows == 2 * 16);
  // The export writes the head size the layout has, where a manifest has no head_dim.
  json shape = q.resolved.at("model");
  shape.erase("head_dim");
  shape["head_dim"] = hf.head_dim;
  BOOST_TEST(runtime::hf_config_json(shape, "float32").at("head_dim") == 16);
  BOOST_TEST(runtime::hf_config_json(shape, "float32").at("model_type") == "qwen3");
  const std::string llama = error_of([] { config_of("llama", {"model.head_dim=16"}); });
  BOOST_TEST(llama.find("model.head_dim applies to model.arch qwen3 only") != std::string::npos, llama);
  const std::string gpt = error_of([] { config_of("gpt2", {"model.head_dim=16"}); });
  BOOST_TEST(gpt.find("model.head_dim applies to the llama family (llama, mistral, qwen2, qwen3) only") != std::string::npos, gpt);
  const std::string odd = error_of([] { config_of("qwen3", {"model.head_dim=7"}); });
  BOOST_TEST(odd.find("even head size") != std::string::npos, odd);
}
