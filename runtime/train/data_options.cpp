// data_options (runtime/train/trainer.h): how a run's configuration reads its data, the
// tokenizer, its special tokens and the chat template, kept apart from the training loop.
// Each choice follows what transformers 5 does with the same folder (AutoTokenizer's
// from_pretrained), and is recorded in DataOptions for the run's header.
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "base/nesting_limit.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "runtime/train/trainer.h"

namespace ferry::runtime {

namespace {

namespace fs = std::filesystem;

nlohmann::json read_json_or_null(const fs::path& p) {
  std::ifstream in(p);
  return in ? base::parse_json<std::runtime_error>(in, p.string(), /*allow_exceptions=*/false) : nlohmann::json();
}

// A token named in tokenizer_config.json or special_tokens_map.json: a string or
// {"content": ...}; "" when absent.
std::string config_token(const nlohmann::json& tc, const char* key) {
  if (!tc.is_object() || !tc.contains(key)) return "";
  const nlohmann::json& e = tc[key];
  return e.is_string() ? e.get<std::string>() : e.is_object() ? e.value("content", "") : "";
}

// A special token's text and the file that named it, as transformers 5 reads them:
// tokenizer_config.json's value; a tokenizer_config.json without "added_tokens_decoder"
// (an older save) takes special_tokens_map.json's value over its own.
struct Named {
  std::string text, file;
};
Named special_token(const fs::path& folder, const nlohmann::json& tc, const char* key) {
  const bool legacy = !tc.is_object() || !tc.contains("added_tokens_decoder");
  if (legacy) {
    const std::string from_map = config_token(read_json_or_null(folder / "special_tokens_map.json"), key);
    if (!from_map.empty()) return {from_map, "special_tokens_map.json"};
  }
  const std::string from_tc = config_token(tc, key);
  return from_tc.empty() ? Named{} : Named{from_tc, "tokenizer_config.json"};
}

// The token appended to prompt/completion and text records: the tokenizer's own
// eos_token, as the Trainer's data collators and TRL use (tokenizer.eos_token_id), not
// config.json's eos_token_id, which for Llama 3.x Instruct is a list of the tokens that
// stop generation ([<|end_of_text|>, <|eom_id|>, <|eot_id|>]) whose first is not the end
// of a turn. config.json is read only where the tokenizer names no eos_token.
void choose_eos(DataOptions& o, const fs::path& folder, const Named& eos, const text::Tokenizer& tok,
                const std::string& tok_path, int64_t vocab) {
  if (!eos.text.empty()) {
    o.eos = tok.token_id(eos.text);
    if (o.eos < 0) {
      throw ConfigError((folder / eos.file).string() + ": eos_token '" + eos.text + "' is not a token of " + tok_path);
    }
    o.eos_from = eos.file + "'s eos_token";
    return;
  }
  const fs::path cfg_path = folder / "config.json";
  const nlohmann::json config = read_json_or_null(cfg_path);
  if (!config.is_object() || !config.contains("eos_token_id")) return;
  const nlohmann::json& e = config["eos_token_id"];
  const bool list = e.is_array() && !e.empty() && e[0].is_number_integer();
  if (!e.is_number_integer() && !list) return;  // null: the model names none
  const int64_t id = list ? e[0].get<int64_t>() : e.get<int64_t>();
  if (id < 0 || id >= tok.vocab_size() || id >= vocab) {
    throw ConfigError(cfg_path.string() + ": eos_token_id " + std::to_string(id) + " is not an id of " + tok_path);
  }
  o.eos = static_cast<int32_t>(id);
  o.eos_token = tok.token(o.eos);
  o.eos_from = list ? "the first of config.json's eos_token_id " + e.dump() + " (the tokenizer names no eos_token)"
                    : "config.json's eos_token_id (the tokenizer names no eos_token)";
}

// data.chat_template auto, as transformers 5 loads a tokenizer folder: chat_template.jinja
// beside tokenizer_config.json (what transformers 5 saves) takes priority over
// tokenizer_config.json's "chat_template" key (what older versions save). chat_template.json
// belongs to processors (AutoProcessor), not tokenizers: it is read only when named.
std::shared_ptr<text::ChatTemplate> load_chat_template(const std::string& setting, const fs::path& folder) {
  std::string chat = setting;
  if (setting == "auto") {
    chat = fs::exists(folder / "chat_template.jinja") ? (folder / "chat_template.jinja").string()
                                                      : (folder / "tokenizer_config.json").string();
    if (!fs::exists(chat)) return nullptr;
  } else if (!fs::exists(chat)) {
    throw ConfigError("data.chat_template: cannot open '" + chat + "'");
  }
  if (chat.ends_with(".json")) {
    auto t = text::ChatTemplate::from_tokenizer_config(chat);
    return t ? std::make_shared<text::ChatTemplate>(std::move(*t)) : nullptr;
  }
  std::ifstream in(chat);
  if (!in) throw ConfigError("data.chat_template: cannot open '" + chat + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return std::make_shared<text::ChatTemplate>(ss.str(), chat);
}

}  // namespace

DataOptions data_options(const Config& c) {
  DataOptions o;
  o.path = c.data.path;
  o.format = c.data.format;
  o.vocab_size = c.model.vocab_size;
  o.val_fraction = c.data.val_fraction;
  o.val_path = c.data.val_path;
  o.text_documents = c.data.text_documents;
  o.mask_prompt = c.data.mask_prompt;
  o.dtype = c.data.dtype;
  if (!c.data.truncate) o.max_record_tokens = c.model.block_size + 1;
  std::string tok_path;
  if (c.data.tokenizer == "auto") {
    const auto p = fs::path(c.init_from) / "tokenizer.json";
    if (!c.init_from.empty() && fs::exists(p)) tok_path = p.string();
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
    const fs::path folder = fs::path(tok_path).parent_path();
    // The token strings the chat template refers to, and the EOS records end with.
    const nlohmann::json tc_json = read_json_or_null(folder / "tokenizer_config.json");
    o.bos_token = special_token(folder, tc_json, "bos_token").text;
    const Named eos = special_token(folder, tc_json, "eos_token");
    o.eos_token = eos.text;
    choose_eos(o, folder, eos, *tok, tok_path, c.model.vocab_size);
    o.tokenizer = std::move(tok);
    if (c.data.format == "jsonl") o.chat = load_chat_template(c.data.chat_template, folder);
  } catch (const text::TokenizerError& e) {
    throw ConfigError(std::string("data.tokenizer: ") + e.what());
  } catch (const text::ChatTemplateError& e) {
    throw ConfigError(std::string("data.chat_template: ") + e.what());
  }
  return o;
}

}  // namespace ferry::runtime
