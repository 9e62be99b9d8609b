#include "base/nesting_limit.h"

#include <algorithm>
#include <vector>

namespace ferry::base {

std::optional<size_t> json_too_deep_line(std::string_view text, int limit, size_t first_line) {
  size_t line = first_line;
  int depth = 0;
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    const char c = text[i];
    switch (c) {
      case '\n':
        ++line;
        break;
      case '"':
        // A string: to its closing quote; an escape skips the character after the backslash.
        for (++i; i < n && text[i] != '"'; ++i) {
          if (text[i] == '\\') ++i;
          if (i < n && text[i] == '\n') ++line;  // not valid JSON; the parser says so
        }
        break;
      case '/':
        // Comments, as json::parse(..., ignore_comments) reads them. Where comments are not
        // allowed the parser stops at this '/', so skipping what follows counts no less than
        // it would build.
        if (i + 1 < n && text[i + 1] == '/') {
          while (i + 1 < n && text[i + 1] != '\n') ++i;
        } else if (i + 1 < n && text[i + 1] == '*') {
          for (i += 2; i < n && !(text[i] == '*' && i + 1 < n && text[i + 1] == '/'); ++i) {
            if (text[i] == '\n') ++line;
          }
          ++i;
        }
        break;
      case '[':
      case '{':
        if (++depth > limit) return line;
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;  // an unbalanced closer is the parser's to refuse
        break;
      default:
        break;
    }
  }
  return std::nullopt;
}

namespace {

bool blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

// One YAML scan; the members are its state. The count at any point is
//   block (the enclosing block lines' levels) + line (indicators on this line) + flow,
// an upper bound of the nodes yaml-cpp has open there.
class YamlScan {
 public:
  YamlScan(std::string_view t, int limit) : t_(t), limit_(limit) {}

  std::optional<size_t> run() {
    while (i_ < t_.size()) {
      if (at_line_start_) {
        at_line_start_ = false;
        if (flow_.empty() && !begin_block_line()) continue;
      }
      if (!step()) return line_no_;
    }
    return std::nullopt;
  }

 private:
  struct Open {
    size_t indent;  // twice the line's indentation, + 1 for a "- " line (see begin_block_line)
    int count;      // the levels open inside that line's nodes
  };
  struct Flow {
    char bracket;
    bool pair;  // a "key: value" inside a [ ]: yaml-cpp nests a one-pair map there
  };

  bool over() const { return block_ + line_ + flow_total_ > limit_; }

  char at(size_t k) const { return k < t_.size() ? t_[k] : '\n'; }

  void end_line() {
    ++line_no_;
    ++i_;
    line_begin_ = i_;
    at_line_start_ = true;
  }

  long column() const { return static_cast<long>(i_ - line_begin_); }

  // Settles the block levels at the start of a line outside any flow collection; false when
  // the line needs nothing more (blank, a comment, a directive, a block scalar's content).
  bool begin_block_line() {
    size_t indent = 0;
    while (at(i_ + indent) == ' ') ++indent;
    const size_t first = i_ + indent;
    const char c = at(first);
    const bool empty = c == '\n' || c == '\r';
    if (block_scalar_ && !empty) {
      // Its content: lines indented past its parent's column, as far as the first one is.
      if (scalar_indent_ < 0 && static_cast<long>(indent) > scalar_parent_) scalar_indent_ = static_cast<long>(indent);
      if (scalar_indent_ < 0 || static_cast<long>(indent) < scalar_indent_) block_scalar_ = false;
    }
    if (empty || block_scalar_ || c == '#' || (indent == 0 && c == '%')) {
      skip_line();
      return false;
    }
    // Close the line before: its levels stay open for more indented lines only.
    if (line_open_) push(line_indent_, line_);
    line_open_ = true;
    line_ = 0;
    if (indent == 0 && (t_.substr(first, 3) == "---" || t_.substr(first, 3) == "...") && blank(at(first + 3))) {
      opens_.clear();  // a new document
      block_ = 0;
    }
    // A "- " line may sit at its parent key's indentation and still be inside it: it counts
    // as half a step more indented than a key line there.
    line_indent_ = 2 * indent + (c == '-' && blank(at(first + 1)) ? 1 : 0);
    while (!opens_.empty() && opens_.back().indent >= line_indent_) {
      block_ -= opens_.back().count;
      opens_.pop_back();
    }
    i_ = first;
    token_start_ = true;
    // A block scalar alone on its line belongs to the enclosing line's node.
    parent_col_ = opens_.empty() ? -1 : static_cast<long>(opens_.back().indent / 2);
    return true;
  }

  void push(size_t indent, int count) {
    const int levels = count > 0 ? count : 1;
    opens_.push_back({indent, levels});
    block_ += levels;
  }

  void skip_line() {
    while (i_ < t_.size() && t_[i_] != '\n') ++i_;
    if (i_ < t_.size()) end_line();
  }

