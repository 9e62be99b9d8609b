// Rendering a parsed chat template (chat_template_ast.h) with jinja2's semantics: Python
// values, truthiness, str() and ==, the default Undefined, for-loop scoping, and the
// globals and tojson filter of transformers' environment. The values' Python behaviour
// (str, repr, json.dumps) is in chat_template_value.cpp, the str and dict
// methods in chat_template_str.cpp.
#include "runtime/text/chat_template.h"

#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "base/nesting_limit.h"
#include "runtime/text/chat_template_ast.h"
#include "runtime/text/chat_template_value.h"

namespace ferry::text {

using namespace chat_detail;
using K = Value::Kind;

namespace {

class Renderer {
 public:
  Renderer(const Program& p, const std::function<std::string(const std::string&)>& strftime_now)
      : p_(p), strftime_now_(strftime_now) {}
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;
  ~Renderer() {
    for (auto& ns : namespaces_) empty(*ns);
  }

  std::map<std::string, Value> globals;

  std::string run() {
    scopes_.emplace_back();
    exec(p_.body);
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(size_t pos, const std::string& msg) const {
    throw ChatTemplateError("chat template " + position(p_, pos) + ": " + msg);
  }

  // --- statements ------------------------------------------------------------------------
  void exec(const Body& body) {
    for (const Node& n : body) exec(n);
  }

  // Values past kMaxValueDepth (chat_template_ast.h) are refused where they would be built
  // (ValueTooDeep): here and in eval() the innermost statement or expression names the place.
  void exec(const Node& n) {
    try {
      exec_node(n);
    } catch (const ValueTooDeep& e) {
      fail(n.pos, e.what());
    }
  }

  void exec_node(const Node& n) {
    switch (n.kind) {
      case Node::Kind::Text:
        out_ += n.text;
        return check_output(n.pos);
      case Node::Kind::Output:
        out_ += to_str(eval(*n.expr));
        return check_output(n.pos);
      case Node::Kind::If:
        for (size_t k = 0; k < n.conds.size(); ++k)
          if (truthy(eval(*n.conds[k]))) return exec(n.bodies[k]);
        if (n.bodies.size() > n.conds.size()) exec(n.bodies.back());
        return;
      case Node::Kind::Set:
        scopes_.back()[n.names[0]] = eval(*n.expr);
        return;
      case Node::Kind::SetAttr: {
        Value target = lookup(n.names[0]);
        if (!target.is(K::Namespace))
          fail(n.pos, "cannot assign attribute on non-namespace object '" + n.names[0] + "'");
        if (!n.names[1].empty() && n.names[1][0] == '_')
          fail(n.pos,
               "chat templates cannot store underscore-prefixed attributes on a namespace, but got "
               "'" +
                   n.names[1] + "'");
        (*target.ns)[n.names[1]] = eval(*n.expr);
        return;
      }
      case Node::Kind::For:
        return exec_for(n);
    }
  }

  // A render's limits (chat_template_value.h): loops of loops over long lists ran for ever.
  void count_step(size_t pos) {
    if (++steps_ > kMaxLoopSteps) fail(pos, std::string("the template loops more than ") + std::to_string(kMaxLoopSteps) + " times");
  }
  void check_output(size_t pos) const {
    if (out_.size() > kMaxTextBytes) fail(pos, std::string("the rendering is longer than ") + std::to_string(kMaxTextBytes) + " bytes");
  }
  void check_built(const Value& v, size_t pos) const {
    if (weight(v) > kMaxTextBytes) fail(pos, std::string("a value past ") + std::to_string(kMaxTextBytes) + " bytes");
  }

  void exec_for(const Node& n) {
    Value seq = eval(*n.expr);
    List items = iterate(seq, n.expr->pos);
    if (!n.conds.empty()) {  // {% for x in seq if cond %}: filtered before loop.* is counted
      List kept;
      for (const Value& v : items) {
        count_step(n.pos);
        scopes_.emplace_back();
        bind(n, v);
        bool ok = truthy(eval(*n.conds[0]));
        scopes_.pop_back();
        if (ok) kept.push_back(v);
      }
      items = std::move(kept);
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      count_step(n.pos);
      scopes_.emplace_back();
      Dict loop = {
          {"index0", Value::integer(k)},
          {"index", Value::integer(k + 1)},
          {"revindex0", Value::integer(len - k - 1)},
          {"revindex", Value::integer(len - k)},
          {"first", Value::boolean(k == 0)},
          {"last", Value::boolean(k == len - 1)},
          {"length", Value::integer(len)},
          {"previtem", k > 0 ? items[k - 1] : Value::undefined("there is no previous item")},
          {"nextitem", k + 1 < len ? items[k + 1] : Value::undefined("there is no next item")}};
      scopes_.back()["loop"] = Value::of_dict(std::move(loop));
      bind(n, items[k]);
      exec(n.bodies[0]);
      scopes_.pop_back();
    }
    if (len == 0 && n.bodies.size() > 1) exec(n.bodies[1]);
  }

  void bind(const Node& n, const Value& v) {
    if (n.names.size() == 1) {
      scopes_.back()[n.names[0]] = v;
      return;
    }
    List parts = iterate(v, n.pos);
    if (parts.size() > n.names.size())
      fail(n.pos, "too many values to unpack (expected " + std::to_string(n.names.size()) + ")");
    if (parts.size() < n.names.size())
      fail(n.pos, "not enough values to unpack (expected " + std::to_string(n.names.size()) +
                      ", got " + std::to_string(parts.size()) + ")");
    for (size_t k = 0; k < parts.size(); ++k) scopes_.back()[n.names[k]] = parts[k];
  }

  Value lookup(const std::string& name) const {
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s) {
      auto it = s->find(name);
      if (it != s->end()) return it->second;
    }
    auto g = globals.find(name);
    if (g != globals.end()) return g->second;
    if (name == "raise_exception" || name == "strftime_now" || name == "namespace" ||
        name == "dict")
      return Value::function(name);
    return Value::undefined("'" + name + "' is undefined");
  }

