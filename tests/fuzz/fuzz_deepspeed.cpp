// A DeepSpeed configuration file given beside ferry's (ferry train --deepspeed): the input
// is the DeepSpeed file; ferry's own file is a fixed small one. Errors name the file that
// is at fault: the DeepSpeed file, or ferry's where the two disagree.
#include "runtime/config/config.h"
#include "tests/fuzz/fuzz_util.h"

namespace {
// Sets none of the runtime keys, so that those of the DeepSpeed file apply.
const char* const kFerryConfig = R"({
  "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256, "block_size": 32},
  "data": {"path": "corpus.txt"},
  "train": {"steps": 10}
})";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = ferry::fuzz::scratch().fresh();
  const std::string ferry_path = dir + "/ferry.json", ds_path = dir + "/ds_config.json";
  ferry::fuzz::write_file(ferry_path, kFerryConfig);
  ferry::fuzz::write_file(ds_path, std::string_view(reinterpret_cast<const char*>(data), size));
  // Both files are in `dir`: the message names one of them.
  ferry::fuzz::expect_result_or_named_error(
      dir, [&] { (void)ferry::runtime::load_config(ferry_path, {}, 2, ds_path); });
  return 0;
}
