#include "runtime/text/tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <optional>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "base/nesting_limit.h"
#include "runtime/text/pipeline.h"
#include "runtime/text/unicode.h"

namespace ferry::text {

using nlohmann::json;

namespace {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// A stretch of input: an added token's id, or text for the model.
struct Segment {
  int32_t added = -1;
  std::string text;
  bool first = false;  // starts the input
};

bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

bool word_char(std::string_view s, size_t i, bool before) {
  // The code point ending at i (before) or starting at i is a letter, digit or '_'.
  if (before) {
    if (i == 0) return false;
    size_t b = i - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
    const unsigned char c = static_cast<unsigned char>(s[b]);
    return c >= 0x80 || std::isalnum(c) || c == '_';
  }
  if (i >= s.size()) return false;
  const unsigned char c = static_cast<unsigned char>(s[i]);
  return c >= 0x80 || std::isalnum(c) || c == '_';
}

}  // namespace

struct Tokenizer::Impl {
  std::string path;
  std::unique_ptr<Bpe> bpe;
  std::optional<Normalizer> normalizer;
  std::optional<PreTokenizer> pre;
  std::optional<Decoder> decoder;
  PostProcessor post;
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;
  std::array<std::vector<size_t>, 256> added_by_first_byte;  // longest first
  int64_t vocab_size = 0;