  // --- expressions -----------------------------------------------------------------------
  List iterate(const Value& v, size_t pos) const {
    switch (v.kind) {
      case K::Undefined:
        return {};
      case K::List:
        return *v.list;
      case K::Dict: {
        List keys;
        for (const auto& [k, _] : *v.dict) keys.push_back(Value::string(k));
        return keys;
      }
      case K::String: {
        List chars;
        for (const std::string& c : utf8_chars(v.s)) chars.push_back(Value::string(c));
        return chars;
      }
      default:
        fail(pos, "'" + type_name(v) + "' object is not iterable");
    }
  }

  // Raises jinja2's UndefinedError for an undefined value used beyond printing and testing.
  const Value& defined(const Value& v, size_t pos) const {
    if (v.is(K::Undefined)) fail(pos, v.s);
    return v;
  }

  Value eval(const Expr& e) {
    try {
      return eval_expr(e);
    } catch (const ValueTooDeep& x) {
      fail(e.pos, x.what());
    }
  }

  Value eval_expr(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::Literal:
        return e.value;
      case Expr::Kind::Name:
        return lookup(e.name);
      case Expr::Kind::Attr:
        return get_attr(defined(eval(*e.a[0]), e.pos), e.name);
      case Expr::Kind::Item: {
        Value obj = eval(*e.a[0]);
        defined(obj, e.pos);
        return get_item(obj, eval(*e.a[1]), e.pos);
      }
      case Expr::Kind::Slice: {
        Value obj = eval(*e.a[0]);
        defined(obj, e.pos);
        return slice(obj, eval(*e.a[1]), eval(*e.a[2]), eval(*e.a[3]), e.pos);
      }
      case Expr::Kind::Call:
        return call(e);
      case Expr::Kind::Filter:
        return filter(e);
      case Expr::Kind::Test:
        return Value::boolean(test(e) != e.negated);
      case Expr::Kind::Not:
        return Value::boolean(!truthy(eval(*e.a[0])));
      case Expr::Kind::Neg:
      case Expr::Kind::Pos: {
        Value v = defined(eval(*e.a[0]), e.pos);
        if (v.is(K::Bool)) v = Value::integer(v.b);
        if (v.is(K::Int) && e.kind == Expr::Kind::Neg && v.i == INT64_MIN) {
          fail(e.pos, std::string("integer overflow: -(") + std::to_string(v.i) + ") does not fit 64 bits");
        }
        if (v.is(K::Int)) return Value::integer(e.kind == Expr::Kind::Neg ? -v.i : v.i);
        if (v.is(K::Float)) return Value::real(e.kind == Expr::Kind::Neg ? -v.f : v.f);
        fail(e.pos, "bad operand type for unary " +
                        std::string(e.kind == Expr::Kind::Neg ? "-" : "+") + ": '" + type_name(v) +
                        "'");
      }
      case Expr::Kind::Binary: {
        Value l = eval(*e.a[0]), r = eval(*e.a[1]);
        Value v;
        if (e.name == "~") {
          v = Value::string(to_str(l) + to_str(r));
        } else {
          defined(l, e.pos);
          defined(r, e.pos);
          std::string err;
          v = arithmetic(e.name, l, r, err);
          if (!err.empty()) fail(e.pos, err);
        }
        check_built(v, e.pos);  // concatenations doubling in a loop grew without bound
        return v;
      }
      case Expr::Kind::Compare: {
        Value l = eval(*e.a[0]);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value r = eval(*e.a[k + 1]);
          if (!compare(e.ops[k], l, r, e.pos)) return Value::boolean(false);
          l = std::move(r);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::And: {
        Value l = eval(*e.a[0]);
        return truthy(l) ? eval(*e.a[1]) : l;
      }
      case Expr::Kind::Or: {
        Value l = eval(*e.a[0]);
        return truthy(l) ? l : eval(*e.a[1]);
      }
      case Expr::Kind::Cond:
        if (truthy(eval(*e.a[0]))) return eval(*e.a[1]);
        return e.a.size() > 2 ? eval(*e.a[2])
                              : Value::undefined("the inline if expression evaluated to false");
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        List l;
        for (const auto& x : e.a) l.push_back(eval(*x));
        return e.kind == Expr::Kind::Tuple ? Value::of_tuple(std::move(l))
                                           : Value::of_list(std::move(l));
      }
      case Expr::Kind::Dict: {
        Dict d;
        for (size_t k = 0; k + 1 < e.a.size(); k += 2) {
          Value key = eval(*e.a[k]);
          if (!key.is(K::String))
            fail(e.a[k]->pos, "dict keys other than strings are not supported");
          dict_set(d, key.s, eval(*e.a[k + 1]));
        }
        return Value::of_dict(std::move(d));
      }
    }
    fail(e.pos, "unknown expression");
  }

