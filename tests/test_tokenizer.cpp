// Hugging Face tokenizer.json files, encoded and decoded as the `tokenizers` library does:
// for each family in tests/data/tokenizers/ (GPT-2, Llama 3, Qwen2 byte-level BPE; Llama 2
// and Mistral SentencePiece-style BPE with byte fallback), the ids and decoded strings the
// library gave for ~40 strings (non-ASCII scripts, emoji, digits, whitespace runs, special
// tokens) are reproduced exactly; decode(encode(s)) == s where the library round-trips;
// unsupported pipeline pieces and bad input are refused by name.
#define BOOST_TEST_MODULE tokenizer
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "runtime/text/tokenizer.h"
#include "runtime/text/unicode.h"

using namespace ferry;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kData = std::string(FERRY_SOURCE_DIR) + "/tests/data/tokenizers/";
const char* const kFamilies[] = {"gpt2", "llama3", "qwen2", "llama2", "mistral"};

json read_json(const std::string& p) {
  std::ifstream in(p);
  return json::parse(in);
}

std::string show(const std::string& s) { return json(s).dump(); }

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

BOOST_AUTO_TEST_CASE(ids_and_text_match_the_reference_library) {
  for (const char* family : kFamilies) {
    BOOST_TEST_CONTEXT(family) {
      const text::Tokenizer tok = text::Tokenizer::from_file(kData + family + "/tokenizer.json");
      const json cases = read_json(kData + family + "/expected.json");
      BOOST_TEST_REQUIRE(cases.size() >= 30u);
      int round_trips = 0;
      for (const json& c : cases) {
        const std::string s = c.at("text").get<std::string>();
        BOOST_TEST_CONTEXT(show(s)) {
          const std::vector<int32_t> ids = tok.encode(s, true);
          const std::vector<int32_t> plain = tok.encode(s, false);
          BOOST_TEST(ids == c.at("ids").get<std::vector<int32_t>>(), boost::test_tools::per_element());
          BOOST_TEST(plain == c.at("ids_no_special").get<std::vector<int32_t>>(), boost::test_tools::per_element());
          BOOST_TEST(tok.decode(ids, false) == c.at("decoded").get<std::string>());
          BOOST_TEST(tok.decode(ids, true) == c.at("decoded_skip").get<std::string>());
          if (c.at("decoded_skip").get<std::string>() == s) {
            ++round_trips;
            BOOST_TEST(tok.decode(plain, true) == s);
          }
        }
      }
      BOOST_TEST_MESSAGE(family << ": " << cases.size() << " strings, " << round_trips << " round-trip exactly");
      BOOST_TEST(round_trips >= static_cast<int>(cases.size()) / 2);
    }
  }
}

BOOST_AUTO_TEST_CASE(the_byte_level_table_is_gpt2s) {
  // bytes_to_unicode: printable bytes are themselves, space is U+0120 'Ġ', newline U+010A 'Ċ'.
  BOOST_TEST(text::byte_to_unicode('a') == "a");
  BOOST_TEST(text::byte_to_unicode(' ') == "\xC4\xA0");
  BOOST_TEST(text::byte_to_unicode('\n') == "\xC4\x8A");
  for (int b = 0; b < 256; ++b) {
    size_t len = 0;
    const std::string& u = text::byte_to_unicode(static_cast<uint8_t>(b));
    BOOST_TEST(text::unicode_to_byte(text::utf8_decode_one(u, 0, &len)) == b);
  }
  BOOST_TEST(text::utf8_lossy("a\xF0\x9F\x91") == "a\xEF\xBF\xBD");   // a truncated emoji: one U+FFFD
  BOOST_TEST(text::utf8_lossy("\xC3\x28") == "\xEF\xBF\xBD(");
  BOOST_TEST(text::normalize("e\xCC\x81", "NFC") == "\xC3\xA9");
}

BOOST_AUTO_TEST_CASE(unsupported_pieces_and_bad_input_are_refused_by_name) {
  const json base = read_json(kData + "gpt2/tokenizer.json");
  auto refused = [&](const std::function<void(json&)>& edit) {
    json j = base;
    edit(j);
    return error_of([&] { text::Tokenizer::from_json(j.dump(), "tok.json"); });
  };
  auto has = [](const std::string& msg, const std::string& part) {
    BOOST_TEST((msg.find(part) != std::string::npos), "'" << part << "' in: " << msg);
  };
  has(refused([](json& j) { j["model"]["type"] = "WordPiece"; }), "tok.json: model.type: model type 'WordPiece' is not supported");
  has(refused([](json& j) { j["model"]["dropout"] = 0.1; }), "tok.json: model.dropout");
  has(refused([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }), "tok.json: normalizer: normalizer type 'Lowercase'");
  has(refused([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }), "tok.json: pre_tokenizer: pre_tokenizer type 'Whitespace'");
  has(refused([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }), "tok.json: decoder: decoder type 'WordPiece'");
  has(refused([](json& j) { j["post_processor"] = {{"type", "BertProcessing"}}; }), "post_processor type 'BertProcessing'");
  has(refused([](json& j) {
        j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
      }),
      "tok.json: pre_tokenizer.pattern: regex (unclosed does not compile");
  has(refused([](json& j) { j["model"]["merges"] = json::array({"q zz"}); }), "tok.json: model.merges[0]");
  // A value of another JSON type than the one read: a TokenizerError naming the file (json's
  // type_error escaped before, naming nothing; found by tests/fuzz/fuzz_tokenizer.cpp).
  const std::string typed = refused([](json& j) { j["added_tokens"][0]["special"] = 1; });
  has(typed, "tok.json: [json.exception.type_error.302] type must be boolean, but is number");
  BOOST_CHECK_EXCEPTION(text::Tokenizer::from_json(
                            [&] {
                              json j = base;
                              j["model"]["byte_fallback"] = "no";
                              return j.dump();
                            }(),
                            "tok.json"),
                        text::TokenizerError,
                        [](const text::TokenizerError& e) { return std::string(e.what()).starts_with("tok.json: "); });
  has(error_of([] { text::Tokenizer::from_json("{not json", "x.json"); }), "x.json: not a JSON object");
  has(error_of([] { text::Tokenizer::from_file("/nonexistent/tokenizer.json"); }), "/nonexistent/tokenizer.json: cannot open");
  const text::Tokenizer tok = text::Tokenizer::from_json(base.dump(), "tok.json");
  has(error_of([&] { tok.encode("ab\xFF"); }), "not valid UTF-8");
  has(error_of([&] { tok.decode({1 << 20}); }), "id 1048576 is outside the vocabulary");
}
