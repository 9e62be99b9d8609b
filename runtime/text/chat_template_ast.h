// Internals of chat_template.cpp: the values a template computes with, the syntax tree, and
// the lexer (chat_template_lex.cpp) and parser (chat_template_parse.cpp) that build it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/text/chat_template.h"

namespace ferry::text::chat_detail {

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, like a Python dict
using Attrs = std::map<std::string, Value>;

// How deep lists, dicts and tuples may nest inside each other in one render. Everything that
// walks a value (its destructor, repr, ==, tojson, weight()) recurses once per level, and a
// template can nest without end: {% set ns.x = [ns.x] %} in two loops of 300 built a list
// 90,000 deep and ended ferry train on SIGSEGV. jinja2 has no bound (Python's repr and
// json.dumps stop at its recursion limit, about 1000); real templates build values 1 to 3
// deep. 512 is the bound on JSON ferry reads (base/nesting_limit.h), so any record, tools or
// tokenizer_config value converts whole; 512 levels of the deepest walker fit the stack with
// ASan's frames and the renderer's 256 levels of expressions beneath them.
constexpr int kMaxValueDepth = 512;

// Thrown where a value would nest past kMaxValueDepth (the renderer adds the position).
class ValueTooDeep : public ChatTemplateError {
 public:
  ValueTooDeep();
};

// A Python value as jinja2 sees it. Lists and dicts are immutable once built (shared);
// a namespace is mutable and shared by reference, as in jinja2.
struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function };
  Kind kind = Kind::Undefined;
  bool b = false;  // Bool; List: a tuple (repr with parentheses, != a list)
  // 0 for a scalar; a list, tuple or dict: 1 + its deepest element's, never past
  // kMaxValueDepth (of_list and of_dict, the only ways to make one, throw ValueTooDeep). A
  // namespace counts 1: what it holds can change after it is put in a list, so repr, the one
  // walker that enters namespaces, counts their levels as it goes.
  uint16_t depth = 0;
  int64_t i = 0;
  double f = 0;
  std::string s;  // String; Function: its name; Undefined: the hint for the error message
  std::shared_ptr<const List> list;
  std::shared_ptr<const Dict> dict;
  std::shared_ptr<Attrs> ns;

  static Value undefined(std::string hint) {
    Value v;
    v.s = std::move(hint);
    return v;
  }
  static Value none() { return make(Kind::None); }
  static Value boolean(bool x) {
    Value v = make(Kind::Bool);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = make(Kind::Int);
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v = make(Kind::Float);
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v = make(Kind::String);
    v.s = std::move(x);
    return v;
  }
  static Value of_tuple(List x) {
    Value v = of_list(std::move(x));
    v.b = true;
    return v;
  }
  static Value of_list(List x) {
    Value v = make(Kind::List);
    v.depth = container_depth(x, [](const Value& e) { return e.depth; });
    v.list = std::make_shared<const List>(std::move(x));
    return v;
  }
  static Value of_dict(Dict x) {
    Value v = make(Kind::Dict);
    v.depth = container_depth(x, [](const auto& kv) { return kv.second.depth; });
    v.dict = std::make_shared<const Dict>(std::move(x));
    return v;
  }
  static Value function(std::string name) {
    Value v = make(Kind::Function);
    v.s = std::move(name);
    return v;
  }
  static Value make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
  bool is(Kind k) const { return kind == k; }

 private:
  template <class C, class F>
  static uint16_t container_depth(const C& items, F depth_of) {
    int d = 0;
    for (const auto& e : items) d = std::max<int>(d, depth_of(e));
    if (d + 1 > kMaxValueDepth) throw ValueTooDeep();
    return static_cast<uint16_t>(d + 1);
  }
};

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,  // value
    Name,     // name
    Attr,     // a[0].name
    Item,     // a[0][a[1]]
    Slice,    // a[0][a[1]:a[2]:a[3]], a missing bound is a Literal undefined
    Call,     // a[0](a[1..], kwargs)
    Filter,   // a[0] | name(a[1..], kwargs)
    Test,     // a[0] is [not] name(a[1..])  (negated)
    Not,
    Neg,
    Pos,
    Binary,   // a[0] name a[1]: + - * / // % ** ~
    Compare,  // a[0] ops[0] a[1] ops[1] a[2] ...: == != < > <= >= in notin
    And,
    Or,
    Cond,  // a[1] if a[0] else a[2] (a[2] may be missing)
    List,
    Tuple,
    Dict  // Dict: keys a[0], a[2], ..., values a[1], a[3], ...
  };
  Kind kind;
  size_t pos = 0;  // offset in the normalized source
  std::string name;
  Value value;
  bool negated = false;
  std::vector<ExprP> a;
  std::vector<std::pair<std::string, ExprP>> kwargs;
  std::vector<std::string> ops;
};

struct Node;
using Body = std::vector<Node>;

struct Node {
  enum class Kind { Text, Output, If, For, Set, SetAttr };
  Kind kind;
  size_t pos = 0;
  std::string text;                // Text
  ExprP expr;                      // Output, Set, SetAttr: the value; For: the sequence
  std::vector<ExprP> conds;        // If: one per branch (if, elif...); For: the filter, if any
  std::vector<Body> bodies;        // If: one per cond, then the else body; For: body, else
  std::vector<std::string> names;  // For: targets; Set: the name; SetAttr: name, attribute
};

// The lexer's output: template text, and the tokens of each {{ }} and {% %} tag.
struct Token {
  enum Kind { Name, String, Int, Float, Op, End } kind;
  std::string text;  // Name, Op; String: the unescaped value
  size_t pos;
  int64_t i = 0;
  double f = 0;
};

struct Segment {
  enum Kind { Text, Var, Block } kind;
  size_t pos;
  std::string text;
  std::vector<Token> toks;  // ended by an End token
};

struct Program {
  std::string source;  // newlines normalized, one trailing newline dropped
  std::string where;
  Body body;
};

// Splits p.source into segments (chat_template_lex.cpp); throws ChatTemplateError.
std::vector<Segment> lex_template(const Program& p);

// Parses `source` (see chat_template.h for the subset); throws ChatTemplateError.
std::unique_ptr<Program> parse_template(const std::string& source, const std::string& where);

// "where:line:column" of an offset in the normalized source.
std::string position(const Program& p, size_t pos);
std::string position(const std::string& source, const std::string& where, size_t pos);

bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);

}  // namespace ferry::text::chat_detail
