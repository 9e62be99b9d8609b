// A Hugging Face chat template (tokenizer_config.json "chat_template"), rendered as
// transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt=...) does:
// jinja2's ImmutableSandboxedEnvironment with trim_blocks=True and lstrip_blocks=True (and
// jinja2's defaults: keep_trailing_newline=False, newlines normalized to "\n", the default
// Undefined), the globals raise_exception(msg), strftime_now(fmt), namespace(...), dict(...),
// and transformers' tojson filter (json.dumps with ensure_ascii=False, indent, sort_keys).
// Reproduced exactly for the Llama 3.1, Qwen2.5, Mistral, Llama 2 and ChatML templates in
// tests/data/chat_templates/ (expected strings from transformers itself).
//
// The Jinja subset:
//   text, {{ expr }}, {# comment #}, whitespace control {%- -%} {{- -}} {#- -#} {%+ +%}
//   {% if %}/{% elif %}/{% else %}/{% endif %}
//   {% for x in seq [if cond] %} ... [{% else %}] {% endfor %}, also `for k, v in ...`;
//     loop.index, index0, revindex, revindex0, first, last, length
//   {% set x = expr %}, {% set ns.attr = expr %} on a namespace(...)
//   literals (strings with Python escapes, ints, floats, true/false/none, lists, dicts,
//   tuples), variables, attribute and item access, slices [a:b:c], calls with keyword
//   arguments; operators + - * / // % ** ~, == != < > <= >= (chained), in, not in, and, or,
//   not, `a if c else b`; tests (is [not]) defined undefined none string number integer float
//   boolean true false mapping iterable sequence equalto eq ne odd even divisibleby lower upper;
//   filters trim length count tojson upper lower capitalize title join items select reject
//   selectattr rejectattr map(attribute=) first last default d string int list replace safe abs;
//   string methods strip lstrip rstrip startswith endswith split upper lower title replace,
//   dict methods get items keys values.
// upper/lower/capitalize/title change ASCII letters only (Python changes all of Unicode).
// Scoping is jinja2's: a set inside a for body lives for that iteration only; if blocks do
// not scope; namespaces are shared by reference.
//
// Errors, all ChatTemplateError naming the template's source (`where`) and line:column:
//   - at construction, anything outside the subset, by name: a statement such as
//     {% macro %}, {% include %}, {% raw %}, {% break %}; an unknown filter or test; and
//     syntax errors (unclosed tags, unexpected tokens, missing {% endif %} ...);
//   - at render, what jinja2 raises: raise_exception(msg) (what() ends with msg, and
//     raised_message() is msg exactly), use of an undefined value beyond printing/testing/
//     iterating it, operand type errors, values tojson cannot write;
//   - at render, where jinja2 would go on: an integer result past 64 bits (Python's have no
//     bound), a value, a join or replace or the rendering past 64 MiB, more than 100,000
//     loop rounds, a tojson indent past 1024 (chat_template_value.h: the limits), a list,
//     dict or tuple nested past 512 levels, from the template or from the JSON passed in
//     (chat_template_ast.h: kMaxValueDepth; printing namespaces held inside each other
//     counts their levels too; one inside itself prints <Namespace {...}> as in Python).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace ferry::text {

class ChatTemplateError : public std::runtime_error {
 public:
  ChatTemplateError(const std::string& what, std::string raised = {})
      : std::runtime_error(what), raised_(std::move(raised)) {}
  // The message given to raise_exception() by the template, or "" for other errors.
  const std::string& raised_message() const { return raised_; }

 private:
  std::string raised_;
};

namespace chat_detail {
struct Program;
}

class ChatTemplate {
 public:
  // Parses `source`; `where` names it in errors (a file path, "tokenizer_config.json:name").
  ChatTemplate(std::string source, std::string where);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders with the variables transformers passes: `messages`, `add_generation_prompt`,
  // `tools` and `documents` (null unless `extra` has them), and each key of `extra` (an
  // object: bos_token, eos_token, date_string, ...), which may override the first two.
  // Object keys reach the template in nlohmann::json's order (sorted); pass ordered_json to
  // keep the document's order, as Python dicts do (it shows in tojson of tools/arguments).
  std::string render(const nlohmann::json& messages, bool add_generation_prompt,
                     const nlohmann::json& extra = nlohmann::json::object()) const;
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra) const;

  // strftime_now(format) in templates; by default the local time through std::strftime.
  void set_strftime_now(std::function<std::string(const std::string&)> fn);

  const std::string& source() const;
  const std::string& where() const;

  // The "chat_template" of a tokenizer_config.json: a string, or a list of {"name",
  // "template"} from which `name` is taken ("default" when it is empty). nullopt when the
  // file has no chat_template (or no entry of that name); ChatTemplateError when the file
  // cannot be read or parsed, or the template is outside the subset.
  static std::optional<ChatTemplate> from_tokenizer_config(const std::string& path,
                                                           const std::string& name = "");

 private:
  std::string source_, where_;
  std::unique_ptr<chat_detail::Program> program_;
  std::function<std::string(const std::string&)> strftime_now_;
};

}  // namespace ferry::text
