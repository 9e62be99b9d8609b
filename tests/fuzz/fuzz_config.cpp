// ferry's JSON configuration file (runtime/config/config.h, load_config): the input is the
// file. Every key is checked against the knob table and the cross-key rules. A
// model.init_from folder is read too (fuzz_hf_folder fuzzes its files); an error about
// that folder names its config.json instead of this file.
#include "runtime/config/config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = ferry::fuzz::scratch().fresh();
  const std::string path = dir + "/run.json";
  ferry::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  ferry::fuzz::expect_result_or_named_error(
      path,
      [&] {
        const ferry::runtime::Config c = ferry::runtime::load_config(path, {}, 1);
        // The shape the keys describe, as the trainer lays it out.
        (void)ferry::runtime::model_layout(c);
      },
      "/config.json: ");
  return 0;
}
