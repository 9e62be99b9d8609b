// data.format tokens (runtime/train/data_tokens.cpp): token files, memory-mapped. The input's
// first byte picks the form (its value mod 4), the rest is the files (fuzz_util.h parts):
//   0  one file of uint16 ids          2  a folder of *.bin files (uint16: vocab 1000)
//   1  one file of uint32 ids          3  a folder `ferry tokenize` wrote: meta.json,
//                                         tokens.bin, counted.bin, starts.bin
// The data are then sampled as training reads them: batches of both splits (padded and
// packed rows for records), every record, the unigram baseline.
#include "runtime/train/data.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr int64_t kVocab = 1000;

void use(const ferry::runtime::TokenData& d) {
  using ferry::runtime::BatchSampler;
  (void)d.describe();
  if (d.records()) {
    for (bool val : {false, true})
      for (size_t r = 0; r < d.num_records(val); ++r) (void)d.record(val, r);
  }
  for (bool packed : {false, true}) {
    if (packed && !d.records()) break;
    const BatchSampler s(d, 7, /*B=*/2, /*T=*/8, packed);
    for (int64_t step = 0; step < 3; ++step) (void)s.train_batch(step, 0);
    (void)s.val_batch(0);
    (void)s.records_per_row();
  }
  (void)ferry::runtime::unigram_baseline(d, kVocab);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string dir = ferry::fuzz::scratch().fresh();
  ferry::runtime::DataOptions o;
  o.format = "tokens";
  o.vocab_size = kVocab;
  o.val_fraction = 0.25;
  switch (data[0] % 4) {
    case 0:
    case 1:
      o.path = dir + "/tokens.bin";
      o.dtype = data[0] % 4 == 0 ? "uint16" : "uint32";
      ferry::fuzz::write_file(o.path,
                              std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
      break;
    case 2:
      o.path = dir + "/shards";
      std::filesystem::create_directories(o.path);
      ferry::fuzz::write_parts(o.path, {"a.bin", "b.bin", "c.bin"}, data + 1, size - 1);
      break;
    default:
      o.path = dir + "/tokenized";
      std::filesystem::create_directories(o.path);
      ferry::fuzz::write_parts(o.path, {"meta.json", "tokens.bin", "counted.bin", "starts.bin"},
                               data + 1, size - 1);
  }
  ferry::fuzz::expect_result_or_named_error(o.path,
                                            [&] { use(ferry::runtime::TokenData::load(o)); });
  return 0;
}
