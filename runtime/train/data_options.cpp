// data_options (runtime/train/trainer.h): how a run's configuration reads its data, the
// tokenizer and the chat template, kept apart from the training loop.
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "runtime/train/trainer.h"

namespace ferry::runtime {

namespace {

nlohmann::json read_json_or_null(const std::filesystem::path& p) {
  std::ifstream in(p);
  return in ? nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false) : nlohmann::json();
}

// A token named in tokenizer_config.json: a string or {"content": ...}; "" when absent.
std::string config_token(const nlohmann::json& tc, const char* key) {
  if (!tc.is_object() || !tc.contains(key)) return "";
  const nlohmann::json& e = tc[key];
  return e.is_string() ? e.get<std::string>() : e.is_object() ? e.value("content", "") : "";
}

// The EOS id a model folder names (config.json's eos_token_id, else the id of
// tokenizer_config.json's eos_token), or -1.
int32_t folder_eos(const std::filesystem::path& dir, const std::string& eos_token, const text::Tokenizer& tok) {
  const nlohmann::json config = read_json_or_null(dir / "config.json");
  if (config.is_object() && config.contains("eos_token_id")) {
    const nlohmann::json& e = config["eos_token_id"];
    if (e.is_number_integer()) return e.get<int32_t>();
    if (e.is_array() && !e.empty() && e[0].is_number_integer()) return e[0].get<int32_t>();
  }
  return eos_token.empty() ? -1 : tok.token_id(eos_token);
}

}  // namespace

DataOptions data_options(const Config& c) {
  DataOptions o;
  o.path = c.data.path;
  o.format = c.data.format;
  o.vocab_size = c.model.vocab_size;
  o.val_fraction = c.data.val_fraction;
  o.mask_prompt = c.data.mask_prompt;
  o.dtype = c.data.dtype;
  if (!c.data.truncate) o.max_record_tokens = c.model.block_size + 1;
  std::string tok_path;
  if (c.data.tokenizer == "auto") {
    const auto p = std::filesystem::path(c.init_from) / "tokenizer.json";
    if (!c.init_from.empty() && std::filesystem::exists(p)) tok_path = p.string();
  } else if (c.data.tokenizer != "bytes") {
    tok_path = c.data.tokenizer;
  }
  if (tok_path.empty() || c.data.format == "uint16") return o;
  try {
    auto tok = std::make_shared<text::Tokenizer>(text::Tokenizer::from_file(tok_path));
    if (tok->vocab_size() > c.model.vocab_size) {
      throw ConfigError(tok_path + ": the tokenizer has " + std::to_string(tok->vocab_size()) +
                        " ids but model.vocab_size is " + std::to_string(c.model.vocab_size));
    }
    const std::filesystem::path folder = std::filesystem::path(tok_path).parent_path();
    // The token strings the chat template refers to, and the EOS records end with.
    const std::filesystem::path tc = folder / "tokenizer_config.json";
    const nlohmann::json tc_json = read_json_or_null(tc);
    o.bos_token = config_token(tc_json, "bos_token");
    o.eos_token = config_token(tc_json, "eos_token");
    o.eos = folder_eos(folder, o.eos_token, *tok);
    if (o.eos >= c.model.vocab_size) o.eos = -1;
    o.tokenizer = std::move(tok);
    std::string chat = c.data.chat_template == "auto" ? tc.string() : c.data.chat_template;
    if (c.data.format == "jsonl" && std::filesystem::exists(chat)) {
      if (chat.ends_with(".json")) {
        if (auto t = text::ChatTemplate::from_tokenizer_config(chat)) o.chat = std::make_shared<text::ChatTemplate>(std::move(*t));
      } else {
        std::ifstream in(chat);
        std::stringstream ss;
        ss << in.rdbuf();
        o.chat = std::make_shared<text::ChatTemplate>(ss.str(), chat);
      }
    } else if (c.data.chat_template != "auto") {
      throw ConfigError("data.chat_template: cannot open '" + chat + "'");
    }
  } catch (const text::TokenizerError& e) {
    throw ConfigError(std::string("data.tokenizer: ") + e.what());
  } catch (const text::ChatTemplateError& e) {
    throw ConfigError(std::string("data.chat_template: ") + e.what());
  }
  return o;
}

}  // namespace ferry::runtime