  // A quoted scalar from its opening quote (which may span lines).
  void skip_quoted() {
    const char q = t_[i_++];
    while (i_ < t_.size()) {
      const char c = t_[i_];
      if (c == '\n') ++line_no_;
      if (q == '"' && c == '\\') {
        if (at(i_ + 1) == '\n') ++line_no_;
        i_ += 2;
        continue;
      }
      if (c == q) {
        if (q == '\'' && at(i_ + 1) == '\'') {  // '' is a quote inside single quotes
          i_ += 2;
          continue;
        }
        ++i_;
        return;
      }
      ++i_;
    }
  }

  // One token or character; false when the count passes the limit.
  bool step() {
    const char c = t_[i_];
    if (c == '\n') {
      end_line();
      return true;
    }
    if (c == ' ' || c == '\t' || c == '\r') {
      ++i_;
      return true;
    }
    const bool prev_blank = i_ == 0 || blank(t_[i_ - 1]);
    if (c == '#' && prev_blank) {  // a comment, to the end of the line
      while (i_ < t_.size() && t_[i_] != '\n') ++i_;
      return true;
    }
    const bool in_flow = !flow_.empty();
    if (token_start_ && (c == '"' || c == '\'')) {
      scalar_col_ = column();
      skip_quoted();
      token_start_ = false;
      after_quote_ = true;
      return true;
    }
    const bool was_quote = after_quote_;
    after_quote_ = false;
    if (c == '[' || c == '{') {
      if (in_flow || token_start_) {
        flow_.push_back({c, false});
        ++flow_total_;
        ++i_;
        token_start_ = true;
        return !over();
      }
    } else if (in_flow && (c == ']' || c == '}')) {
      flow_total_ -= flow_.back().pair ? 2 : 1;
      flow_.pop_back();
      ++i_;
      token_start_ = false;
      return true;
    } else if (in_flow && c == ',') {
      if (flow_.back().pair) {
        flow_.back().pair = false;
        --flow_total_;
      }
      ++i_;
      token_start_ = true;
      return true;
    } else if (c == ':' && (blank(at(i_ + 1)) || (in_flow && (was_quote || std::string_view(",[]{}").find(at(i_ + 1)) != std::string_view::npos)))) {
      ++i_;
      token_start_ = true;
      if (in_flow) {
        if (flow_.back().bracket == '[' && !flow_.back().pair) {
          flow_.back().pair = true;
          ++flow_total_;
        }
      } else {
        ++line_;
        parent_col_ = scalar_col_;  // the key's column
      }
      return !over();
    } else if (token_start_ && (c == '-' || c == '?') && blank(at(i_ + 1)) && !in_flow) {
      parent_col_ = column();
      ++i_;
      ++line_;
      return !over();
    } else if (token_start_ && (c == '|' || c == '>') && !in_flow) {
      // A block scalar: its content is the following lines indented past its parent (the
      // key or "- " before it on this line): as far as the indicator digit says, else as the
      // first of them.
      block_scalar_ = true;
      scalar_parent_ = parent_col_;
      scalar_indent_ = -1;
      for (++i_; i_ < t_.size() && !blank(t_[i_]); ++i_) {
        if (t_[i_] >= '1' && t_[i_] <= '9') scalar_indent_ = std::max(0L, scalar_parent_) + (t_[i_] - '0');
      }
      while (i_ < t_.size() && t_[i_] != '\n') ++i_;
      return true;
    } else if (token_start_ && (c == '&' || c == '!' || c == '*')) {
      // An anchor, tag or alias: a word, and a node may still follow.
      while (i_ < t_.size() && !blank(t_[i_]) && !(in_flow && std::string_view(",[]{}").find(t_[i_]) != std::string_view::npos)) ++i_;
      return true;
    }
    // A plain scalar's character.
    if (token_start_) scalar_col_ = column();
    ++i_;
    token_start_ = false;
    return true;
  }

  std::string_view t_;
  int limit_;
  size_t i_ = 0;
  size_t line_no_ = 1;
  bool at_line_start_ = true;
  bool token_start_ = true;
  bool after_quote_ = false;
  // Block context: the enclosing lines (bounded: each adds a level, and the scan stops past
  // the limit), the sum of their levels, and this line's.
  std::vector<Open> opens_;
  int block_ = 0;
  int line_ = 0;
  size_t line_indent_ = 0;
  bool line_open_ = false;
  // The column of the node a block scalar would belong to, of the last scalar begun, and the
  // pending block scalar's parent column and content indentation (-1: not known yet).
  long parent_col_ = -1;
  long scalar_col_ = 0;
  size_t line_begin_ = 0;
  bool block_scalar_ = false;
  long scalar_parent_ = -1;
  long scalar_indent_ = -1;
  // Flow context: the open brackets (bounded the same way) and their levels.
  std::vector<Flow> flow_;
  int flow_total_ = 0;
};

}  // namespace

std::optional<size_t> yaml_too_deep_line(std::string_view text, int limit) { return YamlScan(text, limit).run(); }

std::string too_deep_message(const std::string& source, size_t line, int limit, const char* kind) {
  return source + ": line " + std::to_string(line) + ": nested deeper than " + std::to_string(limit) +
         " levels (ferry reads " + kind + " nested at most " + std::to_string(limit) + " deep)";
}

}  // namespace ferry::base
