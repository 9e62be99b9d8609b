#include "runtime/text/pipeline.h"

#include <cctype>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "runtime/text/tokenizer.h"
#include "runtime/text/unicode.h"

namespace ferry::text {

using nlohmann::json;

namespace {

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string type_of(const json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) refuse(where, "needs a \"type\"");
  return j["type"].get<std::string>();
}

std::string str(const json& j, const char* key, const std::string& where, const std::string& fallback = "") {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_string()) refuse(where + "." + key, "must be a string");
  return it->get<std::string>();
}

bool flag(const json& j, const char* key, const std::string& where, bool fallback) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) refuse(where + "." + key, "must be true or false");
  return it->get<bool>();
}

// {"String": s} or {"Regex": r}: sets one of the two.
void pattern(const json& j, const std::string& where, std::string& literal, std::shared_ptr<Regex>& re) {
  if (!j.is_object() || j.size() != 1) refuse(where, "must be {\"String\": ...} or {\"Regex\": ...}");
  if (j.contains("String") && j["String"].is_string()) {
    literal = j["String"].get<std::string>();
    if (literal.empty()) refuse(where, "an empty String pattern");
  } else if (j.contains("Regex") && j["Regex"].is_string()) {
    re = std::make_shared<Regex>(j["Regex"].get<std::string>(), where);
  } else {
    refuse(where, "must be {\"String\": ...} or {\"Regex\": ...}");
  }
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = s.find(from, at)) != std::string::npos; at = hit + from.size()) {
    out.append(s, at, hit - at).append(to);
  }
  return out.append(s, at, std::string::npos);
}

// Ranges of `s` matching `re` or equal to `literal`.
std::vector<std::pair<size_t, size_t>> matches(std::string_view s, const Regex* re, const std::string& literal) {
  if (re) return re->find_all(s);
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t at = 0, hit; (hit = s.find(literal, at)) != std::string_view::npos; at = hit + literal.size()) {
    out.emplace_back(hit, hit + literal.size());
  }
  return out;
}

}  // namespace

void refuse(const std::string& where, const std::string& what) { throw TokenizerError(where + ": " + what); }

Regex::Regex(const std::string& p, const std::string& where) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP, &err,
                                   &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    refuse(where, "regex " + p + " does not compile at offset " + std::to_string(offset) + ": " +
                      reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // where JIT is unavailable the interpreter runs
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view s) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  std::vector<std::pair<size_t, size_t>> out;
  size_t at = 0;
  while (at <= s.size()) {
    const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at,
                               PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH, or a limit: the rest is one gap
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[1] == ov[0]) {  // an empty match: step one code point
      size_t len = 0;
      if (ov[0] >= s.size()) break;
      utf8_decode_one(s, ov[0], &len);
      at = ov[0] + len;
      continue;
    }
    out.emplace_back(ov[0], ov[1]);
    at = ov[1];
  }
  pcre2_match_data_free(md);
  return out;
}

// ---- normalizers ----

Normalizer::Normalizer(const json& j, const std::string& where) : type_(type_of(j, where)) {
  if (type_ == "NFC" || type_ == "NFD" || type_ == "NFKC" || type_ == "NFKD") return;
  if (type_ == "Prepend") {
    a_ = str(j, "prepend", where);
  } else if (type_ == "Replace") {
    pattern(j.value("pattern", json()), where + ".pattern", a_, regex_);
    b_ = str(j, "content", where);
  } else if (type_ == "Sequence") {
    const json& list = j.value("normalizers", json());
    if (!list.is_array()) refuse(where + ".normalizers", "must be a list");
    for (size_t i = 0; i < list.size(); ++i) seq_.emplace_back(list[i], where + ".normalizers[" + std::to_string(i) + "]");
  } else {
    refuse(where, "normalizer type '" + type_ + "' is not supported (NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence are)");
  }
}

