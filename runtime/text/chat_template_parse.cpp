// The chat template parser: jinja2's statements and expression grammar (precedence as in
// jinja2.parser), for the subset described in chat_template.h, over the segments of
// chat_template_lex.cpp.
#include <set>

#include "runtime/text/chat_template.h"
#include "runtime/text/chat_template_ast.h"

namespace ferry::text::chat_detail {

std::string position(const std::string& source, const std::string& where, size_t pos) {
  size_t line = 1, col = 1;
  for (size_t k = 0; k < pos && k < source.size(); ++k) {
    if (source[k] == '\n') {
      ++line;
      col = 1;
    } else if ((static_cast<unsigned char>(source[k]) & 0xC0) != 0x80) {
      ++col;
    }
  }
  return where + ":" + std::to_string(line) + ":" + std::to_string(col);
}

std::string position(const Program& p, size_t pos) {
  return position(p.source, p.where, pos);
}

bool is_known_filter(const std::string& n) {
  static const std::set<std::string> k = {
      "trim",   "length",  "count", "tojson",  "upper",  "lower",      "capitalize",
      "title",  "join",    "items", "map",     "select", "selectattr", "rejectattr",
      "reject", "first",   "last",  "default", "d",      "string",     "int",
      "list",   "replace", "safe",  "abs"};
  return k.count(n) > 0;
}

bool is_known_test(const std::string& n) {
  static const std::set<std::string> k = {
      "defined", "undefined", "none",    "string",   "number",      "integer", "float", "boolean",
      "true",    "false",     "mapping", "iterable", "sequence",    "equalto", "eq",    "==",
      "ne",      "!=",        "odd",     "even",     "divisibleby", "lower",   "upper"};
  return k.count(n) > 0;
}

namespace {

class Parser {
 public:
  Parser(Program& p) : p_(p), src_(p.source) {}

  void run() {
    segs_ = lex_template(p_);
    size_t k = 0;
    p_.body = parse_body(k, {}, nullptr);
    if (k != segs_.size()) fail(segs_[k].pos, "unexpected tag");
  }

 private:
  [[noreturn]] void fail(size_t pos, const std::string& msg) const {
    throw ChatTemplateError("chat template " + position(p_, pos) + ": " + msg);
  }

  // A template is outside input, and the parser, the renderer and the tree's destructor
  // recurse once per level: blocks, expressions and each link of a chain that leans left
  // (a + b + c, a.b[0], x|f|g) count a level, at most kMaxNesting (real templates: < 10).
  static constexpr int kMaxNesting = 256;
  int depth_ = 0;
  class Level {
   public:
    explicit Level(Parser& p) : p_(p) {}
    Level(Parser& p, size_t pos) : p_(p) { more(pos); }
    ~Level() { p_.depth_ -= n_; }
    Level(const Level&) = delete;
    Level& operator=(const Level&) = delete;
    void more(size_t pos) {
      ++n_;
      if (++p_.depth_ > kMaxNesting) {
        p_.fail(pos, "nested deeper than " + std::to_string(kMaxNesting) +
                         " levels (blocks, expressions and chains such as a + b + c count one each)");
      }
    }

   private:
    Parser& p_;
    int n_ = 0;
  };

