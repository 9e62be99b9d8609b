// The BPE model of a tokenizer.json: merges applied by rank, the lowest-ranked adjacent pair
// first and the leftmost among equals (what the library's priority queue does).
#include <array>
#include <cstdio>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "runtime/text/pipeline.h"
#include "runtime/text/unicode.h"

namespace ferry::text {

using nlohmann::json;

struct Bpe::State {
  std::unordered_map<std::string, int32_t> vocab;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a, b) -> (rank, merged id)
  std::array<int32_t, 256> byte_ids{};
  int32_t unk = -1;
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  // The word cache, in shards so that threads encoding at once rarely wait on one lock.
  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>> words;
  };
  mutable std::array<CacheShard, 16> cache;
  CacheShard& shard(const std::string& w) const { return cache[std::hash<std::string>{}(w) % cache.size()]; }
};

namespace {

uint64_t key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

constexpr size_t kCacheEntries = 1 << 16;

}  // namespace

Bpe::Bpe(const json& m, const std::string& where) : s_(std::make_unique<State>()) {
  if (!m.is_object()) refuse(where, "must be an object");
  const std::string type = m.value("type", std::string("BPE"));
  if (type != "BPE") refuse(where + ".type", "model type '" + type + "' is not supported (BPE is)");
  if (m.contains("dropout") && !m["dropout"].is_null()) refuse(where + ".dropout", "BPE dropout is not supported");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(k) && !m[k].is_null() && !(m[k].is_string() && m[k].get<std::string>().empty())) {
      refuse(where + "." + k, "is not supported");
    }
  }
  s_->byte_fallback = m.value("byte_fallback", false);
  s_->fuse_unk = m.value("fuse_unk", false);
  s_->ignore_merges = m.value("ignore_merges", false);
  const json& vocab = m.value("vocab", json());
  if (!vocab.is_object() || vocab.empty()) refuse(where + ".vocab", "must be a non-empty object");
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (1 << 24)) {
      refuse(where + ".vocab[\"" + tok + "\"]", "must be an id in [0, 2^24]");
    }
    s_->vocab[tok] = id.get<int32_t>();
    max_id = std::max(max_id, id.get<int32_t>());
  }
  id_to_token_.assign(static_cast<size_t>(max_id) + 1, std::string());
  for (const auto& [tok, id] : s_->vocab) id_to_token_[static_cast<size_t>(id)] = tok;
  const json& merges = m.value("merges", json::array());
  if (!merges.is_array()) refuse(where + ".merges", "must be a list");
  for (size_t r = 0; r < merges.size(); ++r) {
    std::string a, b;
    const json& e = merges[r];
    if (e.is_string()) {  // "a b" (tokenizers < 0.20)
      const std::string t = e.get<std::string>();
      const size_t sp = t.find(' ');
      if (sp == std::string::npos) refuse(where + ".merges[" + std::to_string(r) + "]", "'" + t + "' is not two tokens");
      a = t.substr(0, sp);
      b = t.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      refuse(where + ".merges[" + std::to_string(r) + "]", "must be \"a b\" or [\"a\", \"b\"]");
    }
    const auto ia = s_->vocab.find(a), ib = s_->vocab.find(b), ic = s_->vocab.find(a + b);
    if (ia == s_->vocab.end() || ib == s_->vocab.end() || ic == s_->vocab.end()) {
      refuse(where + ".merges[" + std::to_string(r) + "]", "'" + a + "' + '" + b + "' uses a token outside the vocabulary");
    }
    s_->merges.emplace(key(ia->second, ib->second), std::make_pair(static_cast<int32_t>(r), ic->second));
  }
  if (const json& u = m.value("unk_token", json()); u.is_string()) {
    const auto it = s_->vocab.find(u.get<std::string>());
    if (it == s_->vocab.end()) refuse(where + ".unk_token", "'" + u.get<std::string>() + "' is not in the vocabulary");
    s_->unk = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const auto it = s_->vocab.find(name);
    s_->byte_ids[static_cast<size_t>(b)] = it == s_->vocab.end() ? -1 : it->second;
  }
}

Bpe::~Bpe() = default;

int32_t Bpe::id(std::string_view token) const {
  const auto it = s_->vocab.find(std::string(token));
  return it == s_->vocab.end() ? -1 : it->second;
}

void Bpe::encode_word(const std::string& word, std::vector<int32_t>& out) const {
  State::CacheShard& cache = s_->shard(word);
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    if (const auto it = cache.words.find(word); it != cache.words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> sym;
  const auto whole = s_->vocab.find(word);
  if (s_->ignore_merges && whole != s_->vocab.end()) {
    sym.push_back(whole->second);
  } else {
    bool last_unk = false;
    for (const std::string& c : utf8_chars(word)) {
      if (const auto it = s_->vocab.find(c); it != s_->vocab.end()) {
        sym.push_back(it->second);
        last_unk = false;
        continue;
      }
      bool bytes_ok = s_->byte_fallback;
      for (const char b : c) bytes_ok = bytes_ok && s_->byte_ids[static_cast<uint8_t>(b)] >= 0;
      if (bytes_ok) {
        for (const char b : c) sym.push_back(s_->byte_ids[static_cast<uint8_t>(b)]);
        last_unk = false;
      } else if (s_->unk >= 0) {
        if (!(s_->fuse_unk && last_unk)) sym.push_back(s_->unk);
        last_unk = true;
      }  // no unk token: the library drops the character too
    }
    while (sym.size() > 1) {
      int32_t best = std::numeric_limits<int32_t>::max(), merged = -1;
      size_t at = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        const auto it = s_->merges.find(key(sym[i], sym[i + 1]));
        if (it != s_->merges.end() && it->second.first < best) {
          best = it->second.first;
          merged = it->second.second;
          at = i;
        }
      }
      if (merged < 0) break;
      sym[at] = merged;
      sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
  }
  out.insert(out.end(), sym.begin(), sym.end());
  std::lock_guard<std::mutex> lock(cache.mu);
  if (cache.words.size() >= kCacheEntries / 16) cache.words.clear();
  if (word.size() < 256) cache.words.emplace(word, std::move(sym));
}

}  // namespace ferry::text