std::string Normalizer::apply(std::string s) const {
  if (type_ == "Sequence") {
    for (const Normalizer& n : seq_) s = n.apply(std::move(s));
    return s;
  }
  if (type_ == "Prepend") return s.empty() ? s : a_ + s;
  if (type_ == "Replace") {
    if (!regex_) return replace_all(std::move(s), a_, b_);
    std::string out;
    size_t at = 0;
    for (const auto& [b, e] : regex_->find_all(s)) {
      out.append(s, at, b - at).append(b_);
      at = e;
    }
    return out.append(s, at, std::string::npos);
  }
  return normalize(s, type_);
}

// ---- pre-tokenizers ----

PreTokenizer::PreTokenizer(const json& j, const std::string& where) : type_(type_of(j, where)) {
  if (type_ == "ByteLevel") {
    add_prefix_space_ = flag(j, "add_prefix_space", where, true);
    use_regex_ = flag(j, "use_regex", where, true);
    if (use_regex_) regex_ = std::make_shared<Regex>(kGpt2Pattern, where);
  } else if (type_ == "Split") {
    pattern(j.value("pattern", json()), where + ".pattern", literal_, regex_);
    const std::string b = str(j, "behavior", where);
    if (b == "Removed") behavior_ = Behavior::removed;
    else if (b == "Isolated") behavior_ = Behavior::isolated;
    else if (b == "MergedWithPrevious") behavior_ = Behavior::merged_with_previous;
    else if (b == "MergedWithNext") behavior_ = Behavior::merged_with_next;
    else refuse(where + ".behavior", "'" + b + "' is not supported (Removed, Isolated, MergedWithPrevious, MergedWithNext are)");
    if (flag(j, "invert", where, false)) refuse(where + ".invert", "true is not supported");
  } else if (type_ == "Metaspace") {
    replacement_ = str(j, "replacement", where, "\xE2\x96\x81");
    if (j.contains("prepend_scheme")) {
      prepend_scheme_ = str(j, "prepend_scheme", where);
    } else {
      prepend_scheme_ = flag(j, "add_prefix_space", where, true) ? "always" : "never";
    }
    if (prepend_scheme_ != "first" && prepend_scheme_ != "always" && prepend_scheme_ != "never") {
      refuse(where + ".prepend_scheme", "'" + prepend_scheme_ + "' is not first, always or never");
    }
    split_ = flag(j, "split", where, true);
  } else if (type_ == "Digits") {
    individual_ = flag(j, "individual_digits", where, false);
    regex_ = std::make_shared<Regex>(individual_ ? R"(\p{Nd})" : R"(\p{Nd}+)", where);
    behavior_ = Behavior::isolated;
  } else if (type_ == "Sequence") {
    const json& list = j.value("pretokenizers", json());
    if (!list.is_array()) refuse(where + ".pretokenizers", "must be a list");
    for (size_t i = 0; i < list.size(); ++i) seq_.emplace_back(list[i], where + ".pretokenizers[" + std::to_string(i) + "]");
  } else {
    refuse(where, "pre_tokenizer type '" + type_ +
                      "' is not supported (ByteLevel, Split, Metaspace, Digits, Sequence are)");
  }
}

bool PreTokenizer::byte_level() const {
  if (type_ == "ByteLevel") return true;
  for (const PreTokenizer& p : seq_)
    if (p.byte_level()) return true;
  return false;
}

