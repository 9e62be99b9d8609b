// The nesting bound of outside JSON and YAML (base/nesting_limit.h): the line it names, what
// it does not count (strings, comments, block scalars), that real shapes pass, and that the
// YAML count never falls below the nesting yaml-cpp builds.
#define BOOST_TEST_MODULE nesting_limit
#include <boost/test/unit_test.hpp>

#include <stdexcept>
#include <string>

#include "base/nesting_limit.h"

using namespace ferry::base;

namespace {

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

// A YAML document whose nodes nest exactly `n` collections deep, in several styles.
std::string block_maps(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += std::string(2 * i, ' ') + "k" + std::to_string(i) + ":\n";
  return out + std::string(2 * n, ' ') + "leaf\n";
}

}  // namespace

BOOST_AUTO_TEST_CASE(json_depth_at_the_limit_passes_one_more_is_refused_on_its_line) {
  const std::string at_limit = repeat("[", kMaxJsonNesting) + repeat("]", kMaxJsonNesting);
  BOOST_TEST(!json_too_deep_line(at_limit).has_value());
  const std::string over = "{\n\"a\":\n" + repeat("[", kMaxJsonNesting) + "\n]";
  BOOST_TEST(json_too_deep_line(over).value() == 3u);
  // Deep but sequential: depth returns after each closer.
  BOOST_TEST(!json_too_deep_line(repeat("[[]]", 100000)).has_value());
  // A record at line 17 of a JSONL file.
  BOOST_TEST(json_too_deep_line(repeat("{\"a\":", 200000), kMaxJsonNesting, 17).value() == 17u);
}

BOOST_AUTO_TEST_CASE(json_brackets_in_strings_and_comments_are_not_counted) {
  const std::string brackets = repeat("[", 1000);
  BOOST_TEST(!json_too_deep_line("{\"a\": \"" + brackets + "\"}").has_value());
  BOOST_TEST(!json_too_deep_line("{\"a\": \"\\\"" + brackets + "\"}").has_value());  // an escaped quote
  BOOST_TEST(!json_too_deep_line("// " + brackets + "\n{}").has_value());
  BOOST_TEST(!json_too_deep_line("/* " + brackets + " */ {}").has_value());
  // The string ends at an unescaped quote: what follows counts.
  BOOST_TEST(json_too_deep_line("[\"\\\\\"" + brackets).has_value());
}

BOOST_AUTO_TEST_CASE(parse_json_throws_the_callers_error_naming_the_file_and_line) {
  try {
    parse_json<std::invalid_argument>("\n\n" + repeat("{\"a\":", 200000), "cfg.json");
    BOOST_FAIL("no error");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()) ==
               "cfg.json: line 3: nested deeper than 512 levels (ferry reads JSON nested at most 512 deep)");
  }
  BOOST_TEST(parse_json<std::invalid_argument>("{\"a\": [1, {\"b\": 2}]}", "x")["a"][1]["b"] == 2);
  BOOST_TEST(parse_json<std::invalid_argument>("{", "x", /*allow_exceptions=*/false).is_discarded());
}

BOOST_AUTO_TEST_CASE(yaml_flow_and_block_nesting_are_refused_before_the_parser) {
  BOOST_TEST(yaml_too_deep_line("a: " + repeat("[", 200000)).value() == 1u);
  BOOST_TEST(yaml_too_deep_line(repeat("{a: ", 200000)).value() == 1u);
  BOOST_TEST(yaml_too_deep_line(repeat("- ", 200000) + "x\n").value() == 1u);
  BOOST_TEST(yaml_too_deep_line(block_maps(200)).value() == static_cast<size_t>(kMaxYamlNesting + 1));
  // A flow collection opened in a nested block.
  BOOST_TEST(yaml_too_deep_line(block_maps(40).substr(0, block_maps(40).size() - 5) + repeat("[", 30)).has_value());
}

BOOST_AUTO_TEST_CASE(yaml_count_is_no_less_than_the_nesting) {
  // Exactly kMaxYamlNesting + 1 collections deep in each style: each refused.
  const int n = kMaxYamlNesting + 1;
  BOOST_TEST(yaml_too_deep_line(block_maps(n)).has_value());
  BOOST_TEST(yaml_too_deep_line(repeat("[", n) + repeat("]", n)).has_value());
  BOOST_TEST(yaml_too_deep_line(repeat("[a: ", n) + "b" + repeat("]", n)).has_value());  // 2n: one-pair maps
  BOOST_TEST(yaml_too_deep_line(repeat("- ", n) + "x").has_value());
  std::string seqs;  // "- " at its parent key's indentation is inside that key
  for (int i = 0; i < n; ++i) seqs += std::string(2 * i, ' ') + "- k:\n";
  BOOST_TEST(yaml_too_deep_line(seqs).has_value());
  std::string same_indent = "k:\n";  // k: [ {k: [ {k: ...  with each "- " under its key's column
  for (int i = 0; i < n / 2; ++i) same_indent += std::string(2 * i, ' ') + "- k:\n";
  BOOST_TEST(yaml_too_deep_line(same_indent).has_value());
}

BOOST_AUTO_TEST_CASE(yaml_real_shapes_pass) {
  const std::string accelerate = R"(compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE # a comment [[[[
  fsdp_transformer_layer_cls_to_wrap: "[LlamaDecoderLayer"
  list:
  - a
  - [b, {c: d}]
machine_rank: 0
note: |
  [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[
  {{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{
regex: foo[0-9]+[a-z]+[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[
quoted: 'it''s [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['
)";
  BOOST_TEST(!yaml_too_deep_line(accelerate).has_value());
  // Many sibling blocks do not add up.
  std::string siblings;
  for (int i = 0; i < 1000; ++i) {
    siblings += 'k';
    siblings += std::to_string(i);
    siblings += ":\n  - a: 1\n    b: [1, 2]\n";
  }
  BOOST_TEST(!yaml_too_deep_line(siblings).has_value());
  BOOST_TEST(!yaml_too_deep_line(block_maps(kMaxYamlNesting - 1)).has_value());
}