  // --- statements ------------------------------------------------------------------------
  // Parses segments from k until a block tag whose first name is in `ends` (left at k).
  Body parse_body(size_t& k, const std::set<std::string>& ends, const char* opener) {
    const Level level(*this, k < segs_.size() ? segs_[k].pos : src_.size());
    Body body;
    while (k < segs_.size()) {
      Segment& s = segs_[k];
      if (s.kind == Segment::Text) {
        Node n = node(Node::Kind::Text, s.pos);
        n.text = s.text;
        body.push_back(std::move(n));
        ++k;
        continue;
      }
      toks_ = &s.toks;
      t_ = 0;
      if (s.kind == Segment::Var) {
        Node n = node(Node::Kind::Output, s.pos);
        n.expr = parse_expr();
        expect_end();
        body.push_back(std::move(n));
        ++k;
        continue;
      }
      const Token& kw = tok();
      if (kw.kind != Token::Name) fail(kw.pos, "expected a statement name after '{%'");
      if (ends.count(kw.text)) return body;
      static const std::set<std::string> known_ends = {"elif", "else", "endif", "endfor", "endset"};
      if (known_ends.count(kw.text)) fail(kw.pos, "unexpected '{% " + kw.text + " %}'");
      if (kw.text == "if") {
        body.push_back(parse_if(k));
      } else if (kw.text == "for") {
        body.push_back(parse_for(k));
      } else if (kw.text == "set") {
        body.push_back(parse_set(k));
      } else {
        fail(kw.pos, "unsupported construct '{% " + kw.text + " %}'");
      }
    }
    if (opener)
      fail(src_.size(),
           std::string("unexpected end of template: '{% ") + opener + " %}' is not closed");
    return body;
  }

  void enter(size_t k) {
    toks_ = &segs_[k].toks;
    t_ = 0;
  }

  Node parse_if(size_t& k) {
    Node n = node(Node::Kind::If, segs_[k].pos);
    next();  // if
    n.conds.push_back(parse_expr());
    expect_end();
    ++k;
    for (;;) {
      n.bodies.push_back(parse_body(k, {"elif", "else", "endif"}, "if"));
      enter(k);
      std::string kw = next().text;
      if (kw == "elif") {
        n.conds.push_back(parse_expr());
        expect_end();
        ++k;
      } else if (kw == "else") {
        expect_end();
        ++k;
        n.bodies.push_back(parse_body(k, {"endif"}, "if"));
        enter(k);
        next();
        expect_end();
        ++k;
        return n;
      } else {
        expect_end();
        ++k;
        return n;
      }
    }
  }

  Node parse_for(size_t& k) {
    Node n = node(Node::Kind::For, segs_[k].pos);
    next();  // for
    do {
      const Token& t = next();
      if (t.kind != Token::Name) fail(t.pos, "expected a loop variable name");
      n.names.push_back(t.text);
    } while (accept_op(","));
    if (!accept_name("in")) fail(tok().pos, "expected 'in' in '{% for %}'");
    n.expr = parse_or_expr_no_cond();
    if (accept_name("if")) n.conds.push_back(parse_or_expr_no_cond());
    if (tok().kind == Token::Name && tok().text == "recursive")
      fail(tok().pos, "unsupported construct 'recursive' loop");
    expect_end();
    ++k;
    n.bodies.push_back(parse_body(k, {"else", "endfor"}, "for"));
    enter(k);
    if (next().text == "else") {
      expect_end();
      ++k;
      n.bodies.push_back(parse_body(k, {"endfor"}, "for"));
      enter(k);
      next();
    }
    expect_end();
    ++k;
    return n;
  }

  Node parse_set(size_t& k) {
    Node n = node(Node::Kind::Set, segs_[k].pos);
    next();  // set
    const Token& t = next();
    if (t.kind != Token::Name) fail(t.pos, "expected a name after 'set'");
    n.names.push_back(t.text);
    if (accept_op(".")) {
      const Token& a = next();
      if (a.kind != Token::Name) fail(a.pos, "expected an attribute name");
      n.kind = Node::Kind::SetAttr;
      n.names.push_back(a.text);
    }
    if (tok().kind == Token::Op && tok().text == ",")
      fail(tok().pos, "unsupported construct: tuple assignment in '{% set %}'");
    if (tok().kind == Token::End)
      fail(tok().pos, "unsupported construct: block '{% set %}' ... '{% endset %}'");
    if (!accept_op("=")) fail(tok().pos, "expected '=' in '{% set %}'");
    n.expr = parse_expr();
    expect_end();
    ++k;
    return n;
  }