  bool compare(const std::string& op, const Value& l, const Value& r, size_t pos) const {
    if (op == "==") return equal(l, r);
    if (op == "!=") return !equal(l, r);
    if (op == "in" || op == "notin") {
      bool found = false;
      switch (r.kind) {
        case K::Undefined:
          found = false;
          break;
        case K::String:
          if (!l.is(K::String))
            fail(pos, "'in <string>' requires string as left operand, not " + type_name(l));
          found = r.s.find(l.s) != std::string::npos;
          break;
        case K::List:
          for (const Value& x : *r.list) found = found || equal(l, x);
          break;
        case K::Dict:
          found = l.is(K::String) && dict_get(*r.dict, l.s) != nullptr;
          break;
        default:
          fail(pos, "argument of type '" + type_name(r) + "' is not iterable");
      }
      return (op == "in") == found;
    }
    defined(l, pos);
    defined(r, pos);
    int c = 0;
    if (!order(l, r, c))
      fail(pos, "'" + op + "' not supported between instances of '" + type_name(l) + "' and '" +
                    type_name(r) + "'");
    if (op == "<") return c < 0;
    if (op == ">") return c > 0;
    if (op == "<=") return c <= 0;
    return c >= 0;
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.a[0];
    std::vector<Value> args;
    for (size_t k = 1; k < e.a.size(); ++k) args.push_back(eval(*e.a[k]));
    std::vector<std::pair<std::string, Value>> kwargs;
    for (const auto& [k, v] : e.kwargs) kwargs.emplace_back(k, eval(*v));
    if (callee.kind == Expr::Kind::Attr) {  // a method of a str or a dict
      Value obj = defined(eval(*callee.a[0]), callee.pos);
      if ((obj.is(K::String) || obj.is(K::Dict)) && kwargs.empty()) {
        std::string err;
        std::optional<Value> r = call_method(obj, callee.name, args, err);
        if (!err.empty()) fail(callee.pos, err);
        if (r) return *r;
      }
      Value f = get_attr(obj, callee.name);
      if (!f.is(K::Function)) {
        if (f.is(K::Undefined))
          fail(callee.pos,
               "'" + type_name(obj) + " object' has no attribute '" + callee.name + "'");
        fail(e.pos, "'" + type_name(f) + "' object is not callable");
      }
    }
    Value f = eval(callee);
    defined(f, callee.pos);
    if (!f.is(K::Function)) fail(e.pos, "'" + type_name(f) + "' object is not callable");
    if (f.s == "raise_exception") {
      std::string msg = args.empty() ? "" : to_str(args[0]);
      throw ChatTemplateError("chat template " + position(p_, e.pos) + ": raise_exception: " + msg,
                              msg);
    }
    if (f.s == "strftime_now") {
      if (args.size() != 1 || !args[0].is(K::String))
        fail(e.pos, "strftime_now(format) takes one string");
      return Value::string(strftime_now_(args[0].s));
    }
    if (f.s == "namespace" || f.s == "dict") {
      Dict d;
      if (!args.empty()) {
        if (args.size() > 1 || !args[0].is(K::Dict))
          fail(e.pos, f.s + "() takes at most one dict argument");
        d = *args[0].dict;
      }
      for (auto& [k, v] : kwargs) dict_set(d, k, v);
      if (f.s == "dict") return Value::of_dict(std::move(d));
      Value ns = Value::make(K::Namespace);
      ns.depth = 1;
      ns.ns = std::make_shared<Attrs>();
      track(ns.ns);
      for (auto& [k, v] : d) {
        if (!k.empty() && k[0] == '_')
          fail(e.pos,
               "chat templates cannot store underscore-prefixed attributes on a namespace, but got "
               "'" +
                   k + "'");
        (*ns.ns)[k] = v;
      }
      return ns;
    }
    fail(e.pos, "'" + f.s + "' is not callable");
  }