std::vector<Piece> PreTokenizer::split(const std::vector<Piece>& in, const Regex* re, const std::string& literal,
                                       Behavior b) const {
  std::vector<Piece> out;
  for (const Piece& p : in) {
    // The piece as alternating gaps and matches.
    std::vector<std::pair<std::string, bool>> parts;
    size_t at = 0;
    for (const auto& [mb, me] : matches(p.text, re, literal)) {
      if (mb > at) parts.emplace_back(p.text.substr(at, mb - at), false);
      parts.emplace_back(p.text.substr(mb, me - mb), true);
      at = me;
    }
    if (at < p.text.size()) parts.emplace_back(p.text.substr(at), false);
    std::vector<std::string> pieces;
    for (size_t i = 0; i < parts.size(); ++i) {
      const auto& [text, is_match] = parts[i];
      switch (b) {
        case Behavior::removed:
          if (!is_match) pieces.push_back(text);
          break;
        case Behavior::isolated:
          pieces.push_back(text);
          break;
        case Behavior::merged_with_previous:
          if (is_match && !pieces.empty() && i > 0 && !parts[i - 1].second) pieces.back() += text;
          else pieces.push_back(text);
          break;
        case Behavior::merged_with_next:
          if (is_match && i + 1 < parts.size() && !parts[i + 1].second) {
            pieces.push_back(text + parts[i + 1].first);
            ++i;
          } else {
            pieces.push_back(text);
          }
          break;
      }
    }
    for (size_t i = 0; i < pieces.size(); ++i) out.push_back({pieces[i], p.first && i == 0});
  }
  return out;
}

std::vector<Piece> PreTokenizer::apply(std::vector<Piece> pieces) const {
  if (type_ == "Sequence") {
    for (const PreTokenizer& p : seq_) pieces = p.apply(std::move(pieces));
    return pieces;
  }
  if (type_ == "Split" || type_ == "Digits") return split(pieces, regex_.get(), literal_, behavior_);
  if (type_ == "Metaspace") {
    for (Piece& p : pieces) {
      p.text = replace_all(std::move(p.text), " ", replacement_);
      const bool prepend = prepend_scheme_ == "always" || (prepend_scheme_ == "first" && p.first);
      if (prepend && !p.text.starts_with(replacement_)) p.text = replacement_ + p.text;
    }
    return split_ ? split(pieces, nullptr, replacement_, Behavior::merged_with_next) : pieces;
  }
  // ByteLevel
  if (add_prefix_space_) {
    for (Piece& p : pieces)
      if (!p.text.starts_with(' ')) p.text = " " + p.text;
  }
  if (use_regex_) pieces = split(pieces, regex_.get(), "", Behavior::isolated);
  for (Piece& p : pieces) {
    std::string mapped;
    for (const char c : p.text) mapped += byte_to_unicode(static_cast<uint8_t>(c));
    p.text = std::move(mapped);
  }
  return pieces;
}

// ---- decoders ----

Decoder::Decoder(const json& j, const std::string& where) : type_(type_of(j, where)) {
  if (type_ == "ByteLevel" || type_ == "ByteFallback" || type_ == "Fuse") return;
  if (type_ == "Replace") {
    std::shared_ptr<Regex> re;
    pattern(j.value("pattern", json()), where + ".pattern", pattern_, re);
    if (re) refuse(where + ".pattern", "a Regex pattern in a Replace decoder is not supported");
    content_ = str(j, "content", where);
  } else if (type_ == "Strip") {
    content_ = str(j, "content", where, " ");
    start_ = j.value("start", 0);
    stop_ = j.value("stop", 0);
  } else if (type_ == "Metaspace") {
    replacement_ = str(j, "replacement", where, "\xE2\x96\x81");
    prepend_scheme_ = j.contains("prepend_scheme") ? str(j, "prepend_scheme", where)
                                                   : (flag(j, "add_prefix_space", where, true) ? "always" : "never");
  } else if (type_ == "Sequence") {
    const json& list = j.value("decoders", json());
    if (!list.is_array()) refuse(where + ".decoders", "must be a list");
    for (size_t i = 0; i < list.size(); ++i) seq_.emplace_back(list[i], where + ".decoders[" + std::to_string(i) + "]");
  } else {
    refuse(where, "decoder type '" + type_ +
                      "' is not supported (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence are)");
  }
}

