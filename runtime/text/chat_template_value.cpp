// Python semantics of chat template values; see chat_template_value.h. The str and dict
// methods are in chat_template_str.cpp.
#include "runtime/text/chat_template_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace ferry::text::chat_detail {

using K = Value::Kind;

namespace {

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t epos = sci.find('e');
  int exp = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (size_t k = 0; k < epos; ++k)
    if (sci[k] != '.') digits += sci[k];
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      std::string ip = digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
      while (ip.size() < static_cast<size_t>(exp + 1)) ip += '0';
      std::string fp = digits.size() > static_cast<size_t>(exp + 1) ? digits.substr(exp + 1) : "0";
      out = ip + "." + fp;
    } else {
      out = "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e;
  }
  return neg ? "-" + out : out;
}

std::string str_repr(const std::string& s) {
  char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\' || c == static_cast<unsigned char>(q)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + q;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

void dump(const Value& v, int indent, bool sort_keys, int level, std::string& out,
          std::string& err) {
  if (!err.empty()) return;
  auto newline = [&](int l) {
    if (indent >= 0) out += "\n" + std::string(static_cast<size_t>(indent) * l, ' ');
  };
  const char* item_sep = indent >= 0 ? "," : ", ";
  switch (v.kind) {
    case K::None:
      out += "null";
      return;
    case K::Bool:
      out += v.b ? "true" : "false";
      return;
    case K::Int:
      out += std::to_string(v.i);
      return;
    case K::Float:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f > 0 ? "Infinity" : "-Infinity";
      else
        out += float_repr(v.f);
      return;
    case K::String:
      out += json_string(v.s);
      return;
    case K::List:
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        newline(level + 1);
        dump((*v.list)[k], indent, sort_keys, level + 1, out, err);
      }
      newline(level);
      out += "]";
      return;
    case K::Dict: {
      if (v.dict->empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : *v.dict) items.push_back(&kv);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      out += "{";
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        newline(level + 1);
        out += json_string(items[k]->first) + ": ";
        dump(items[k]->second, indent, sort_keys, level + 1, out, err);
      }
      newline(level);
      out += "}";
      return;
    }
    default:
      err = "Object of type " + type_name(v) + " is not JSON serializable";
  }
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

bool is_num(const Value& v) {
  return v.is(K::Int) || v.is(K::Float) || v.is(K::Bool);
}
double as_double(const Value& v) {
  return v.is(K::Float) ? v.f : v.is(K::Bool) ? v.b : static_cast<double>(v.i);
}
int64_t as_int(const Value& v) {
  return v.is(K::Bool) ? v.b : v.i;
}

// Python's index normalization for slices.
void slice_bounds(int64_t len, const Value& start, const Value& stop, int64_t step, int64_t& b,
                  int64_t& e) {
  auto norm = [&](const Value& v, int64_t dflt, bool is_start) {
    if (!v.is(K::Int)) return dflt;
    int64_t x = v.i;
    if (x < 0) x += len;
    if (step > 0) return std::clamp<int64_t>(x, 0, len);
    (void)is_start;
    return std::clamp<int64_t>(x, -1, len - 1);
  };
  b = norm(start, step > 0 ? 0 : len - 1, true);
  e = norm(stop, step > 0 ? len : -1, false);
}

}  // namespace

const Value* dict_get(const Dict& d, const std::string& key) {
  for (const auto& [k, v] : d)
    if (k == key) return &v;
  return nullptr;
}

void dict_set(Dict& d, const std::string& key, Value v) {
  for (auto& [k, x] : d)
    if (k == key) {
      x = std::move(v);
      return;
    }
  d.emplace_back(key, std::move(v));
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case K::Undefined:
    case K::None:
      return false;
    case K::Bool:
      return v.b;
    case K::Int:
      return v.i != 0;
    case K::Float:
      return v.f != 0;
    case K::String:
      return !v.s.empty();
    case K::List:
      return !v.list->empty();
    case K::Dict:
      return !v.dict->empty();
    default:
      return true;
  }
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case K::Undefined:
      return "Undefined";
    case K::None:
      return "NoneType";
    case K::Bool:
      return "bool";
    case K::Int:
      return "int";
    case K::Float:
      return "float";
    case K::String:
      return "str";
    case K::List:
      return "list";
    case K::Dict:
      return "dict";
    case K::Namespace:
      return "Namespace";
    case K::Function:
      return "function";
  }
  return "?";
}

