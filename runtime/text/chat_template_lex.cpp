// The chat template lexer: jinja2's lexer rules with transformers' settings (trim_blocks,
// lstrip_blocks), whitespace control ({%- -%} {{- -}} {#- -#} {%+ +%}), comments, and the
// tokens inside tags (names, numbers, strings with Python escapes, operators), ending a tag
// only where its brackets balance, as jinja2 does.
#include <cctype>
#include <cstdlib>
#include <cstring>

#include "runtime/text/chat_template.h"
#include "runtime/text/chat_template_ast.h"

namespace ferry::text::chat_detail {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}
class Lexer {
 public:
  explicit Lexer(const Program& p) : p_(p), src_(p.source) {}

  std::vector<Segment> run() {
    split();
    return std::move(segs_);
  }

 private:
  [[noreturn]] void fail(size_t pos, const std::string& msg) const {
    throw ChatTemplateError("chat template " + position(p_, pos) + ": " + msg);
  }

  void split() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t open = std::string::npos;
      for (size_t k = pos; k + 1 < src_.size(); ++k) {
        if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) {
          open = k;
          break;
        }
      }
      if (open == std::string::npos) {
        segs_.push_back({Segment::Text, pos, src_.substr(pos), {}});
        break;
      }
      std::string text = src_.substr(pos, open - pos);
      char type = src_[open + 1];
      char sign = open + 2 < src_.size() ? src_[open + 2] : 0;
      if (sign == '-') {
        size_t e = text.size();
        while (e > 0 && is_space(text[e - 1])) --e;
        text.resize(e);
      } else if (sign != '+' && type != '{') {  // lstrip_blocks
        size_t l = text.rfind('\n');
        l = l == std::string::npos ? 0 : l + 1;
        if ((l > 0 || line_starting) && l < text.size()) {
          bool ws = true;
          for (size_t k = l; k < text.size(); ++k) ws = ws && is_space(text[k]);
          if (ws) text.resize(l);
        }
      }
      if (!text.empty()) segs_.push_back({Segment::Text, pos, text, {}});
      size_t body = open + 2 + (sign == '-' || sign == '+' ? 1 : 0);
      if (type == '#') {
        size_t end = src_.find("#}", body);
        if (end == std::string::npos) fail(open, "missing end of comment tag");
        size_t after = end + 2;
        if (end > body && src_[end - 1] == '-') {
          while (after < src_.size() && is_space(src_[after])) ++after;
        } else if (!(end > body && src_[end - 1] == '+') && after < src_.size() &&
                   src_[after] == '\n') {
          ++after;
        }
        line_starting = src_[after - 1] == '\n';
        pos = after;
        continue;
      }
      Segment seg{type == '{' ? Segment::Var : Segment::Block, open, {}, {}};
      pos = lex_tag(body, type == '{' ? '}' : '%', seg.toks, open);
      line_starting = src_[pos - 1] == '\n';
      if (seg.kind == Segment::Block && !seg.toks.empty() && seg.toks[0].kind == Token::Name &&
          seg.toks[0].text == "raw")
        fail(open, "unsupported construct '{% raw %}'");
      segs_.push_back(std::move(seg));
    }
  }

  // Tokens from `pos` to the tag's end ("}}" or "%}", with its whitespace control); returns
  // the offset after the end (and after what trim_blocks or '-' removes).
  size_t lex_tag(size_t pos, char close, std::vector<Token>& toks, size_t open) {
    std::vector<char> balance;
    for (;;) {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
      if (pos >= src_.size())
        fail(open, std::string("unexpected end of template, expected '") + close + "}'");
      if (balance.empty()) {
        auto at = [&](size_t k, const char* s) { return src_.compare(k, std::strlen(s), s) == 0; };
        std::string end = std::string(1, close) + "}";
        bool minus = at(pos, ("-" + end).c_str()), plus = at(pos, ("+" + end).c_str());
        if (minus || plus || at(pos, end.c_str())) {
          size_t after = pos + end.size() + (minus || plus ? 1 : 0);
          if (minus) {
            while (after < src_.size() && is_space(src_[after])) ++after;
          } else if (!plus && close == '%' && after < src_.size() && src_[after] == '\n') {
            ++after;  // trim_blocks
          } else if (plus && close == '}') {
            fail(pos, "unexpected '+'");
          }
          toks.push_back({Token::End, "", pos});
          return after;
        }
      }
      char c = src_[pos];
      size_t start = pos;
      if (std::isdigit(static_cast<unsigned char>(c))) {
        while (pos < src_.size() &&
               (std::isdigit(static_cast<unsigned char>(src_[pos])) || src_[pos] == '_'))
          ++pos;
        bool is_float = false;
        if (pos + 1 < src_.size() && src_[pos] == '.' &&
            std::isdigit(static_cast<unsigned char>(src_[pos + 1]))) {
          is_float = true;
          ++pos;
          while (pos < src_.size() &&
                 (std::isdigit(static_cast<unsigned char>(src_[pos])) || src_[pos] == '_'))
            ++pos;
        }
        if (pos < src_.size() && (src_[pos] == 'e' || src_[pos] == 'E')) {
          size_t q = pos + 1;
          if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
          if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
            is_float = true;
            pos = q;
            while (pos < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos]))) ++pos;
          }
        }
        std::string digits;
        for (size_t k = start; k < pos; ++k)
          if (src_[k] != '_') digits += src_[k];
        Token t{is_float ? Token::Float : Token::Int, digits, start};
        if (is_float)
          t.f = std::strtod(digits.c_str(), nullptr);  // as Python's float(): out of range is inf or 0, no error
        else
          try {
            t.i = std::stoll(digits);
          } catch (const std::exception&) {
            fail(start, "integer literal out of range");
          }
        toks.push_back(t);
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        while (pos < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[pos])) || src_[pos] == '_'))
          ++pos;
        toks.push_back({Token::Name, src_.substr(start, pos - start), start});
      } else if (c == '\'' || c == '"') {
        toks.push_back({Token::String, lex_string(pos), start});
      } else {
        static const char* const ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                          "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                          ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
        const char* op = nullptr;
        for (const char* o : ops)
          if (src_.compare(pos, std::strlen(o), o) == 0) {
            op = o;
            break;
          }
        if (!op) fail(pos, std::string("unexpected character '") + c + "'");
        std::string o(op);
        if (o == "(" || o == "[" || o == "{")
          balance.push_back(o == "(" ? ')' : o == "[" ? ']' : '}');
        if (o == ")" || o == "]" || o == "}") {
          if (balance.empty() || balance.back() != o[0]) fail(pos, "unexpected '" + o + "'");
          balance.pop_back();
        }
        pos += o.size();
        toks.push_back({Token::Op, o, start});
      }
    }
  }

  // A string literal at `pos`, unescaped as Python's "unicode-escape" does; advances pos.
  std::string lex_string(size_t& pos) {
    char q = src_[pos];
    size_t start = pos++;
    std::string out;
    for (;;) {
      if (pos >= src_.size()) fail(start, "unterminated string literal");
      char c = src_[pos++];
      if (c == q) return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos >= src_.size()) fail(start, "unterminated string literal");
      char e = src_[pos++];
      auto hex = [&](int n) {
        if (pos + n > src_.size()) fail(pos - 2, "truncated \\x/\\u escape");
        uint32_t v = 0;
        for (int k = 0; k < n; ++k) {
          char h = src_[pos++];
          if (!std::isxdigit(static_cast<unsigned char>(h)))
            fail(pos - 1, "bad hex digit in escape");
          v = v * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                                                    : (std::tolower(h) - 'a' + 10));
        }
        return v;
      };
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '\n':
          break;
        case 'x':
          append_utf8(out, hex(2));
          break;
        case 'u':
          append_utf8(out, hex(4));
          break;
        case 'U':
          append_utf8(out, hex(8));
          break;
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = e - '0';
            for (int k = 0; k < 2 && pos < src_.size() && src_[pos] >= '0' && src_[pos] <= '7'; ++k)
              v = v * 8 + (src_[pos++] - '0');
            append_utf8(out, v);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
  }

  const Program& p_;
  const std::string& src_;
  std::vector<Segment> segs_;
};

}  // namespace

std::vector<Segment> lex_template(const Program& p) {
  return Lexer(p).run();
}

}  // namespace ferry::text::chat_detail