  Value filter(const Expr& e) {
    Value v = eval(*e.a[0]);
    std::vector<Value> args;
    for (size_t k = 1; k < e.a.size(); ++k) args.push_back(eval(*e.a[k]));
    std::map<std::string, Value> kw;
    for (const auto& [k, x] : e.kwargs) kw[k] = eval(*x);
    const std::string& f = e.name;
    auto arg = [&](size_t k, const char* name) -> const Value* {
      if (k < args.size()) return &args[k];
      auto it = kw.find(name);
      return it == kw.end() ? nullptr : &it->second;
    };
    if (f == "default" || f == "d") {
      const Value* b = arg(1, "boolean");
      bool use = v.is(K::Undefined) || (b && truthy(*b) && !truthy(v));
      const Value* dv = arg(0, "default_value");
      return use ? (dv ? *dv : Value::string("")) : v;
    }
    if (f == "tojson") {
      const Value* indent = arg(0, "indent");
      const Value* sort = arg(3, "sort_keys");
      for (const auto& [k, _] : kw)
        if (k != "indent" && k != "sort_keys" && k != "ensure_ascii")
          fail(e.pos, "tojson: unsupported argument '" + k + "'");
      if (const Value* ea = arg(1, "ensure_ascii"); ea && truthy(*ea))
        fail(e.pos, "tojson: ensure_ascii=True is not supported");
      if (indent && !indent->is(K::None) && !indent->is(K::Int))
        fail(e.pos, "tojson: indent must be an int");
      if (indent && indent->is(K::Int) && indent->i > 1024) fail(e.pos, std::string("tojson: indent ") + std::to_string(indent->i) + " is past 1024");
      std::string err;
      std::string s = to_json(v, indent && indent->is(K::Int) ? static_cast<int>(indent->i) : -1,
                              sort && truthy(*sort), err);
      if (!err.empty()) fail(e.pos, err);
      return Value::string(s);
    }
    if (f == "length" || f == "count") {
      switch (v.kind) {
        case K::Undefined:
          return Value::integer(0);
        case K::String:
          return Value::integer(static_cast<int64_t>(utf8_chars(v.s).size()));
        case K::List:
          return Value::integer(static_cast<int64_t>(v.list->size()));
        case K::Dict:
          return Value::integer(static_cast<int64_t>(v.dict->size()));
        default:
          fail(e.pos, "object of type '" + type_name(v) + "' has no len()");
      }
    }
    if (f == "safe") return v;
    if (f == "string") return Value::string(to_str(v));
    if (f == "trim" || f == "upper" || f == "lower" || f == "capitalize" || f == "title" ||
        f == "replace") {
      std::string s = to_str(v), err;
      std::optional<Value> r = call_method(Value::string(s), f == "trim" ? "strip" : f, args, err);
      if (!err.empty()) fail(e.pos, f + ": " + err);
      return *r;
    }
    if (f == "int") {
      if (v.is(K::Int)) return v;
      if (v.is(K::Bool)) return Value::integer(v.b);
      if (v.is(K::Float)) {
        // Python's int() of a float: NaN raises ValueError, which the filter turns into its
        // default; past 64 bits (inf too) ferry cannot hold it (converting was undefined).
        if (std::isnan(v.f)) return args.empty() ? Value::integer(0) : args[0];
        if (!(v.f >= -0x1p63 && v.f < 0x1p63)) fail(e.pos, std::string("int: ") + repr(v) + " does not fit 64 bits");
        return Value::integer(static_cast<int64_t>(v.f));
      }
      if (v.is(K::String)) {
        try {
          size_t used = 0;
          int64_t x = std::stoll(strip(v.s), &used);
          if (used == strip(v.s).size()) return Value::integer(x);
        } catch (const std::exception&) {
        }
      }
      return args.empty() ? Value::integer(0) : args[0];
    }
    if (f == "abs") {
      defined(v, e.pos);
      if (v.is(K::Int) && v.i == INT64_MIN) fail(e.pos, std::string("integer overflow: abs(") + std::to_string(v.i) + ") does not fit 64 bits");
      if (v.is(K::Int) || v.is(K::Bool))
        return Value::integer(std::abs(v.is(K::Bool) ? int64_t(v.b) : v.i));
      if (v.is(K::Float)) return Value::real(std::abs(v.f));
      fail(e.pos, "bad operand type for abs(): '" + type_name(v) + "'");
    }
    List items = iterate(v, e.pos);
    if (f == "list") return Value::of_list(std::move(items));
    if (f == "map") {
      auto at = kw.find("attribute");
      if (!args.empty() || kw.size() != 1 || at == kw.end() || !at->second.is(K::String))
        fail(e.pos, "map: only map(attribute='name') is supported");
      List out;
      for (const Value& x : items) out.push_back(get_attr(x, at->second.s));
      return Value::of_list(std::move(out));
    }
    if (f == "first" || f == "last") {
      if (items.empty()) return Value::undefined("No first item, sequence was empty.");
      return f == "first" ? items.front() : items.back();
    }
    if (f == "join") {
      std::string sep = args.empty() ? "" : to_str(args[0]), s;
      for (size_t k = 0; k < items.size(); ++k) {
        s += (k ? sep : "") + to_str(items[k]);
        if (s.size() > kMaxTextBytes) fail(e.pos, std::string("join: the result is longer than ") + std::to_string(kMaxTextBytes) + " bytes");
      }
      return Value::string(s);
    }
    if (f == "items") {
      if (v.is(K::Undefined)) return Value::of_list({});
      if (!v.is(K::Dict)) fail(e.pos, "items: can only get item pairs from a mapping");
      List pairs;
      for (const auto& [k, x] : *v.dict) pairs.push_back(Value::of_tuple({Value::string(k), x}));
      return Value::of_list(std::move(pairs));
    }
    if (f == "selectattr" || f == "rejectattr") {
      if (args.empty() || !args[0].is(K::String))
        fail(e.pos, f + ": an attribute name is required");
      if (args.size() > 1 && (!args[1].is(K::String) || !is_known_test(args[1].s)))
        fail(e.pos, f + ": unsupported test " + to_str(args[1]));
      List kept;
      for (const Value& x : items) {
        Value a = get_attr(x, args[0].s);
        bool hit =
            args.size() > 1
                ? run_test(args[1].s, a, std::vector<Value>(args.begin() + 2, args.end()), e.pos)
                : truthy(a);
        if (hit == (f == "selectattr")) kept.push_back(x);
      }
      return Value::of_list(std::move(kept));
    }
    if (f == "select" || f == "reject") {
      if (args.empty()) fail(e.pos, f + ": a test name is required");
      if (!args[0].is(K::String) || !is_known_test(args[0].s))
        fail(e.pos, f + ": unsupported test " + to_str(args[0]));
      List kept;
      for (const Value& x : items) {
        std::vector<Value> targs(args.begin() + 1, args.end());
        if (run_test(args[0].s, x, targs, e.pos) == (f == "select")) kept.push_back(x);
      }
      return Value::of_list(std::move(kept));
    }
    fail(e.pos, "unsupported filter '" + f + "'");
  }

