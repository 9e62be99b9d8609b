// A PyTorch FSDP configuration given beside ferry's (ferry train --fsdp,
// runtime/config/fsdp_config.h): the input is the FSDP argument, read in every way ferry
// reads one. ferry's own file is examples/configs/llama-tiny.json (a Llama: the examples'
// LlamaDecoderLayer matches its block class), at 2 ranks (accelerate's num_processes: 2).
//   1. yaml_to_json (accelerate's YAML, PyYAML's scalar types), then translate_fsdp;
//   2. where the input parses as JSON (comments allowed, nesting bounded, as read_fsdp does):
//      translate_fsdp;
//   3. where it is the Trainer's string form (is_fsdp_trainer_string): read_fsdp and
//      load_config with it as the argument, not a file (hybrid: also with the --set below);
//   4. the input as a file, fsdp.yaml (read_fsdp picks JSON by a leading '{' or '['), through
//      load_config(ferry.json, {}, 2, "", fsdp.yaml), the layering end to end; where the file
//      asks for hybrid sharding, again with --set zero_optimization.shard_group_size=2.
// Errors name what was at fault: the source given to 1 and 2, the string of 3, the folder
// of both files for 4 (ferry's file where the two disagree).
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/nesting_limit.h"
#include "runtime/config/config.h"
#include "runtime/config/fsdp_config.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using ferry::runtime::FsdpImport;

const std::string& ferry_config() {
  static const std::string text = [] {
    const std::string path = std::string(FERRY_SOURCE_DIR) + "/examples/configs/llama-tiny.json";
    std::ifstream in(path, std::ios::binary);
    if (!in) ferry::fuzz::fail("cannot read " + path);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }();
  return text;
}

constexpr int kWorld = 2;
// Hybrid sharding's ranks per node as --set gives them.
const std::vector<std::string> kGroup = {"zero_optimization.shard_group_size=2"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string dir = ferry::fuzz::scratch().fresh();
  bool hybrid = false;

  // 1. YAML, then its keys.
  const std::string yaml_source = "accelerate.yaml";
  ferry::fuzz::expect_result_or_named_error(yaml_source, [&] {
    const nlohmann::json doc = ferry::runtime::yaml_to_json(text, yaml_source);
    hybrid = ferry::runtime::translate_fsdp(doc, yaml_source).hybrid || hybrid;
  });

  // 2. JSON (the Trainer's fsdp_config), where it parses, behind the nesting bound every
  // reader of a JSON file has (a deeper document is refused naming the source).
  const std::string json_source = "fsdp_config.json";
  nlohmann::json doc = nlohmann::json::value_t::discarded;
  ferry::fuzz::expect_result_or_named_error(json_source, [&] {
    doc = ferry::base::parse_json<ferry::runtime::ConfigError>(text, json_source, /*allow_exceptions=*/false,
                                                               /*ignore_comments=*/true);
  });
  if (!doc.is_discarded()) {
    ferry::fuzz::expect_result_or_named_error(json_source, [&] {
      hybrid = ferry::runtime::translate_fsdp(doc, json_source).hybrid || hybrid;
    });
  }

  const std::string ferry_path = dir + "/ferry.json";
  ferry::fuzz::write_file(ferry_path, ferry_config());

  // 3. The Trainer's string form ("full_shard auto_wrap offload"): not a file.
  if (ferry::runtime::is_fsdp_trainer_string(text)) {
    // Its errors name the string; where ferry's file disagrees, that file.
    bool string_hybrid = false;
    ferry::fuzz::expect_result_or_named_error(
        text, [&] { string_hybrid = ferry::runtime::read_fsdp(text).hybrid; });
    ferry::fuzz::expect_result_or_named_error(
        text, [&] { (void)ferry::runtime::load_config(ferry_path, {}, kWorld, "", text); }, ferry_path);
    if (string_hybrid) {
      ferry::fuzz::expect_result_or_named_error(
          text, [&] { (void)ferry::runtime::load_config(ferry_path, kGroup, kWorld, "", text); }, ferry_path);
    }
  }

  // 4. As a file beside ferry's, end to end.
  const std::string fsdp_path = dir + "/fsdp.yaml";
  ferry::fuzz::write_file(fsdp_path, text);
  ferry::fuzz::expect_result_or_named_error(
      dir, [&] { (void)ferry::runtime::load_config(ferry_path, {}, kWorld, "", fsdp_path); });
  if (hybrid) {
    ferry::fuzz::expect_result_or_named_error(
        dir, [&] { (void)ferry::runtime::load_config(ferry_path, kGroup, kWorld, "", fsdp_path); });
  }
  return 0;
}
