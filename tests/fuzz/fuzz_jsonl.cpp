// data.format jsonl (runtime/train/data_jsonl.cpp): the input is the JSONL file, read with
// the shipped Llama 3 test model's tokenizer and the walk-through's chat template
// (examples/data/chat_template.jinja) for "messages" records. The records are then sampled
// as training reads them (padded and packed rows).
#include <fstream>
#include <sstream>

#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "runtime/train/data.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

ferry::runtime::DataOptions base_options() {
  using namespace ferry;
  const std::string src = FERRY_SOURCE_DIR;
  runtime::DataOptions o;
  o.format = "jsonl";
  auto tok = std::make_shared<text::Tokenizer>(
      text::Tokenizer::from_file(src + "/tests/data/hf/llama3/tokenizer.json"));
  o.vocab_size = tok->vocab_size();
  o.bos_token = "<|bos|>";
  o.eos_token = "<|eos|>";
  o.eos = tok->token_id(o.eos_token);
  o.tokenizer = std::move(tok);
  const std::string chat_path = src + "/examples/data/chat_template.jinja";
  std::ifstream in(chat_path);
  std::stringstream ss;
  ss << in.rdbuf();
  o.chat = std::make_shared<text::ChatTemplate>(ss.str(), chat_path);
  o.val_fraction = 0.3;
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ferry::runtime::DataOptions base = base_options();
  ferry::runtime::DataOptions o = base;
  o.path = ferry::fuzz::scratch().fresh() + "/train.jsonl";
  // An odd-sized input also refuses records longer than 33 tokens (data.truncate false).
  o.max_record_tokens = size % 2 ? 33 : 0;
  ferry::fuzz::write_file(o.path, std::string_view(reinterpret_cast<const char*>(data), size));
  ferry::fuzz::expect_result_or_named_error(o.path, [&] {
    const ferry::runtime::TokenData d = ferry::runtime::TokenData::load(o);
    for (bool packed : {false, true}) {
      const ferry::runtime::BatchSampler s(d, 11, /*B=*/2, /*T=*/32, packed);
      for (int64_t step = 0; step < 3; ++step) (void)s.train_batch(step, 0);
      (void)s.val_batch(0);
    }
    (void)d.describe();
  });
  return 0;
}
