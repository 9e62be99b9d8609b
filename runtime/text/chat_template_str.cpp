// Python's str and dict methods for chat templates (strip, split, startswith, ..., get,
// items), str.strip()'s Unicode whitespace, and splitting UTF-8 into code points.
#include <algorithm>

#include "runtime/text/chat_template_value.h"

namespace ferry::text::chat_detail {

using K = Value::Kind;

namespace {

// The code point at s[k] (advancing k); an invalid byte stands for itself.
uint32_t next_cp(const std::string& s, size_t& k) {
  unsigned char c = static_cast<unsigned char>(s[k]);
  int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
  if (n <= 0 || k + n >= s.size()) {
    ++k;
    return c;
  }
  uint32_t cp = c & (0x3F >> n);
  for (int j = 1; j <= n; ++j) {
    unsigned char d = static_cast<unsigned char>(s[k + j]);
    if ((d & 0xC0) != 0x80) {
      ++k;
      return c;
    }
    cp = (cp << 6) | (d & 0x3F);
  }
  k += n + 1;
  return cp;
}

bool is_py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// [begin, end) byte offsets of s without leading/trailing code points matching `drop`.
template <class F>
std::string strip_if(const std::string& s, bool left, bool right, F drop) {
  std::vector<std::pair<size_t, uint32_t>> cps;  // byte offset, code point
  for (size_t k = 0; k < s.size();) {
    size_t at = k;
    cps.emplace_back(at, next_cp(s, k));
  }
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && drop(cps[b].second)) ++b;
  if (right)
    while (e > b && drop(cps[e - 1].second)) --e;
  size_t from = b < cps.size() ? cps[b].first : s.size();
  size_t to = e < cps.size() ? cps[e].first : s.size();
  return s.substr(from, to - from);
}

}  // namespace

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t k = 0; k < s.size();) {
    size_t at = k;
    next_cp(s, k);
    out.push_back(s.substr(at, k - at));
  }
  return out;
}

std::string strip(const std::string& s) {
  return strip_if(s, true, true, is_py_space);
}