  bool test(const Expr& e) {
    Value v = eval(*e.a[0]);
    std::vector<Value> args;
    for (size_t k = 1; k < e.a.size(); ++k) args.push_back(eval(*e.a[k]));
    return run_test(e.name, v, args, e.pos);
  }

  bool run_test(const std::string& t, const Value& v, const std::vector<Value>& args,
                size_t pos) const {
    auto need = [&](size_t n) {
      if (args.size() != n)
        fail(pos, "test '" + t + "' takes " + std::to_string(n) + " argument(s)");
    };
    if (t == "defined") return !v.is(K::Undefined);
    if (t == "undefined") return v.is(K::Undefined);
    if (t == "none") return v.is(K::None);
    if (t == "string") return v.is(K::String);
    if (t == "number") return v.is(K::Int) || v.is(K::Float) || v.is(K::Bool);
    if (t == "integer") return v.is(K::Int);
    if (t == "float") return v.is(K::Float);
    if (t == "boolean") return v.is(K::Bool);
    if (t == "true") return v.is(K::Bool) && v.b;
    if (t == "false") return v.is(K::Bool) && !v.b;
    if (t == "mapping") return v.is(K::Dict);
    if (t == "iterable")
      return v.is(K::String) || v.is(K::List) || v.is(K::Dict) || v.is(K::Undefined);
    if (t == "sequence") return v.is(K::String) || v.is(K::List) || v.is(K::Dict);
    if (t == "equalto" || t == "eq" || t == "==") return need(1), equal(v, args[0]);
    if (t == "ne" || t == "!=") return need(1), !equal(v, args[0]);
    if (t == "lower" || t == "upper") {
      if (!v.is(K::String)) return false;
      std::string err;
      return equal(*call_method(v, t, {}, err), v);
    }
    defined(v, pos);
    if (t == "odd" || t == "even" || t == "divisibleby") {
      int64_t d = 2;
      if (t == "divisibleby") {
        need(1);
        if (!args[0].is(K::Int) || args[0].i == 0) fail(pos, "divisibleby needs a nonzero int");
        d = args[0].i;
      }
      if (!v.is(K::Int) && !v.is(K::Bool)) fail(pos, "test '" + t + "' needs an int");
      int64_t x = v.is(K::Bool) ? v.b : v.i;
      int64_t m = ((x % d) + d) % d;
      return t == "odd" ? m == 1 : m == 0;
    }
    fail(pos, "unsupported test '" + t + "'");
  }

