// Chat templates rendered as transformers' apply_chat_template(tokenize=False) renders them:
// for each template in tests/data/chat_templates/ (Llama 3.1 and 3.2, Qwen2.5 and Mistral v0.3,
// each with and without tools; Mistral with a system message and v0.1, Llama 2, ChatML, and a
// template of the supported constructs; 55 snippets for jinja2's corners) every case's
// string is reproduced byte for byte, and raise_exception's message is carried by the error;
// constructs outside the subset and syntax errors are refused naming the construct and the
// line:column.
#define BOOST_TEST_MODULE chat_template
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "runtime/text/chat_template.h"

using namespace ferry;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kData = std::string(FERRY_SOURCE_DIR) + "/tests/data/chat_templates/";
const char* const kTemplates[] = {"llama3",  "llama3_2",     "qwen2_5",
                                  "mistral", "mistral_v0_1", "mistral_v0_3",
                                  "llama2",  "chatml",       "constructs"};

json read_json(const std::string& p) {
  std::ifstream in(p);
  return json::parse(in);
}

std::string show(const std::string& s) {
  return json(s).dump();
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Fixtures keep the key order of the Python dicts they were rendered from (tojson shows it).
using ojson = nlohmann::ordered_json;

ojson read_ordered(const std::string& p) {
  std::ifstream in(p);
  return ojson::parse(in);
}

ojson extra_of(const ojson& c) {
  ojson extra = ojson::object();
  for (const char* k : {"bos_token", "eos_token", "date_string", "tools"})
    if (c.contains(k)) extra[k] = c[k];
  return extra;
}

}  // namespace

BOOST_AUTO_TEST_CASE(renders_as_transformers_does) {
  for (const char* name : kTemplates) {
    BOOST_TEST_CONTEXT(name) {
      const ojson data = read_ordered(kData + name + ".json");
      const text::ChatTemplate tpl(data.at("template").get<std::string>(),
                                   std::string(name) + ".json");
      const ojson& cases = data.at("cases");
      BOOST_TEST_REQUIRE(cases.size() >= 16u);
      int passed = 0;
      for (const ojson& c : cases) {
        BOOST_TEST_CONTEXT(c.at("name").get<std::string>()) {
          const ojson extra = extra_of(c);
          const bool agp = c.at("add_generation_prompt").get<bool>();
          if (c.contains("expected")) {
            std::string got;
            BOOST_CHECK_NO_THROW(got = tpl.render(c.at("messages"), agp, extra));
            const std::string want = c.at("expected").get<std::string>();
            BOOST_TEST(got == want, "got " << show(got) << "\nwant " << show(want));
            passed += got == want;
          } else {
            const std::string want = c.at("error").get<std::string>();
            try {
              tpl.render(c.at("messages"), agp, extra);
              BOOST_ERROR("no error, expected " << want);
            } catch (const text::ChatTemplateError& e) {
              BOOST_TEST(e.raised_message() == want);
              BOOST_TEST(contains(e.what(), want), e.what());
              BOOST_TEST(contains(e.what(), std::string(name) + ".json:"), e.what());
              passed += e.raised_message() == want;
            }
          }
        }
      }
      BOOST_TEST_MESSAGE(name << ": " << passed << "/" << cases.size() << " cases exact");
    }
  }
}

BOOST_AUTO_TEST_CASE(unsupported_constructs_are_refused_by_name_and_position) {
  const std::pair<const char*, std::vector<std::string>> cases[] = {
      {"Hello\n{% macro greet(x) %}hi{% endmacro %}",
       {"t.jinja:2:4", "unsupported construct '{% macro %}'"}},
      {"{{ bos_token }}{% include 'other.jinja' %}",
       {"t.jinja:1:19", "unsupported construct '{% include %}'"}},
      {"{% for m in messages %}\n  {% break %}\n{% endfor %}", {"t.jinja:2:6", "'{% break %}'"}},
      {"a\nb {% raw %}{{ x }}{% endraw %}", {"t.jinja:2:3", "'{% raw %}'"}},
      {"{% set x %}block{% endset %}", {"t.jinja:1:10", "block '{% set %}'"}},
      {"{{ messages | wordcount }}", {"t.jinja:1:15", "unsupported filter 'wordcount'"}},
      {"{% if x is prime %}{% endif %}", {"t.jinja:1:12", "unsupported test 'prime'"}},
      {"{% for m in messages recursive %}{% endfor %}", {"t.jinja:1:22", "'recursive'"}},
  };
  for (const auto& [source, parts] : cases) {
    const std::string& src = source;  // a reference the lambda can capture (clang 14: not a binding)
    BOOST_TEST_CONTEXT(show(src)) {
      const std::string err = error_of([&] { text::ChatTemplate(src, "t.jinja"); });
      for (const std::string& p : parts) BOOST_TEST(contains(err, p), err);
    }
  }
}

