// Chat templates (runtime/text/chat_template.h). An input that begins with '{"' is a
// tokenizer_config.json (read through ChatTemplate::from_tokenizer_config), anything else the
// Jinja source of a template. A template that parses is rendered for a fixed conversation,
// with and without the generation prompt: it gives text or a ChatTemplateError naming the
// template's source.
#include "runtime/text/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

namespace {
const nlohmann::json& messages() {
  static const nlohmann::json m = nlohmann::json::parse(R"([
    {"role": "system", "content": "You answer in verse."},
    {"role": "user", "content": "Gen 1:1: In the beginning"},
    {"role": "assistant", "content": "God created the heaven"},
    {"role": "user", "content": "and the earth\n"}
  ])");
  return m;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using ferry::text::ChatTemplate;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string dir = ferry::fuzz::scratch().fresh();
  const bool config = input.starts_with("{\"");
  const std::string path = dir + (config ? "/tokenizer_config.json" : "/template.jinja");
  ferry::fuzz::write_file(path, input);
  ferry::fuzz::expect_result_or_named_error(path, [&] {
    std::optional<ChatTemplate> t;
    if (config) {
      t = ChatTemplate::from_tokenizer_config(path);
      if (!t) return;
    } else {
      t.emplace(std::string(input), path);
    }
    t->set_strftime_now([](const std::string&) { return std::string("26 Nov 2025"); });
    const nlohmann::json extra = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
    for (bool gen : {true, false}) (void)t->render(messages(), gen, extra);
  });
  return 0;
}