  // Namespaces can hold each other: a chain made in a loop ({% set h.n = namespace(n=h.n) %})
  // would be destroyed one recursion per link, and a cycle ({% set ns.x = [ns] %}) never. The
  // renderer holds every namespace it made and empties them itself, one at a time: emptying one
  // destroys values at most kMaxValueDepth deep and lets go of namespaces still held here.
  // Those nothing else holds any more are emptied and let go when the count doubles, so what is
  // held stays what the template can still reach (and its cycles, until the render ends).
  void track(std::shared_ptr<Attrs> ns) {
    if (namespaces_.size() >= prune_at_) {
      std::erase_if(namespaces_, [](std::shared_ptr<Attrs>& x) {
        if (x.use_count() > 1) return false;
        empty(*x);
        return true;
      });
      prune_at_ = 2 * namespaces_.size() + 64;
    }
    namespaces_.push_back(std::move(ns));
  }
  static void empty(Attrs& attrs) {
    Attrs gone;
    gone.swap(attrs);  // destroyed here, while `attrs` is already empty
  }

  const Program& p_;
  const std::function<std::string(const std::string&)>& strftime_now_;
  std::vector<std::shared_ptr<Attrs>> namespaces_;  // every namespace made by this render
  size_t prune_at_ = 64;
  std::vector<std::map<std::string, Value>> scopes_;
  std::string out_;
  int64_t steps_ = 0;  // loop iterations so far
};

std::string default_strftime_now(const std::string& format) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[256];
  size_t n = std::strftime(buf, sizeof buf, format.c_str(), &tm);
  return std::string(buf, n);
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, std::string where)
    : source_(std::move(source)),
      where_(std::move(where)),
      program_(parse_template(source_, where_)),
      strftime_now_(default_strftime_now) {}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