BOOST_AUTO_TEST_CASE(syntax_errors_name_the_position) {
  const std::pair<const char*, std::vector<std::string>> cases[] = {
      {"{{ messages[0 }}", {"t.jinja:1:15", "unexpected '}'"}},
      {"ok\n{% if x %}never closed", {"t.jinja:2:", "'{% if %}' is not closed"}},
      {"{% endif %}", {"t.jinja:1:4", "unexpected '{% endif %}'"}},
      {"{{ 'unterminated }}", {"t.jinja:1:4", "unterminated string"}},
      {"{# open comment", {"t.jinja:1:1", "missing end of comment"}},
      {"{{ a + }}", {"t.jinja:1:8", "expected an expression"}},
      {"{% if a b %}{% endif %}", {"t.jinja:1:9", "expected the end of the tag, got 'b'"}},
      {"{{ x", {"t.jinja:1:1", "unexpected end of template"}},
      {"{% set = 1 %}", {"t.jinja:1:8", "expected a name after 'set'"}},
  };
  for (const auto& [source, parts] : cases) {
    const std::string& src = source;  // a reference the lambda can capture (clang 14: not a binding)
    BOOST_TEST_CONTEXT(show(src)) {
      const std::string err = error_of([&] { text::ChatTemplate(src, "t.jinja"); });
      for (const std::string& p : parts) BOOST_TEST(contains(err, p), err);
    }
  }
}