std::optional<Value> call_method(const Value& obj, const std::string& name,
                                 const std::vector<Value>& args, std::string& err) {
  auto nargs = [&](size_t lo, size_t hi) {
    if (args.size() < lo || args.size() > hi) {
      err = name + "() takes " + std::to_string(lo) + (hi > lo ? " to " + std::to_string(hi) : "") +
            " argument(s)";
      return false;
    }
    return true;
  };
  if (obj.is(K::Dict)) {
    if (name == "get") {
      if (!nargs(1, 2)) return Value();
      const Value* v = args[0].is(K::String) ? dict_get(*obj.dict, args[0].s) : nullptr;
      return v ? *v : args.size() > 1 ? args[1] : Value::none();
    }
    if (name == "items" || name == "keys" || name == "values") {
      if (!nargs(0, 0)) return Value();
      List l;
      for (const auto& [k, v] : *obj.dict)
        l.push_back(name == "keys"     ? Value::string(k)
                    : name == "values" ? v
                                       : Value::of_tuple({Value::string(k), v}));
      return Value::of_list(std::move(l));
    }
    return std::nullopt;
  }
  if (!obj.is(K::String)) return std::nullopt;
  const std::string& s = obj.s;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    if (!nargs(0, 1)) return Value();
    bool l = name != "rstrip", r = name != "lstrip";
    if (args.empty() || args[0].is(K::None)) return Value::string(strip_if(s, l, r, is_py_space));
    if (!args[0].is(K::String)) return err = name + " arg must be None or str", Value();
    std::vector<uint32_t> set;
    for (size_t k = 0; k < args[0].s.size();) set.push_back(next_cp(args[0].s, k));
    return Value::string(strip_if(
        s, l, r, [&](uint32_t c) { return std::find(set.begin(), set.end(), c) != set.end(); }));
  }
  if (name == "startswith" || name == "endswith") {
    if (!nargs(1, 1)) return Value();
    std::vector<std::string> cands;
    if (args[0].is(K::String)) {
      cands.push_back(args[0].s);
    } else if (args[0].is(K::List)) {
      for (const Value& x : *args[0].list) {
        if (!x.is(K::String))
          return err = name + " first arg must be str or a tuple of str", Value();
        cands.push_back(x.s);
      }
    } else {
      return err = name + " first arg must be str or a tuple of str", Value();
    }
    for (const std::string& c : cands) {
      bool hit = c.size() <= s.size() &&
                 (name == "startswith" ? s.compare(0, c.size(), c) == 0
                                       : s.compare(s.size() - c.size(), c.size(), c) == 0);
      if (hit) return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "split") {
    if (!nargs(0, 2)) return Value();
    int64_t maxsplit = args.size() > 1 && args[1].is(K::Int) ? args[1].i : -1;
    List parts;
    if (args.empty() || args[0].is(K::None)) {
      std::string cur;
      bool in_word = false;
      for (size_t k = 0; k < s.size();) {
        size_t at = k;
        uint32_t c = next_cp(s, k);
        if (is_py_space(c) && !(maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit)) {
          if (in_word) parts.push_back(Value::string(cur));
          cur.clear();
          in_word = false;
        } else if (!is_py_space(c) || in_word) {
          if (!in_word && maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
            cur = strip_if(s.substr(at), false, true, is_py_space);
            in_word = true;
            break;
          }
          cur += s.substr(at, k - at);
          in_word = true;
        }
      }
      if (in_word) parts.push_back(Value::string(cur));
      return Value::of_list(std::move(parts));
    }
    if (!args[0].is(K::String))
      return err = "must be str or None, not " + type_name(args[0]), Value();
    const std::string& sep = args[0].s;
    if (sep.empty()) return err = "empty separator", Value();
    size_t from = 0;
    for (;;) {
      size_t at = s.find(sep, from);
      if (at == std::string::npos ||
          (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit))
        break;
      parts.push_back(Value::string(s.substr(from, at - from)));
      from = at + sep.size();
    }
    parts.push_back(Value::string(s.substr(from)));
    return Value::of_list(std::move(parts));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    if (!nargs(0, 0)) return Value();
    std::string out = s;
    bool prev_cased = false;
    for (size_t k = 0; k < out.size(); ++k) {
      char c = out[k];
      bool up = c >= 'A' && c <= 'Z', lo = c >= 'a' && c <= 'z';
      if (name == "upper" && lo) out[k] = static_cast<char>(c - 32);
      if (name == "lower" && up) out[k] = static_cast<char>(c + 32);
      if (name == "capitalize") {
        if (k == 0 && lo) out[k] = static_cast<char>(c - 32);
        if (k > 0 && up) out[k] = static_cast<char>(c + 32);
      }
      if (name == "title") {
        if (!prev_cased && lo) out[k] = static_cast<char>(c - 32);
        if (prev_cased && up) out[k] = static_cast<char>(c + 32);
        prev_cased = up || lo || (static_cast<unsigned char>(c) >= 0x80 && prev_cased);
      }
    }
    return Value::string(out);
  }
  if (name == "replace") {
    if (!nargs(2, 3)) return Value();
    if (!args[0].is(K::String) || !args[1].is(K::String))
      return err = "replace() arguments must be str", Value();
    int64_t count = args.size() > 2 && args[2].is(K::Int) ? args[2].i : -1;
    const std::string &from = args[0].s, &to = args[1].s;
    std::string out;
    if (from.empty()) {
      std::vector<std::string> cs = utf8_chars(s);
      int64_t n = 0;
      for (const std::string& c : cs) {
        if (count < 0 || n < count) out += to, ++n;
        out += c;
        if (out.size() > kMaxTextBytes) return err = std::string("replace(): the result is past ") + std::to_string(kMaxTextBytes) + " bytes", Value();
      }
      if (count < 0 || n < count) out += to;
      return Value::string(out);
    }
    size_t pos = 0;
    int64_t n = 0;
    for (;;) {
      size_t at = s.find(from, pos);
      if (at == std::string::npos || (count >= 0 && n >= count)) break;
      out += s.substr(pos, at - pos) + to;
      if (out.size() > kMaxTextBytes) return err = std::string("replace(): the result is past ") + std::to_string(kMaxTextBytes) + " bytes", Value();
      pos = at + from.size();
      ++n;
    }
    return Value::string(out + s.substr(pos));
  }
  return std::nullopt;
}

}  // namespace ferry::text::chat_detail