void ChatTemplate::set_strftime_now(std::function<std::string(const std::string&)> fn) {
  strftime_now_ = std::move(fn);
}

const std::string& ChatTemplate::source() const {
  return source_;
}
const std::string& ChatTemplate::where() const {
  return where_;
}

namespace {

template <class J>
std::string render_with(const Program& p,
                        const std::function<std::string(const std::string&)>& strftime_now,
                        const std::string& where, const J& messages, bool add_generation_prompt,
                        const J& extra) {
  if (!extra.is_object())
    throw ChatTemplateError("chat template " + where + ": render: extra must be a JSON object");
  Renderer r(p, strftime_now);
  auto convert = [&](const std::string& name, const J& v) {
    try {
      return from_json(v);
    } catch (const ValueTooDeep& e) {
      throw ChatTemplateError("chat template " + where + ": render: " + name + ": " + e.what());
    }
  };
  r.globals["messages"] = convert("messages", messages);
  r.globals["tools"] = Value::none();
  r.globals["documents"] = Value::none();
  r.globals["add_generation_prompt"] = Value::boolean(add_generation_prompt);
  for (const auto& [k, v] : extra.items()) r.globals[k] = convert(k, v);
  return r.run();
}

}  // namespace

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                 const nlohmann::json& extra) const {
  return render_with(*program_, strftime_now_, where_, messages, add_generation_prompt, extra);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra) const {
  return render_with(*program_, strftime_now_, where_, messages, add_generation_prompt, extra);
}

std::optional<ChatTemplate> ChatTemplate::from_tokenizer_config(const std::string& path,
                                                                const std::string& name) {
  std::ifstream in(path);
  if (!in) throw ChatTemplateError(path + ": cannot read the tokenizer config");
  nlohmann::json config;
  try {
    config = base::parse_json<ChatTemplateError>(in, path);
  } catch (const ChatTemplateError&) {
    throw;  // nested too deep: the message names the file already
  } catch (const std::exception& e) {
    throw ChatTemplateError(path + ": not JSON: " + e.what());
  }
  if (!config.is_object() || !config.contains("chat_template") || config["chat_template"].is_null())
    return std::nullopt;
  const nlohmann::json& ct = config["chat_template"];
  if (ct.is_string()) {
    if (!name.empty() && name != "default") return std::nullopt;
    return ChatTemplate(ct.get<std::string>(), path + ": chat_template");
  }
  if (!ct.is_array())
    throw ChatTemplateError(path + ": chat_template is neither a string nor a list");
  const std::string want = name.empty() ? "default" : name;
  for (size_t k = 0; k < ct.size(); ++k) {
    const nlohmann::json& e = ct[k];
    if (!e.is_object() || !e.contains("name") || !e.contains("template") ||
        !e["name"].is_string() || !e["template"].is_string())
      throw ChatTemplateError(path + ": chat_template[" + std::to_string(k) +
                              "] is not a {\"name\", \"template\"}");
    if (e["name"] == want)
      return ChatTemplate(e["template"].get<std::string>(),
                          path + ": chat_template \"" + want + "\"");
  }
  return std::nullopt;
}

}  // namespace ferry::text