BOOST_AUTO_TEST_CASE(runtime_errors_are_jinja2s) {
  const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  auto render = [&](const char* src) { return text::ChatTemplate(src, "t").render(msgs, false); };
  BOOST_TEST(render("[{{ nothing }}{{ 'x' if nothing is defined else 'ok' }}{% for x in nothing "
                    "%}x{% endfor %}]") == "[ok]");
  BOOST_TEST(
      contains(error_of([&] { render("{{ nothing.x }}"); }), "t:1:11: 'nothing' is undefined"));
  BOOST_TEST(contains(error_of([&] { render("{{ nothing + 'a' }}"); }), "'nothing' is undefined"));
  BOOST_TEST(contains(error_of([&] { render("{{ 1 + 'a' }}"); }),
                      "unsupported operand type(s) for +: 'int' and 'str'"));
  BOOST_TEST(contains(error_of([&] { render("{{ messages[0].missing | tojson }}"); }),
                      "not JSON serializable"));
  BOOST_TEST(
      contains(error_of([&] { render("{% set x = 1 %}{% set x.a = 2 %}"); }), "non-namespace"));
  BOOST_TEST(render("{{ messages[0].missing is defined }}{{ messages[0]['role'] }}") ==
             "Falseuser");
  // Float literals beyond a double are Python's float(): inf and 0.0, no error (an
  // std::out_of_range escaped before; found by tests/fuzz/fuzz_chat_template.cpp).
  BOOST_TEST(render("{{ 1e999 }} {{ -1.5e999 }} {{ 1.5e-999 }}") == "inf -inf 0.0");
  // Integers are 64-bit (Python's have no bound): a result past them is refused, where it
  // wrapped (undefined behaviour) before; powers take 63 rounds at most (1 ** 10**18 ran
  // for ever); floor division and modulo keep Python's signs at the edges; a repetition past
  // 64 MiB is refused; a slice step near the limit ends (found by fuzz_chat_template.cpp).
  BOOST_TEST(contains(error_of([&] { render("{{ 4052555153018976267 * 3 }}"); }),
                      "integer overflow: 4052555153018976267 * 3 does not fit 64 bits"));
  BOOST_TEST(contains(error_of([&] { render("{{ 2 ** 63 }}"); }), "integer overflow: 2 ** 63"));
  BOOST_TEST(contains(error_of([&] { render("{{ -(-9223372036854775807 - 1) }}"); }), "integer overflow"));
  BOOST_TEST(contains(error_of([&] { render("{{ (-9223372036854775807 - 1) // -1 }}"); }), "integer overflow"));
  BOOST_TEST(contains(error_of([&] { render("{{ 1e20 | int }}"); }), "int: 1e+20 does not fit 64 bits"));
  BOOST_TEST(contains(error_of([&] { render("{{ 'ab' * 100000000 }}"); }),
                      "repetition by 100000000 builds a value past 67108864 bytes"));
  BOOST_TEST(contains(error_of([&] { render("{{ ['x' * 1000] * 100000 }}"); }), "builds a value past 67108864 bytes"));
  BOOST_TEST(render("[{{ '' * 1000000000000000000 }}{{ [] * 1000000000000000000 }}]") == "[[]]");
  // What a render may build and how long it may loop (chat_template_value.h): doubling a
  // string, joining or replacing past 64 MiB, a rendering past it, loops of loops past a
  // million rounds, an indent past 1024 are refused (they exhausted memory or time).
  BOOST_TEST(contains(error_of([&] {
                        render("{% set ns = namespace(s='ab') %}{% for x in [0] * 40 %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}");
                      }),
                      "t:1:75: a value past 67108864 bytes"));
  BOOST_TEST(contains(error_of([&] { render("{{ (['x' * 1000000] * 60) | join('x' * 1000000) }}"); }), "join: the result is longer"));
  BOOST_TEST(contains(error_of([&] { render("{{ ('x' * 1000000).replace('', 'y' * 100) }}"); }), "replace(): the result is past"));
  BOOST_TEST(contains(error_of([&] { render("{% for x in [0] * 100 %}{{ 'a' * 40000000 }}{% endfor %}"); }),
                      "the rendering is longer than 67108864 bytes"));
  BOOST_TEST(contains(error_of([&] { render("{% for a in [0] * 101 %}{% for b in [0] * 1000 %}{% endfor %}{% endfor %}"); }),
                      "the template loops more than 100000 times"));
  BOOST_TEST(render("{% for a in [0] * 99 %}{% for b in [0] * 1000 %}{% endfor %}{% endfor %}.") == ".");
  BOOST_TEST(contains(error_of([&] { render("{{ messages | tojson(indent=1000000000) }}"); }), "tojson: indent 1000000000 is past 1024"));
  BOOST_TEST(render("{{ 1 ** 1000000000000000000 }} {{ (-2) ** 63 }} {{ 3 ** 39 }} {{ 0 ** 0 }}") ==
             "1 -9223372036854775808 4052555153018976267 1");
  BOOST_TEST(render("{{ 7 % -2 }} {{ -7 % 2 }} {{ -7 // 2 }} {{ 5 % -1 }} {{ (-9223372036854775807 - 1) % 3 }}") ==
             "-1 1 -4 0 1");
  BOOST_TEST(render("{{ 'abc'[1::9223372036854775807] }}{{ 'abc'[1::-9223372036854775807] }}") == "bb");
}

BOOST_AUTO_TEST_CASE(strftime_now_and_the_defaults_of_transformers) {
  text::ChatTemplate tpl(
      "{% if not date_string is defined %}{% set date_string = strftime_now('%d %b %Y') %}{% endif "
      "%}"
      "{{ date_string }}|{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}\n",
      "t");
  tpl.set_strftime_now([](const std::string& f) { return "fmt=" + f; });
  BOOST_TEST(tpl.render(json::array(), true) ==
             "fmt=%d %b %Y|True|True|True");  // trailing newline dropped
  BOOST_TEST(tpl.render(json::array(), false, {{"date_string", "1 Jan 2025"}}) ==
             "1 Jan 2025|True|True|False");
}

