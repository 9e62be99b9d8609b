// data.format jsonl: fine-tuning records, one JSON object per line.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "base/nesting_limit.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "runtime/train/data.h"

namespace ferry::runtime {

namespace {

struct Builder {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> counted;
  std::vector<size_t> starts{0};
};

}  // namespace

// A friend in spirit of TokenData: builds one through its stream constructor and the
// record fields (data.cpp declares it).
class JsonlLoader {
 public:
  static TokenData make(const DataOptions& o, const std::string& bytes);
};

TokenData load_jsonl(const DataOptions& o, const std::string& bytes) { return JsonlLoader::make(o, bytes); }

TokenData JsonlLoader::make(const DataOptions& o, const std::string& bytes) {
  Builder b;
  const std::string where = "data.path '" + o.path + "'";
  auto encode = [&](const std::string& text, bool specials, int64_t line) {
    std::vector<uint32_t> out;
    if (!o.tokenizer) return ByteTokenizer::encode(text);
    try {
      for (const int32_t id : o.tokenizer->encode(text, specials)) out.push_back(static_cast<uint32_t>(id));
    } catch (const text::TokenizerError& e) {
      throw std::runtime_error(where + ": line " + std::to_string(line) + ": " + e.what());
    }
    return out;
  };
  auto field = [&](const nlohmann::json& rec, const char* key, int64_t line) -> std::string {
    const auto it = rec.find(key);
    if (it == rec.end() || !it->is_string()) {
      throw std::runtime_error(where + ": line " + std::to_string(line) + ": \"" + key + "\" must be a string");
    }
    return it->get<std::string>();
  };
  int64_t line = 0;
  for (size_t at = 0; at < bytes.size();) {
    const size_t nl = bytes.find('\n', at);
    const std::string text = bytes.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    at = nl == std::string::npos ? bytes.size() : nl + 1;
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    base::refuse_deep_json<std::runtime_error>(text, where, line);  // a record nested past the bound
    const nlohmann::json rec = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (rec.is_discarded() || !rec.is_object()) {
      throw std::runtime_error(where + ": line " + std::to_string(line) + ": not a JSON object");
    }
    std::vector<uint32_t> prompt, rest;
    bool conversation = false;
    if (rec.contains("prompt") || rec.contains("completion")) {
      prompt = encode(field(rec, "prompt", line), true, line);
      rest = encode(field(rec, "completion", line), false, line);
    } else if (rec.contains("text")) {
      rest = encode(field(rec, "text", line), true, line);
    } else if (rec.contains("messages")) {
      const std::string at = where + ": line " + std::to_string(line) + ": ";
      if (!o.chat) {
        throw std::runtime_error(at + "\"messages\" records need a chat template: the tokenizer folder has no "
                                      "chat_template.jinja and its tokenizer_config.json no chat_template (give "
                                      "data.chat_template)");
      }
      const nlohmann::json& m = rec["messages"];
      if (!m.is_array() || m.empty()) throw std::runtime_error(at + "\"messages\" must be a non-empty list");
      for (const nlohmann::json& turn : m) {
        if (!turn.is_object() || !turn.contains("role") || !turn["role"].is_string() || !turn.contains("content") ||
            !turn["content"].is_string()) {
          throw std::runtime_error(at + "each message needs \"role\" and \"content\" strings");
        }
      }
      if (m.back()["role"] != "assistant") throw std::runtime_error(at + "the last message must be the assistant's");
      const nlohmann::json extra = {{"bos_token", o.bos_token}, {"eos_token", o.eos_token}};
      std::string before, all;
      try {
        before = o.chat->render(nlohmann::json(m.begin(), m.end() - 1), /*add_generation_prompt=*/true, extra);
        all = o.chat->render(m, /*add_generation_prompt=*/false, extra);
      } catch (const text::ChatTemplateError& e) {
        throw std::runtime_error(at + e.what());
      }
      if (!all.starts_with(before)) {
        throw std::runtime_error(at + "the chat template renders the conversation without its last turn (plus the "
                                      "generation prompt) as text that does not begin the whole rendering: the "
                                      "prompt cannot be told from the reply");
      }
      // The rendering carries the template's own BOS/EOS: no special tokens added here.
      prompt = encode(before, false, line);
      rest = encode(all.substr(before.size()), false, line);
      conversation = true;  // it ends with the template's own end-of-turn: no EOS appended
    } else {
      throw std::runtime_error(where + ": line " + std::to_string(line) +
                               ": a record needs \"text\", \"prompt\" and \"completion\", or \"messages\"");
    }
    if (!conversation && o.eos >= 0) rest.push_back(static_cast<uint32_t>(o.eos));
    if (o.max_record_tokens > 0 && static_cast<int64_t>(prompt.size() + rest.size()) > o.max_record_tokens) {
      throw std::runtime_error(where + ": line " + std::to_string(line) + ": the record has " +
                               std::to_string(prompt.size() + rest.size()) + " tokens, more than block_size + 1 = " +
                               std::to_string(o.max_record_tokens) + " (data.truncate is false)");
    }
    if (prompt.size() + rest.size() < 2) {
      throw std::runtime_error(where + ": line " + std::to_string(line) + ": the record has fewer than 2 tokens");
    }
    for (const std::vector<uint32_t>* part : {&prompt, &rest}) {
      const bool counts = part == &rest || !o.mask_prompt;
      for (const uint32_t id : *part) {
        if (id >= o.vocab_size) {
          throw std::runtime_error(where + ": line " + std::to_string(line) + ": token " + std::to_string(id) +
                                   " is not below model.vocab_size " + std::to_string(o.vocab_size));
        }
        b.tokens.push_back(id);
        b.counted.push_back(counts ? 1 : 0);
      }
    }
    b.starts.push_back(b.tokens.size());
  }
  const size_t n = b.starts.size() - 1;
  if (n == 0) throw std::runtime_error(where + ": no records");
  const auto n_val = std::min(n, static_cast<size_t>(std::llround(o.val_fraction * static_cast<double>(n))));
  TokenData d;
  d.source_ = o.path;
  auto tokens = std::make_shared<std::vector<uint32_t>>(std::move(b.tokens));
  d.all_.append(tokens->data(), tokens->size(), tokens);
  d.rec_tokens_ = tokens->data();
  auto counted = std::make_shared<std::vector<uint8_t>>(std::move(b.counted));
  d.counted_ = counted->data();
  d.keep_.push_back(counted);
  d.starts_ = std::move(b.starts);
  d.n_train_records_ = n - n_val;
  d.n_train_ = d.starts_[d.n_train_records_];
  return d;
}

}  // namespace ferry::runtime