  // --- expressions -----------------------------------------------------------------------
  const Token& tok() const { return (*toks_)[t_]; }
  const Token& next() {
    const Token& t = (*toks_)[t_];
    if (t.kind != Token::End) ++t_;
    return t;
  }
  bool is_op(const char* o) const { return tok().kind == Token::Op && tok().text == o; }
  bool is_name(const char* n) const { return tok().kind == Token::Name && tok().text == n; }
  bool accept_op(const char* o) {
    if (!is_op(o)) return false;
    ++t_;
    return true;
  }
  bool accept_name(const char* n) {
    if (!is_name(n)) return false;
    ++t_;
    return true;
  }
  void expect_op(const char* o) {
    if (!accept_op(o)) fail(tok().pos, std::string("expected '") + o + "', got " + describe(tok()));
  }
  void expect_end() {
    if (tok().kind != Token::End)
      fail(tok().pos, "expected the end of the tag, got " + describe(tok()));
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Token::End:
        return "the end of the tag";
      case Token::String:
        return "a string";
      case Token::Int:
      case Token::Float:
        return "'" + t.text + "'";
      default:
        return "'" + t.text + "'";
    }
  }
  static Node node(Node::Kind k, size_t pos) {
    Node n;
    n.kind = k;
    n.pos = pos;
    return n;
  }
  ExprP make(Expr::Kind k, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->pos = pos;
    return e;
  }

  ExprP parse_expr() {
    size_t pos = tok().pos;
    Level level(*this, pos);
    ExprP e = parse_or();
    while (is_name("if")) {
      level.more(tok().pos);
      next();
      auto c = make(Expr::Kind::Cond, pos);
      c->a.push_back(parse_or());
      c->a.push_back(std::move(e));
      if (accept_name("else")) c->a.push_back(parse_expr());
      e = std::move(c);
    }
    return e;
  }
  ExprP parse_or_expr_no_cond() { return parse_or(); }