ValueTooDeep::ValueTooDeep()
    : ChatTemplateError(
          "a value nested deeper than " + std::to_string(kMaxValueDepth) +
          " levels (lists, dicts, tuples and namespaces inside each other; ferry's bound)") {}

namespace {

// repr() and str() of a value. Lists and dicts are at most kMaxValueDepth deep, but a namespace
// can hold a list holding a namespace ... (a chain made in a loop), or itself (ns.x = [ns]):
// levels are counted through namespaces too, and a namespace met again inside itself prints
// as Python prints a dict it is already printing, <Namespace {...}>.
struct Printer {
  std::vector<const Attrs*> open;  // namespaces being printed, outermost first
  int level = 0;

  void str(const Value& v, std::string& out) {
    switch (v.kind) {
      case K::Undefined:
        return;
      case K::None:
        out += "None";
        return;
      case K::Bool:
        out += v.b ? "True" : "False";
        return;
      case K::Int:
        out += std::to_string(v.i);
        return;
      case K::Float:
        out += float_repr(v.f);
        return;
      case K::String:
        out += v.s;
        return;
      case K::List:
      case K::Dict:
        return repr(v, out);
      case K::Namespace: {
        out += "<Namespace {";
        if (std::find(open.begin(), open.end(), v.ns.get()) != open.end()) {
          out += "...}>";
          return;
        }
        enter();
        open.push_back(v.ns.get());
        bool first = true;
        for (const auto& [k, x] : *v.ns) {
          out += first ? "" : ", ";
          out += str_repr(k) + ": ";
          repr(x, out);
          first = false;
        }
        open.pop_back();
        --level;
        out += "}>";
        return;
      }
      case K::Function:
        out += "<function " + v.s + ">";
        return;
    }
  }

  void repr(const Value& v, std::string& out) {
    switch (v.kind) {
      case K::String:
        out += str_repr(v.s);
        return;
      case K::List:
        enter();
        out += v.b ? "(" : "[";
        for (size_t k = 0; k < v.list->size(); ++k) {
          if (k) out += ", ";
          repr((*v.list)[k], out);
        }
        if (v.b && v.list->size() == 1) out += ",";
        out += v.b ? ")" : "]";
        --level;
        return;
      case K::Dict:
        enter();
        out += "{";
        for (size_t k = 0; k < v.dict->size(); ++k) {
          if (k) out += ", ";
          out += str_repr((*v.dict)[k].first) + ": ";
          repr((*v.dict)[k].second, out);
        }
        out += "}";
        --level;
        return;
      default:
        return str(v, out);
    }
  }

  void enter() {
    if (++level > kMaxValueDepth) throw ValueTooDeep();
  }
};

}  // namespace

std::string repr(const Value& v) {
  std::string out;
  Printer().repr(v, out);
  return out;
}

std::string to_str(const Value& v) {
  std::string out;
  Printer().str(v, out);
  return out;
}

bool equal(const Value& a, const Value& b) {
  if (is_num(a) && is_num(b)) {
    if (a.is(K::Float) || b.is(K::Float)) return as_double(a) == as_double(b);
    return as_int(a) == as_int(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::Undefined:
    case K::None:
      return true;
    case K::String:
    case K::Function:
      return a.s == b.s;
    case K::List:
      if (a.b != b.b || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case K::Dict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, x] : *a.dict) {
        const Value* y = dict_get(*b.dict, k);
        if (!y || !equal(x, *y)) return false;
      }
      return true;
    case K::Namespace:
      return a.ns == b.ns;
    default:
      return false;
  }
}

bool order(const Value& a, const Value& b, int& c) {
  if (is_num(a) && is_num(b)) {
    double x = as_double(a), y = as_double(b);
    if (!a.is(K::Float) && !b.is(K::Float)) {
      int64_t p = as_int(a), q = as_int(b);
      c = p < q ? -1 : p > q ? 1 : 0;
    } else {
      c = x < y ? -1 : x > y ? 1 : 0;
    }
    return true;
  }
  if (a.is(K::String) && b.is(K::String)) {
    int r = a.s.compare(b.s);
    c = r < 0 ? -1 : r > 0 ? 1 : 0;
    return true;
  }
  if (a.is(K::List) && b.is(K::List) && a.b == b.b) {
    for (size_t k = 0; k < a.list->size() && k < b.list->size(); ++k) {
      if (equal((*a.list)[k], (*b.list)[k])) continue;
      return order((*a.list)[k], (*b.list)[k], c);
    }
    c = a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
    return true;
  }
  return false;
}

