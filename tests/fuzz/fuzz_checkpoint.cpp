// A checkpoint folder (runtime/ckpt/checkpoint.h): DIR/latest, and in DIR/step-00000001 the
// manifest and two saving ranks' index (rank-NNNNN.json) and data (rank-NNNNN.bin) files,
// from the parts of the input (fuzz_util.h). The reader is opened as a resume opens it
// (resolve_resume("auto") through `latest`), its layout read, and every unit's three arrays
// read whole, planned in file order as load_checkpoint reads them.
#include <filesystem>

#include "runtime/ckpt/checkpoint.h"
#include "tests/fuzz/fuzz_util.h"

namespace {
const std::vector<std::string> kFiles = {
    "latest",
    "step-00000001/manifest.json",
    "step-00000001/rank-00000.json",
    "step-00000001/rank-00000.bin",
    "step-00000001/rank-00001.json",
    "step-00000001/rank-00001.bin",
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ferry::runtime;
  const std::string dir = ferry::fuzz::scratch().fresh();
  std::filesystem::create_directories(dir + "/step-00000001");
  ferry::fuzz::write_parts(dir, kFiles, data, size);
  ferry::fuzz::expect_result_or_named_error(dir, [&] {
    const std::string step_dir = resolve_resume("auto", dir);
    // `latest` may name any folder; only the one the input wrote is read.
    if (std::filesystem::path(step_dir).lexically_normal() !=
        std::filesystem::path(dir + "/step-00000001"))
      return;
    CheckpointReader reader(step_dir);
    (void)reader.step();
    const std::vector<ferry::nn::UnitSpec> layout = reader.layout();
    reader.check_layout(layout);
    std::vector<CheckpointReader::Read> reads;
    for (int u = 0; u < reader.num_units(); ++u)
      for (int a = 0; a < 3; ++a) reads.push_back({u, a, 0, reader.unit_numel(u)});
    reader.plan(reads);
    for (const CheckpointReader::Read& q : reads) {
      std::vector<float> out(static_cast<size_t>(q.n));
      reader.read(q.unit, q.array, q.begin, q.n, out.data());
    }
  });
  return 0;
}