  // Splits `text` on the added tokens with normalized == want_normalized.
  void split_added(const std::string& text, bool first, bool want_normalized, std::vector<Segment>& out) const {
    size_t at = 0, start = 0;
    auto emit_text = [&](size_t b, size_t e) {
      if (e > b) out.push_back({-1, text.substr(b, e - b), first && b == 0});
    };
    while (at < text.size()) {
      const AddedToken* hit = nullptr;
      for (const size_t k : added_by_first_byte[static_cast<uint8_t>(text[at])]) {
        const AddedToken& t = added[k];
        if (t.normalized != want_normalized || text.compare(at, t.content.size(), t.content) != 0) continue;
        if (t.single_word && (word_char(text, at, true) || word_char(text, at + t.content.size(), false))) continue;
        hit = &t;
        break;
      }
      if (!hit) {
        ++at;
        continue;
      }
      size_t b = at, e = at + hit->content.size();
      if (hit->lstrip)
        while (b > start && space(text[b - 1])) --b;
      if (hit->rstrip)
        while (e < text.size() && space(text[e])) ++e;
      emit_text(start, b);
      out.push_back({hit->id, "", false});
      at = start = e;
    }
    emit_text(start, text.size());
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TokenizerError(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json(ss.str(), path);
}

// The pieces check what they read and refuse naming the JSON path; a value of another type
// than the one read (json's get() and value() throw type_error) is refused at the end, naming
// the file (a function-try-block: the whole body is inside).
Tokenizer Tokenizer::from_json(const std::string& text, const std::string& path) try {
  const json j = base::parse_json<TokenizerError>(text, path, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw TokenizerError(path + ": not a JSON object");
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  if (!j.contains("model")) refuse(path, "no \"model\"");
  impl->bpe = std::make_unique<Bpe>(j["model"], path + ": model");
  if (j.contains("normalizer") && !j["normalizer"].is_null()) impl->normalizer.emplace(j["normalizer"], path + ": normalizer");
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
    impl->pre.emplace(j["pre_tokenizer"], path + ": pre_tokenizer");
  }
  if (j.contains("decoder") && !j["decoder"].is_null()) impl->decoder.emplace(j["decoder"], path + ": decoder");
  impl->post = PostProcessor::parse(j.value("post_processor", json()), path + ": post_processor");
  if (j.contains("truncation") && !j["truncation"].is_null()) refuse(path + ": truncation", "is not supported (set null)");
  if (j.contains("padding") && !j["padding"].is_null()) refuse(path + ": padding", "is not supported (set null)");
  impl->vocab_size = static_cast<int64_t>(impl->bpe->tokens().size());
  const json& added = j.value("added_tokens", json::array());
  if (!added.is_array()) refuse(path + ": added_tokens", "must be a list");
  for (size_t i = 0; i < added.size(); ++i) {
    const json& a = added[i];
    const std::string where = path + ": added_tokens[" + std::to_string(i) + "]";
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string() || a["content"].get<std::string>().empty() || a["id"].get<int64_t>() < 0 ||
        a["id"].get<int64_t>() > (1 << 24)) {
      refuse(where, "needs an id and a non-empty content");
    }
    AddedToken t{a["id"].get<int32_t>(), a["content"].get<std::string>(), a.value("special", false),
                 a.value("lstrip", false), a.value("rstrip", false), a.value("single_word", false),
                 a.value("normalized", false)};
    impl->added_by_id[t.id] = impl->added.size();
    impl->vocab_size = std::max<int64_t>(impl->vocab_size, t.id + 1);
    impl->added.push_back(std::move(t));
  }
  for (size_t k = 0; k < impl->added.size(); ++k) {
    impl->added_by_first_byte[static_cast<uint8_t>(impl->added[k].content[0])].push_back(k);
  }
  for (auto& list : impl->added_by_first_byte) {
    std::stable_sort(list.begin(), list.end(), [&](size_t a, size_t b) {
      return impl->added[a].content.size() > impl->added[b].content.size();
    });
  }
  for (const int32_t id : impl->post.before) {
    if (id < 0 || id >= impl->vocab_size) refuse(path + ": post_processor", "adds id " + std::to_string(id) + " outside the vocabulary");
  }
  return Tokenizer(std::move(impl));
} catch (const json::exception& e) {
  throw TokenizerError(path + ": " + e.what());
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  if (!valid_utf8(text)) throw TokenizerError(m.path + ": the text to encode is not valid UTF-8");
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = m.post.before;
  std::vector<Segment> raw;
  m.split_added(std::string(text), true, false, raw);
  for (Segment& s : raw) {
    if (s.added >= 0) {
      ids.push_back(s.added);
      continue;
    }
    std::string normalized = m.normalizer ? m.normalizer->apply(std::move(s.text)) : std::move(s.text);
    std::vector<Segment> parts;
    m.split_added(normalized, s.first, true, parts);
    for (Segment& p : parts) {
      if (p.added >= 0) {
        ids.push_back(p.added);
        continue;
      }
      std::vector<Piece> pieces{{std::move(p.text), p.first}};
      if (m.pre) pieces = m.pre->apply(std::move(pieces));
      for (const Piece& w : pieces)
        if (!w.text.empty()) m.bpe->encode_word(w.text, ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), m.post.after.begin(), m.post.after.end());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  for (const int32_t id : ids) {
    if (const auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) {
      if (!(skip_special_tokens && impl_->added[it->second].special)) tokens.push_back(impl_->added[it->second].content);
      continue;
    }
    tokens.push_back(token(id));
  }
  if (!impl_->decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  std::string out;
  for (const std::string& t : impl_->decoder->apply(std::move(tokens))) out += t;
  return out;
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

int32_t Tokenizer::token_id(std::string_view token) const {
  for (const auto& a : impl_->added)
    if (a.content == token) return a.id;
  return impl_->bpe->id(token);
}

const std::string& Tokenizer::token(int32_t id) const {
  if (const auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) return impl_->added[it->second].content;
  const auto& v = impl_->bpe->tokens();
  if (id < 0 || static_cast<size_t>(id) >= v.size() || v[static_cast<size_t>(id)].empty()) {
    throw TokenizerError(impl_->path + ": id " + std::to_string(id) + " is outside the vocabulary");
  }
  return v[static_cast<size_t>(id)];
}

bool Tokenizer::is_special(int32_t id) const {
  const auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

const std::vector<int32_t>& Tokenizer::special_before() const { return impl_->post.before; }
const std::vector<int32_t>& Tokenizer::special_after() const { return impl_->post.after; }

}  // namespace ferry::text