size_t weight(const Value& v, size_t limit) {
  if (v.is(K::String)) return v.s.size();
  size_t w = 0;
  if (v.is(K::List)) {
    for (auto it = v.list->begin(); it != v.list->end() && w <= limit; ++it) w += 1 + weight(*it, limit - w);
  } else if (v.is(K::Dict)) {
    for (auto it = v.dict->begin(); it != v.dict->end() && w <= limit; ++it) {
      w += 1 + it->first.size() + weight(it->second, limit - w);
    }
  }
  return w;
}

// Python's integers have no bound; ferry's are 64-bit: a result past them is refused (the
// wrapped value was undefined behaviour). A repetition past kMaxTextBytes is refused too.
Value arithmetic(const std::string& op, const Value& a, const Value& b, std::string& err) {
  auto overflow = [&] {
    err = std::string("integer overflow: ") + repr(a) + " " + op + " " + repr(b) + " does not fit 64 bits";
    return Value();
  };
  auto bad = [&] {
    err = "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
          type_name(b) + "'";
    return Value();
  };
  if (is_num(a) && is_num(b)) {
    bool fl = a.is(K::Float) || b.is(K::Float);
    if (op == "/") {
      if (as_double(b) == 0) return err = "division by zero", Value();
      return Value::real(as_double(a) / as_double(b));
    }
    if (op == "**") {
      if (!fl && as_int(b) >= 0) {
        // Square and multiply: at most 63 rounds (a loop of b multiplications ran for ever
        // on 1 ** 10**18).
        int64_t base = as_int(a), r = 1;
        for (int64_t e = as_int(b);; e >>= 1) {
          if ((e & 1) && __builtin_mul_overflow(r, base, &r)) return overflow();
          if (e <= 1) break;
          if (__builtin_mul_overflow(base, base, &base)) return overflow();  // a bit remains: r would overflow too
        }
        return Value::integer(r);
      }
      return Value::real(std::pow(as_double(a), as_double(b)));
    }
    if (fl) {
      double x = as_double(a), y = as_double(b);
      if (op == "+") return Value::real(x + y);
      if (op == "-") return Value::real(x - y);
      if (op == "*") return Value::real(x * y);
      if (y == 0) return err = "float division by zero", Value();
      if (op == "//") return Value::real(std::floor(x / y));
      if (op == "%") return Value::real(x - y * std::floor(x / y));
      return bad();
    }
    int64_t x = as_int(a), y = as_int(b), r = 0;
    if (op == "+") return __builtin_add_overflow(x, y, &r) ? overflow() : Value::integer(r);
    if (op == "-") return __builtin_sub_overflow(x, y, &r) ? overflow() : Value::integer(r);
    if (op == "*") return __builtin_mul_overflow(x, y, &r) ? overflow() : Value::integer(r);
    if (y == 0) return err = "integer division or modulo by zero", Value();
    if (y == -1 && (op == "//" || op == "%")) {
      return op == "%" ? Value::integer(0) : x == INT64_MIN ? overflow() : Value::integer(-x);
    }
    if (op == "//") return Value::integer(floor_div(x, y));
    if (op == "%") {  // the sign of y, as Python's; x - y * (x // y) overflowed in between
      const int64_t m = x % y;
      return Value::integer(m != 0 && (m < 0) != (y < 0) ? m + y : m);
    }
    return bad();
  }
  if (op == "+" && a.is(K::String) && b.is(K::String)) return Value::string(a.s + b.s);
  if (op == "+" && a.is(K::List) && b.is(K::List)) {
    List l = *a.list;
    l.insert(l.end(), b.list->begin(), b.list->end());
    return Value::of_list(std::move(l));
  }
  if (op == "*" && (a.is(K::String) || a.is(K::List)) && (b.is(K::Int) || b.is(K::Bool))) {
    int64_t n = as_int(b);
    if (a.is(K::String) ? a.s.empty() : a.list->empty()) n = 0;  // empty whatever n: no loop of n rounds
    if (n > 0 && static_cast<uint64_t>(n) > kMaxTextBytes / weight(a)) {
      err = std::string("repetition by ") + std::to_string(n) + " builds a value past " + std::to_string(kMaxTextBytes) +
            " bytes";
      return Value();
    }
    if (a.is(K::String)) {
      std::string s;
      for (int64_t k = 0; k < n; ++k) s += a.s;
      return Value::string(s);
    }
    List l;
    for (int64_t k = 0; k < n; ++k) l.insert(l.end(), a.list->begin(), a.list->end());
    return Value::of_list(std::move(l));
  }
  if (op == "%" && a.is(K::String)) {
    err = "unsupported construct: printf-style string formatting with '%'";
    return Value();
  }
  return bad();
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is(K::Namespace)) {
    auto it = obj.ns->find(name);
    if (it != obj.ns->end()) return it->second;
  } else if (obj.is(K::Dict)) {
    if (const Value* v = dict_get(*obj.dict, name)) return *v;
  }
  return Value::undefined("'" + type_name(obj) + " object' has no attribute '" + name + "'");
}

