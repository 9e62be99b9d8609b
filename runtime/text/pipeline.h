// The pieces of a tokenizer.json pipeline (internal to runtime/text): each is built from its
// JSON object, refusing by name what it does not implement, and is immutable afterwards.
// Contracts as tokenizer.h's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ferry::text {

// A PCRE2 pattern compiled with UTF and UCP (JIT where available). Thread-safe.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Every non-overlapping match, left to right: [begin, end) byte ranges.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8
};

// `where` names the file and JSON path in errors ("tokenizer.json: normalizer.normalizers[1]").
[[noreturn]] void refuse(const std::string& where, const std::string& what);

class Normalizer {
 public:
  Normalizer(const nlohmann::json& j, const std::string& where);
  std::string apply(std::string s) const;

 private:
  std::string type_, a_, b_;
  std::shared_ptr<Regex> regex_;
  std::vector<Normalizer> seq_;
};

// A piece of text on its way to the model; `first` marks the piece at the start of the
// input (Metaspace's prepend_scheme "first").
struct Piece {
  std::string text;
  bool first = false;
};

class PreTokenizer {
 public:
  PreTokenizer(const nlohmann::json& j, const std::string& where);
  std::vector<Piece> apply(std::vector<Piece> pieces) const;
  bool byte_level() const;  // a ByteLevel step maps bytes to printable code points

 private:
  enum class Behavior { removed, isolated, merged_with_previous, merged_with_next };
  std::vector<Piece> split(const std::vector<Piece>& in, const Regex* re, const std::string& literal, Behavior b) const;
  std::string type_;
  bool add_prefix_space_ = false, use_regex_ = false, split_ = true, individual_ = false;
  std::string replacement_, prepend_scheme_, literal_;
  Behavior behavior_ = Behavior::isolated;
  std::shared_ptr<Regex> regex_;
  std::vector<PreTokenizer> seq_;
};

class Decoder {
 public:
  Decoder(const nlohmann::json& j, const std::string& where);
  std::vector<std::string> apply(std::vector<std::string> tokens) const;

 private:
  std::string type_, pattern_, content_, replacement_, prepend_scheme_;
  int64_t start_ = 0, stop_ = 0;
  std::vector<Decoder> seq_;
};

// Post-processing: the ids TemplateProcessing's "single" template puts around the sequence.
struct PostProcessor {
  std::vector<int32_t> before, after;
  static PostProcessor parse(const nlohmann::json& j, const std::string& where);
};

// The BPE model. encode_word is thread-safe (its cache is locked).
class Bpe {
 public:
  Bpe(const nlohmann::json& model, const std::string& where);
  ~Bpe();
  void encode_word(const std::string& word, std::vector<int32_t>& out) const;
  int32_t id(std::string_view token) const;  // -1 when absent
  const std::vector<std::string>& tokens() const { return id_to_token_; }

 private:
  struct State;
  std::unique_ptr<State> s_;
  std::vector<std::string> id_to_token_;
};

}  // namespace ferry::text
