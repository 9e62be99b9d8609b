// A Hugging Face tokenizer.json, encoding and decoding as the `tokenizers` library does for
// the models ferry loads (GPT-2, Llama 2 and 3, Mistral, Qwen2).
//
// The pipeline, in the library's order: added tokens are split out of the raw text
// (leftmost-longest; lstrip/rstrip/single_word honoured); each remaining piece is
// normalized (NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence), pre-tokenized (ByteLevel,
// Split with a regex or a string, Metaspace, Digits, Sequence) and cut into tokens by the
// BPE model (merges by rank, ignore_merges, byte_fallback, unk with fuse_unk); the
// post-processor adds the special tokens its template says (TemplateProcessing, ByteLevel,
// Sequence). Decoding runs the decoder (ByteLevel, Replace, ByteFallback, Fuse, Strip,
// Metaspace, Sequence). Regexes run on PCRE2 with UTF and UCP, so \p{L}, \p{N}, \s and
// (?i:...) mean what they mean in the Rust regex crate the library uses; normalization is
// utf8proc's.
//
// Anything else in a tokenizer.json (another model type such as WordPiece or Unigram,
// another normalizer or pre-tokenizer, BPE dropout, continuing_subword_prefix, ...) is
// refused by name when the file is read: TokenizerError naming the file and the JSON path.
// Text that is not valid UTF-8 is refused by encode(); ids outside the vocabulary by decode().
//
// Threads: a Tokenizer is immutable after construction except for its word cache, which is
// guarded: encode/decode may run on several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::text {

class TokenizerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Tokenizer {
 public:
  // Reads and checks `path` (a tokenizer.json).
  static Tokenizer from_file(const std::string& path);
  // `json_text` is the file's content; `path` only names it in errors.
  static Tokenizer from_json(const std::string& json_text, const std::string& path);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // The ids of `text` (UTF-8); add_special_tokens runs the post-processor's template.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // The text of `ids`; skip_special_tokens drops the special added tokens.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  int64_t vocab_size() const;  // the largest id + 1, added tokens included
  // The id of a token string (vocabulary or added), or -1.
  int32_t token_id(std::string_view token) const;
  const std::string& token(int32_t id) const;  // throws TokenizerError for an unknown id
  bool is_special(int32_t id) const;
  // The ids encode(text, true) puts before and after every text (the post-processor's
  // "single" template; Llama 3: <|begin_of_text|> before, nothing after; GPT-2: none).
  const std::vector<int32_t>& special_before() const;
  const std::vector<int32_t>& special_after() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::text
