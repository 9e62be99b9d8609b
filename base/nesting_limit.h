// Depth bounds for JSON and YAML that come from outside the program (configurations, DeepSpeed
// and FSDP files, model folders, data records, checkpoint manifests), checked on the text
// before any parser sees it.
//
// Why: nlohmann's parser keeps its own stack, but what ferry does with a parsed document
// recurses once per level: dump(), copies, ==, and ferry's walkers (overlay, merge,
// drop_nulls, the DeepSpeed and FSDP translations, the chat template's values); yaml-cpp's
// parser recurses per level itself. A document nested 200,000 levels deep used to end the
// process on a stack overflow (SIGSEGV) instead of an error naming the file.
//
// The bounds, and why those numbers:
// - JSON: kMaxJsonNesting = 512. Real files nest little (tokenizer.json < 10, a DeepSpeed file
//   3, a Trainer state 4), so 512 refuses nothing a tool writes, and 512 levels of the deepest
//   walker (a few frames of a few hundred bytes each) need well under 1 MiB of the 8 MiB
//   main stack, with ASan's larger frames too (tests/user_robustness.sh runs in both builds).
// - YAML: kMaxYamlNesting = 64, the bound fsdp_config.cpp's walker already had. The scan
//   counts an upper bound of the nesting (indentation steps, block indicators `- ` `? ` `: `
//   and flow brackets), so a document is refused here at no more than 64 levels of real
//   nesting; accelerate's files nest 2-3.
//
// Both scans are one pass over the bytes without allocation beyond a bounded stack; they are
// not validators: a malformed document that passes is left to the parser to refuse with its
// own message. A scan never counts less nesting than the parser would build.
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <istream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace ferry::base {

inline constexpr int kMaxJsonNesting = 512;
inline constexpr int kMaxYamlNesting = 64;

// The line (1-based, counted from first_line) where `text`, read as JSON, first opens a
// `[` or `{` more than `limit` levels deep; nothing when it never does. Brackets inside
// strings and comments (// and /* */, which ferry's configuration files may hold) are not
// counted.
std::optional<size_t> json_too_deep_line(std::string_view text, int limit = kMaxJsonNesting, size_t first_line = 1);

// The same for YAML: the line where the count of nesting (see above) first passes `limit`.
// Quoted scalars, comments and block scalars (| and >) are skipped.
std::optional<size_t> yaml_too_deep_line(std::string_view text, int limit = kMaxYamlNesting);

// "SOURCE: line L: nested deeper than N levels (ferry reads KIND nested at most N deep)"
std::string too_deep_message(const std::string& source, size_t line, int limit, const char* kind);

// Throws Error(too_deep_message(...)) when `text` nests deeper than the bound. Error is the
// caller's error type (ConfigError, TokenizerError, ...), so the refusal takes the path and
// exit status every other bad input of that kind takes.
template <class Error>
void refuse_deep_json(std::string_view text, const std::string& source, size_t first_line = 1) {
  if (const auto line = json_too_deep_line(text, kMaxJsonNesting, first_line)) {
    throw Error(too_deep_message(source, *line, kMaxJsonNesting, "JSON"));
  }
}
template <class Error>
void refuse_deep_yaml(std::string_view text, const std::string& source) {
  if (const auto line = yaml_too_deep_line(text, kMaxYamlNesting)) {
    throw Error(too_deep_message(source, *line, kMaxYamlNesting, "YAML"));
  }
}

// json::parse behind the bound: refuse_deep_json, then Json::parse(text, nullptr,
// allow_exceptions, ignore_comments) with its usual result (a discarded value, or
// json::parse_error, as asked).
template <class Error, class Json = nlohmann::json>
Json parse_json(std::string_view text, const std::string& source, bool allow_exceptions = true,
                bool ignore_comments = false) {
  refuse_deep_json<Error>(text, source);
  return Json::parse(text, nullptr, allow_exceptions, ignore_comments);
}

// The same over a whole stream (read into memory first: the scan needs the bytes).
template <class Error, class Json = nlohmann::json>
Json parse_json(std::istream& in, const std::string& source, bool allow_exceptions = true,
                bool ignore_comments = false) {
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return parse_json<Error, Json>(text, source, allow_exceptions, ignore_comments);
}

}  // namespace ferry::base
