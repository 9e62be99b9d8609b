// A Hugging Face model folder given as model.init_from (runtime/config/hf_config.h,
// runtime/hf/hf_weights.h): config.json, model.safetensors.index.json, two shards and
// model.safetensors, from the parts of the input (fuzz_util.h). The folder is read as a run
// starting from it reads it: config.json gives the model's keys (through ferry's own
// configuration and its rules), the index or the single file the weights, checked against
// the model's layout; then every unit is filled, whole and as a middle range (a rank's shard).
#include <filesystem>

#include "runtime/config/config.h"
#include "runtime/hf/hf_weights.h"
#include "tests/fuzz/fuzz_util.h"

namespace {
const std::vector<std::string> kFiles = {
    "config.json",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors",
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ferry::runtime;
  const std::string root = ferry::fuzz::scratch().fresh();
  const std::string dir = root + "/model";
  std::filesystem::create_directories(dir);
  ferry::fuzz::write_parts(dir, kFiles, data, size);
  const nlohmann::json run = {{"model", {{"init_from", dir}}}, {"data", {{"path", "corpus.txt"}}}};
  const std::string source = root + "/run.json";
  ferry::fuzz::expect_result_or_named_error(root, [&] {
    const Config c = config_from_json(run, source, root, {}, 1);
    const std::vector<ferry::nn::UnitSpec> layout = model_layout(c);
    HfWeights weights(dir, c.resolved.at("model"), layout);
    (void)weights.describe();
    for (int u = 0; u < static_cast<int>(layout.size()); ++u) {
      const int64_t n = layout[static_cast<size_t>(u)].numel;
      std::vector<float> buf(static_cast<size_t>(n));
      weights.fill(u, 0, n, buf.data());
      weights.fill(u, n / 3, n / 3, buf.data());
    }
  });
  return 0;
}