  ExprP parse_or() {
    ExprP e = parse_and();
    Level level(*this);
    while (is_name("or")) {
      level.more(tok().pos);
      auto o = make(Expr::Kind::Or, next().pos);
      o->a.push_back(std::move(e));
      o->a.push_back(parse_and());
      e = std::move(o);
    }
    return e;
  }
  ExprP parse_and() {
    ExprP e = parse_not();
    Level level(*this);
    while (is_name("and")) {
      level.more(tok().pos);
      auto o = make(Expr::Kind::And, next().pos);
      o->a.push_back(std::move(e));
      o->a.push_back(parse_not());
      e = std::move(o);
    }
    return e;
  }
  ExprP parse_not() {
    if (is_name("not")) {
      const Level level(*this, tok().pos);
      auto n = make(Expr::Kind::Not, next().pos);
      n->a.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    size_t pos = tok().pos;
    ExprP e = parse_math1();
    ExprP c;
    for (;;) {
      std::string op;
      if (tok().kind == Token::Op &&
          (tok().text == "==" || tok().text == "!=" || tok().text == "<" || tok().text == ">" ||
           tok().text == "<=" || tok().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && (*toks_)[t_ + 1].kind == Token::Name &&
                 (*toks_)[t_ + 1].text == "in") {
        t_ += 2;
        op = "notin";
      } else {
        break;
      }
      if (!c) {
        c = make(Expr::Kind::Compare, pos);
        c->a.push_back(std::move(e));
      }
      c->ops.push_back(op);
      c->a.push_back(parse_math1());
    }
    return c ? std::move(c) : std::move(e);
  }
  ExprP binary(const std::string& op, ExprP l, ExprP r, size_t pos) {
    auto b = make(Expr::Kind::Binary, pos);
    b->name = op;
    b->a.push_back(std::move(l));
    b->a.push_back(std::move(r));
    return b;
  }
  ExprP parse_math1() {
    ExprP e = parse_concat();
    Level level(*this);
    while (is_op("+") || is_op("-")) {
      level.more(tok().pos);
      const Token& t = next();
      e = binary(t.text, std::move(e), parse_concat(), t.pos);
    }
    return e;
  }
  ExprP parse_concat() {
    ExprP e = parse_math2();
    Level level(*this);
    while (is_op("~")) {
      level.more(tok().pos);
      const Token& t = next();
      e = binary("~", std::move(e), parse_math2(), t.pos);
    }
    return e;
  }
  ExprP parse_math2() {
    ExprP e = parse_pow();
    Level level(*this);
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      level.more(tok().pos);
      const Token& t = next();
      e = binary(t.text, std::move(e), parse_pow(), t.pos);
    }
    return e;
  }
  ExprP parse_pow() {
    ExprP e = parse_unary(true);
    Level level(*this);
    while (is_op("**")) {
      level.more(tok().pos);
      const Token& t = next();
      e = binary("**", std::move(e), parse_unary(true), t.pos);
    }
    return e;
  }
  ExprP parse_unary(bool with_filter) {
    ExprP e;
    if (is_op("-") || is_op("+")) {
      const Level level(*this, tok().pos);
      const Token& t = next();
      e = make(t.text == "-" ? Expr::Kind::Neg : Expr::Kind::Pos, t.pos);
      e->a.push_back(parse_unary(false));
    } else {
      e = parse_postfix(parse_primary());
    }
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }
  ExprP parse_primary() {
    const Token& t = next();
    switch (t.kind) {
      case Token::Name: {
        const std::string& n = t.text;
        auto lit = make(Expr::Kind::Literal, t.pos);
        if (n == "true" || n == "True") {
          lit->value = Value::boolean(true);
        } else if (n == "false" || n == "False") {
          lit->value = Value::boolean(false);
        } else if (n == "none" || n == "None") {
          lit->value = Value::none();
        } else {
          auto v = make(Expr::Kind::Name, t.pos);
          v->name = n;
          return v;
        }
        return lit;
      }
      case Token::String: {
        std::string s = t.text;
        while (tok().kind == Token::String) s += next().text;
        auto lit = make(Expr::Kind::Literal, t.pos);
        lit->value = Value::string(s);
        return lit;
      }
      case Token::Int:
      case Token::Float: {
        auto lit = make(Expr::Kind::Literal, t.pos);
        lit->value = t.kind == Token::Int ? Value::integer(t.i) : Value::real(t.f);
        return lit;
      }
      case Token::End:
        fail(t.pos, "unexpected end of the tag, expected an expression");
      case Token::Op:
        break;
    }
    if (t.text == "(") {
      if (accept_op(")")) return make(Expr::Kind::Tuple, t.pos);
      ExprP e = parse_expr();
      if (is_op(",")) {
        auto tu = make(Expr::Kind::Tuple, t.pos);
        tu->a.push_back(std::move(e));
        while (accept_op(",")) {
          if (is_op(")")) break;
          tu->a.push_back(parse_expr());
        }
        e = std::move(tu);
      }
      expect_op(")");
      return e;
    }
    if (t.text == "[") {
      auto l = make(Expr::Kind::List, t.pos);
      while (!is_op("]")) {
        l->a.push_back(parse_expr());
        if (!accept_op(",")) break;
      }
      expect_op("]");
      return l;
    }
    if (t.text == "{") {
      auto d = make(Expr::Kind::Dict, t.pos);
      while (!is_op("}")) {
        d->a.push_back(parse_expr());
        expect_op(":");
        d->a.push_back(parse_expr());
        if (!accept_op(",")) break;
      }
      expect_op("}");
      return d;
    }
    fail(t.pos, "unexpected " + describe(t));
  }
  ExprP parse_postfix(ExprP e) {
    Level level(*this);
    for (;;) {
      if (is_op(".") || is_op("[") || is_op("(")) level.more(tok().pos);
      if (is_op(".")) {
        const Token& dot = next();
        const Token& n = next();
        if (n.kind == Token::Name) {
          auto a = make(Expr::Kind::Attr, dot.pos);
          a->name = n.text;
          a->a.push_back(std::move(e));
          e = std::move(a);
        } else if (n.kind == Token::Int) {
          auto it = make(Expr::Kind::Item, dot.pos);
          it->a.push_back(std::move(e));
          auto lit = make(Expr::Kind::Literal, n.pos);
          lit->value = Value::integer(n.i);
          it->a.push_back(std::move(lit));
          e = std::move(it);
        } else {
          fail(n.pos, "expected an attribute name after '.'");
        }
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }
  ExprP parse_subscript(ExprP e) {
    const Token& open = next();
    auto missing = [&] {
      auto lit = make(Expr::Kind::Literal, tok().pos);
      lit->value = Value::none();
      return lit;
    };
    std::vector<ExprP> parts;
    bool slice = false;
    parts.push_back(is_op(":") ? missing() : parse_expr());
    while (accept_op(":")) {
      slice = true;
      if (parts.size() == 3) fail(tok().pos, "too many ':' in a slice");
      parts.push_back(is_op(":") || is_op("]") ? missing() : parse_expr());
    }
    if (is_op(",")) fail(tok().pos, "unsupported construct: tuple subscript");
    expect_op("]");
    auto s = make(slice ? Expr::Kind::Slice : Expr::Kind::Item, open.pos);
    s->a.push_back(std::move(e));
    for (auto& p : parts) s->a.push_back(std::move(p));
    while (slice && s->a.size() < 4) s->a.push_back(missing());
    return s;
  }
  void parse_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (tok().kind == Token::Name && (*toks_)[t_ + 1].kind == Token::Op &&
          (*toks_)[t_ + 1].text == "=") {
        std::string key = next().text;
        next();
        call.kwargs.emplace_back(key, parse_expr());
      } else {
        if (is_op("*") || is_op("**"))
          fail(tok().pos, "unsupported construct: *args/**kwargs in a call");
        if (!call.kwargs.empty()) fail(tok().pos, "positional argument after a keyword argument");
        call.a.push_back(parse_expr());
      }
      if (!accept_op(",")) break;
    }
    expect_op(")");
  }
  ExprP parse_call(ExprP callee) {
    auto c = make(Expr::Kind::Call, tok().pos);
    c->a.push_back(std::move(callee));
    parse_args(*c);
    return c;
  }
  ExprP parse_filter_expr(ExprP e) {
    Level level(*this);
    for (;;) {
      if (is_op("|") || is_name("is")) level.more(tok().pos);
      if (is_op("|")) {
        next();
        const Token& n = next();
        if (n.kind != Token::Name) fail(n.pos, "expected a filter name after '|'");
        if (!is_known_filter(n.text)) fail(n.pos, "unsupported filter '" + n.text + "'");
        auto f = make(Expr::Kind::Filter, n.pos);
        f->name = n.text;
        f->a.push_back(std::move(e));
        if (is_op("(")) parse_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        next();
        auto t = make(Expr::Kind::Test, tok().pos);
        t->negated = accept_name("not");
        const Token& n = next();
        std::string name = n.text;
        if (n.kind != Token::Name && !(n.kind == Token::Op && (name == "==" || name == "!=")))
          fail(n.pos, "expected a test name after 'is'");
        if (!is_known_test(name)) fail(n.pos, "unsupported test '" + name + "'");
        t->name = name;
        t->pos = n.pos;
        t->a.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(*t);
        } else if ((tok().kind == Token::Name && !is_name("else") && !is_name("or") &&
                    !is_name("and")) ||
                   tok().kind == Token::String || tok().kind == Token::Int ||
                   tok().kind == Token::Float || is_op("[") || is_op("{")) {
          if (is_name("is")) fail(tok().pos, "cannot chain tests with 'is'");
          t->a.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  Program& p_;
  const std::string& src_;
  std::vector<Segment> segs_;
  const std::vector<Token>* toks_ = nullptr;
  size_t t_ = 0;
};

}  // namespace

std::unique_ptr<Program> parse_template(const std::string& source, const std::string& where) {
  auto p = std::make_unique<Program>();
  p->where = where;
  std::string& s = p->source;
  s.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      s += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      s += source[k];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();  // keep_trailing_newline=False
  Parser(*p).run();
  return p;
}

}  // namespace ferry::text::chat_detail
