// A Hugging Face tokenizer.json (runtime/text/tokenizer.h): the input is the file. A
// tokenizer it accepts then encodes a few fixed strings (ASCII, digits, whitespace runs,
// non-ASCII, a special token's spelling) and decodes the ids, and decodes the first ids of
// its vocabulary. Encoding refuses only text that is not UTF-8 (none here); decoding only
// unknown ids (none here): any TokenizerError from them names the file too.
#include "runtime/text/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {
const char* const kTexts[] = {
    "In the beginning God created the heaven and the earth.",
    "  Gen 1:12 -- 2024, x=3.14159;\n\n\ttabs\r\n",
    "caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 \xe2\x80\x94 \xef\xac\x81",
    "<|bos|>hello<|eos|> <s>[INST] hi [/INST]</s><|endoftext|>",
    "",
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ferry::fuzz::scratch().fresh() + "/tokenizer.json";
  ferry::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  ferry::fuzz::expect_result_or_named_error(path, [&] {
    const ferry::text::Tokenizer tok = ferry::text::Tokenizer::from_file(path);
    for (const char* text : kTexts) {
      for (bool special : {true, false}) {
        const std::vector<int32_t> ids = tok.encode(text, special);
        for (const int32_t id : ids)
          if (id < 0 || id >= tok.vocab_size())
            ferry::fuzz::fail("encode() gave an id outside the vocabulary");
        (void)tok.decode(ids, /*skip_special_tokens=*/!special);
      }
    }
    std::vector<int32_t> first;
    for (int32_t id = 0; id < std::min<int64_t>(tok.vocab_size(), 300); ++id) {
      if (tok.token_id(tok.token(id)) < 0)
        ferry::fuzz::fail("token(id) is not found by token_id()");
      first.push_back(id);
    }
    (void)tok.decode(first);
  });
  return 0;
}
