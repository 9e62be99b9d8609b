// Python behaviour of chat template values (chat_template_ast.h): truthiness, str() and
// repr(), ==, ordering, arithmetic, attribute/item access, slicing, str and dict methods,
// json.dumps as transformers' tojson calls it, and conversion from nlohmann::json.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/text/chat_template_ast.h"

namespace ferry::text::chat_detail {

// What one render may build: strings (and the output) up to kMaxTextBytes, values up to that
// weight (weight()), kMaxLoopSteps iterations of its loops. No chat rendering comes near;
// past them a template would exhaust memory or time, which jinja2 leaves unbounded: a
// ChatTemplateError instead.
constexpr size_t kMaxTextBytes = size_t{1} << 26;
constexpr int64_t kMaxLoopSteps = 100'000;
// The bytes of v's strings plus one per list item and dict entry (a string weighs its
// length), counted until `limit` is passed (then some value above it).
size_t weight(const Value& v, size_t limit = kMaxTextBytes);

// Values nest at most kMaxValueDepth (chat_template_ast.h): the walkers below recurse once per
// level of lists and dicts.

bool truthy(const Value& v);
std::string type_name(const Value& v);
// str(v) ("" for undefined) and repr(v). Namespaces are entered and counted as levels (a
// namespace inside itself prints <Namespace {...}>): ValueTooDeep past kMaxValueDepth.
std::string to_str(const Value& v);
std::string repr(const Value& v);
bool equal(const Value& a, const Value& b);
// Python's <, ==, > as -1/0/1 in `c`; false when the types cannot be ordered.
bool order(const Value& a, const Value& b, int& c);
// + - * / // % ** on defined values; sets `err` (Python's TypeError/ZeroDivisionError text).
Value arithmetic(const std::string& op, const Value& a, const Value& b, std::string& err);

// jinja2's getattr (attribute, then item) and getitem (item, then attribute): a missing one
// is an Undefined whose hint is jinja2's message.
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key, size_t pos);
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step, size_t pos);

// A str method (strip lstrip rstrip startswith endswith split upper lower title capitalize
// replace) or dict method (get items keys values); nullopt when `obj` has no such method.
std::optional<Value> call_method(const Value& obj, const std::string& name,
                                 const std::vector<Value>& args, std::string& err);

// json.dumps(v, ensure_ascii=False, indent=(indent < 0 ? None : indent), sort_keys=sort_keys).
std::string to_json(const Value& v, int indent, bool sort_keys, std::string& err);
// ValueTooDeep for a document nested deeper than kMaxValueDepth.
Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);

std::vector<std::string> utf8_chars(const std::string& s);
std::string strip(const std::string& s);  // str.strip(): Python's Unicode whitespace
const Value* dict_get(const Dict& d, const std::string& key);
void dict_set(Dict& d, const std::string& key, Value v);

}  // namespace ferry::text::chat_detail