Value get_item(const Value& obj, const Value& key, size_t) {
  if ((obj.is(K::List) || obj.is(K::String)) && (key.is(K::Int) || key.is(K::Bool))) {
    int64_t i = as_int(key);
    if (obj.is(K::List)) {
      int64_t n = static_cast<int64_t>(obj.list->size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return (*obj.list)[i];
    } else {
      std::vector<std::string> cs = utf8_chars(obj.s);
      int64_t n = static_cast<int64_t>(cs.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value::string(cs[i]);
    }
    return Value::undefined("'" + type_name(obj) + " object' has no element " +
                            std::to_string(as_int(key)));
  }
  if (key.is(K::String)) return get_attr(obj, key.s);
  return Value::undefined("'" + type_name(obj) + " object' has no element " + repr(key));
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step_v, size_t) {
  int64_t step = step_v.is(K::Int) ? step_v.i : 1;
  if (step == 0) step = 1;
  std::vector<Value> items;
  std::vector<std::string> cs;
  int64_t len;
  if (obj.is(K::List)) {
    len = static_cast<int64_t>(obj.list->size());
  } else if (obj.is(K::String)) {
    cs = utf8_chars(obj.s);
    len = static_cast<int64_t>(cs.size());
  } else {
    return Value::undefined("'" + type_name(obj) + "' object is not subscriptable");
  }
  int64_t b, e;
  slice_bounds(len, start, stop, step, b, e);
  std::string s;
  for (int64_t k = b; step > 0 ? k < e : k > e; k += step) {
    if (obj.is(K::List))
      items.push_back((*obj.list)[k]);
    else
      s += cs[k];
    if (step > 0 ? e - k <= step : k - e + step <= 0) break;  // the next index is past the end (k + step may overflow)
  }
  return obj.is(K::List) ? Value::of_list(std::move(items)) : Value::string(s);
}

std::string to_json(const Value& v, int indent, bool sort_keys, std::string& err) {
  std::string out;
  dump(v, indent, sort_keys, 0, out, err);
  return out;
}

// `level`: how many arrays and objects enclose j. A document deeper than kMaxValueDepth is
// refused before the recursion goes further (ferry's readers bound JSON at 512 already; a
// caller's own nlohmann value may not be).
template <class J>
Value from_json_t(const J& j, int level) {
  switch (j.type()) {
    case nlohmann::detail::value_t::null:
      return Value::none();
    case nlohmann::detail::value_t::boolean:
      return Value::boolean(j.template get<bool>());
    case nlohmann::detail::value_t::number_integer:
      return Value::integer(j.template get<int64_t>());
    case nlohmann::detail::value_t::number_unsigned:
      return Value::integer(static_cast<int64_t>(j.template get<uint64_t>()));
    case nlohmann::detail::value_t::number_float:
      return Value::real(j.template get<double>());
    case nlohmann::detail::value_t::string:
      return Value::string(j.template get<std::string>());
    case nlohmann::detail::value_t::array: {
      if (level >= kMaxValueDepth) throw ValueTooDeep();
      List l;
      for (const auto& x : j) l.push_back(from_json_t(x, level + 1));
      return Value::of_list(std::move(l));
    }
    case nlohmann::detail::value_t::object: {
      if (level >= kMaxValueDepth) throw ValueTooDeep();
      Dict d;
      for (const auto& [k, x] : j.items()) d.emplace_back(k, from_json_t(x, level + 1));
      return Value::of_dict(std::move(d));
    }
    default:
      return Value::none();
  }
}

Value from_json(const nlohmann::json& j) {
  return from_json_t(j, 0);
}
Value from_json(const nlohmann::ordered_json& j) {
  return from_json_t(j, 0);
}

}  // namespace ferry::text::chat_detail