std::vector<std::string> Decoder::apply(std::vector<std::string> tokens) const {
  if (type_ == "Sequence") {
    for (const Decoder& d : seq_) tokens = d.apply(std::move(tokens));
    return tokens;
  }
  if (type_ == "ByteLevel") {
    std::string bytes;
    for (const std::string& t : tokens) {
      std::string mine;
      bool all = true;
      for (size_t i = 0; i < t.size() && all;) {
        size_t len = 0;
        const int b = unicode_to_byte(utf8_decode_one(t, i, &len));
        if (b < 0) all = false;
        else mine += static_cast<char>(b);
        i += len;
      }
      bytes += all ? mine : t;
    }
    return {utf8_lossy(bytes)};
  }
  if (type_ == "Replace") {
    for (std::string& t : tokens) t = replace_all(std::move(t), pattern_, content_);
    return tokens;
  }
  if (type_ == "Fuse") {
    std::string all;
    for (const std::string& t : tokens) all += t;
    return {all};
  }
  if (type_ == "ByteFallback") {
    std::vector<std::string> out;
    std::string pending;
    size_t pending_n = 0;
    auto flush = [&] {
      if (pending_n == 0) return;
      if (valid_utf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending_n; ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
      pending_n = 0;
    };
    for (const std::string& t : tokens) {
      if (t.size() == 6 && t.starts_with("<0x") && t.ends_with('>') && std::isxdigit(static_cast<unsigned char>(t[3])) &&
          std::isxdigit(static_cast<unsigned char>(t[4]))) {
        pending += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
        ++pending_n;
      } else {
        flush();
        out.push_back(t);
      }
    }
    flush();
    return out;
  }
  if (type_ == "Strip") {
    for (std::string& t : tokens) {
      for (int64_t i = 0; i < start_ && t.starts_with(content_); ++i) t.erase(0, content_.size());
      for (int64_t i = 0; i < stop_ && t.ends_with(content_); ++i) t.erase(t.size() - content_.size());
    }
    return tokens;
  }
  // Metaspace
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = replace_all(std::move(tokens[i]), replacement_, " ");
    if (i == 0 && prepend_scheme_ != "never" && tokens[i].starts_with(' ')) tokens[i].erase(0, 1);
  }
  return tokens;
}

// ---- post-processor ----

PostProcessor PostProcessor::parse(const json& j, const std::string& where) {
  PostProcessor pp;
  if (j.is_null()) return pp;
  const std::string type = type_of(j, where);
  if (type == "ByteLevel") return pp;  // offsets only
  if (type == "Sequence") {
    const json& list = j.value("processors", json());
    if (!list.is_array()) refuse(where + ".processors", "must be a list");
    for (size_t i = 0; i < list.size(); ++i) {
      const PostProcessor p = parse(list[i], where + ".processors[" + std::to_string(i) + "]");
      pp.before.insert(pp.before.end(), p.before.begin(), p.before.end());
      pp.after.insert(pp.after.begin(), p.after.begin(), p.after.end());
    }
    return pp;
  }
  if (type != "TemplateProcessing") {
    refuse(where, "post_processor type '" + type + "' is not supported (TemplateProcessing, ByteLevel, Sequence are)");
  }
  const json& single = j.value("single", json());
  const json& specials = j.value("special_tokens", json::object());
  if (!single.is_array()) refuse(where + ".single", "must be a list");
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& item = single[i];
    const std::string at = where + ".single[" + std::to_string(i) + "]";
    if (item.contains("Sequence")) {
      if (seen_sequence) refuse(at, "a second $A sequence");
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id")) refuse(at, "must be a SpecialToken or a Sequence");
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array()) {
      refuse(where + ".special_tokens", "has no ids for '" + name + "'");
    }
    for (const json& id : specials[name]["ids"]) (seen_sequence ? pp.after : pp.before).push_back(id.get<int32_t>());
  }
  if (!seen_sequence) refuse(where + ".single", "has no $A sequence");
  return pp;
}

}  // namespace ferry::text