BOOST_AUTO_TEST_CASE(from_tokenizer_config_reads_a_string_or_named_templates) {
  const fs::path dir =
      fs::temp_directory_path() / ("ferry_chat_template_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const json& j) {
    std::ofstream(dir / name) << j.dump();
    return (dir / name).string();
  };
  const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  const std::string chatml = read_json(kData + "chatml.json").at("template").get<std::string>();
  auto one =
      text::ChatTemplate::from_tokenizer_config(write("a.json", {{"chat_template", chatml}}));
  BOOST_TEST_REQUIRE(one.has_value());
  BOOST_TEST(one->render(msgs, true) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  const json list = {{"chat_template",
                      json::array({{{"name", "default"}, {"template", "D{{ messages | length }}"}},
                                   {{"name", "tool_use"}, {"template", "T"}}})}};
  const std::string p = write("b.json", list);
  BOOST_TEST(text::ChatTemplate::from_tokenizer_config(p)->render(msgs, false) == "D1");
  BOOST_TEST(text::ChatTemplate::from_tokenizer_config(p, "tool_use")->render(msgs, false) == "T");
  BOOST_TEST(!text::ChatTemplate::from_tokenizer_config(p, "rag").has_value());
  BOOST_TEST(!text::ChatTemplate::from_tokenizer_config(write("c.json", {{"eos_token", "x"}}))
                  .has_value());
  const std::string err = error_of([&] {
    text::ChatTemplate::from_tokenizer_config(
        write("d.json", {{"chat_template", "{% macro m() %}"}}));
  });
  BOOST_TEST(contains(err, "d.json: chat_template:1:4"), err);
  fs::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(snippets_render_or_fail_as_jinja2_does) {
  // tests/data/chat_templates/snippets.json: small templates for the corners of jinja2
  // (whitespace control, escapes, Python str()/repr of values, operators, slicing, methods,
  // scoping, filters, tests) with jinja2's output, or its error "Type: message".
  const ojson data = read_ordered(kData + "snippets.json");
  const ojson extra = extra_of(data);
  int passed = 0;
  for (const ojson& s : data.at("snippets")) {
    const std::string src = s.at("template").get<std::string>();
    BOOST_TEST_CONTEXT(show(src)) {
      if (s.contains("expected")) {
        std::string got;
        BOOST_CHECK_NO_THROW(
            got = text::ChatTemplate(src, "snippet").render(data.at("messages"), true, extra));
        const std::string want = s.at("expected").get<std::string>();
        BOOST_TEST(got == want, "got " << show(got) << "\nwant " << show(want));
        passed += got == want;
      } else {
        std::string want = s.at("error").get<std::string>();
        want = want.substr(want.find(": ") + 2);  // jinja2's message without the exception type
        const std::string err = error_of(
            [&] { text::ChatTemplate(src, "snippet").render(data.at("messages"), true, extra); });
        BOOST_TEST(contains(err, want), "got " << err << "\nwant " << want);
        BOOST_TEST(contains(err, "snippet:1:"), err);
        passed += contains(err, want);
      }
    }
  }
  BOOST_TEST_MESSAGE("snippets: " << passed << "/" << data.at("snippets").size() << " as jinja2");
}

BOOST_AUTO_TEST_CASE(values_nest_at_most_512_levels) {
  // A value's walkers (its destructor, repr, ==, tojson) recurse once per level: a list built
  // 90,000 deep in two loops of 300 ended ferry train on SIGSEGV. Every list, dict and tuple a
  // render builds is refused past 512 levels (chat_template_ast.h), naming the expression.
  const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  auto render = [&](const std::string& src) {
    return text::ChatTemplate(src, "t").render(msgs, false);
  };
  const std::string deep =
      "{% set ns = namespace(x=[]) %}{% for i in 'x' * 300 %}{% for j in 'x' * 300 %}"
      "{% set ns.x = [ns.x] %}{% endfor %}{% endfor %}{{ ns.x }}";
  BOOST_TEST(
      contains(
          error_of([&] { render(deep); }),
          "t:1:93: a value nested deeper than 512 levels (lists, dicts, tuples and namespaces"),
      error_of([&] { render(deep); }));
  // At the bound (511 wraps of [] are 512 levels) it renders as jinja2 does; one more level is
  // refused whatever builds it: a list, a tuple, a dict, dict(), items, +.
  const std::string at =
      "{% set ns = namespace(x=[]) %}{% for i in 'x' * 511 %}{% set ns.x = [ns.x] %}{% endfor %}";
  BOOST_TEST(
      render(at +
             "{{ ns.x | tojson | length }} {{ ns.x | string | length }} {{ ns.x == ns.x[:] }}") ==
      "1024 1024 True");
  BOOST_TEST(render(at + "{{ (ns.x + ns.x) | length }}{{ ns.x | list | length }}{{ ns.x[0] | "
                         "tojson | length }}") == "211022");
  for (const char* more :
       {"{{ [ns.x] }}", "{{ (ns.x,) }}", "{{ {'a': ns.x} }}", "{{ dict(a=ns.x) }}",
        "{{ {'a': ns.x} | items }}", "{{ {'a': ns.x}.items() }}", "{{ [1] + [ns.x] }}",
        "{% set l = [ns.x] %}"}) {
    BOOST_TEST_CONTEXT(more) {
      const std::string err = error_of([&] { render(at + more); });
      BOOST_TEST(contains(err, "t:1:"), err);
      BOOST_TEST(contains(err, "nested deeper than 512 levels"), err);
    }
  }
  // A conversation deeper than the bound (a caller's own JSON: ferry's readers stop at 512).
  json nested = "x";
  for (int k = 0; k < 600; ++k) nested = json::array({std::move(nested)});
  const std::string err = error_of([&] {
    text::ChatTemplate("{{ 1 }}", "t")
        .render(json::array({{{"role", "user"}, {"content", nested}}}), false);
  });
  BOOST_TEST(
      contains(err, "chat template t: render: messages: a value nested deeper than 512 levels"),
      err);
}

BOOST_AUTO_TEST_CASE(namespaces_inside_namespaces_print_as_python_and_end) {
  // A namespace can hold itself or a chain of namespaces (what it holds changes after it is
  // put in a list, so its depth cannot be fixed when the list is built): printing counts
  // levels through namespaces and prints a cycle as jinja2 does; a chain 2,000 long is
  // destroyed without recursing per link (jinja2 raises RecursionError printing it).
  const json msgs = json::array();
  auto render = [&](const std::string& src) {
    return text::ChatTemplate(src, "t").render(msgs, false);
  };
  BOOST_TEST(render("{% set ns = namespace(x=1) %}{% set ns.x = [ns] %}{{ ns }}") ==
             "<Namespace {'x': [<Namespace {...}>]}>");
  BOOST_TEST(
      render("{% set ns = namespace(x=1, y=[2]) %}{% set ns.x = ns %}{{ ns }}|{{ [ns, ns] }}") ==
      "<Namespace {'x': <Namespace {...}>, 'y': [2]}>|[<Namespace {'x': <Namespace {...}>, 'y': "
      "[2]}>, "
      "<Namespace {'x': <Namespace {...}>, 'y': [2]}>]");
  const std::string chain =
      "{% set h = namespace(n=none) %}{% for i in 'x' * 2000 %}{% set h.n = namespace(n=h.n) %}{% "
      "endfor %}";
  BOOST_TEST(render(chain + "ok {{ h.n.n.n.n is defined }}") == "ok True");
  const std::string err = error_of([&] { render(chain + "{{ h }}"); });
  BOOST_TEST(contains(err, "t:1:101: a value nested deeper than 512 levels"), err);
  // In a loop of 20,000 rounds each new namespace is let go when the next replaces it.
  BOOST_TEST(render("{% set h = namespace(n=none) %}{% for i in 'x' * 20000 %}{% set h.n = "
                    "namespace(s='y' * 1000) "
                    "%}{% endfor %}{{ h.n.s | length }}") == "1000");
}
