#include "runtime/train/data.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "nn/dtype.h"
#include "nn/rng.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"

namespace ferry::runtime {

std::vector<uint32_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<uint32_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string ByteTokenizer::decode(std::span<const uint32_t> tokens) {
  std::string bytes;
  for (uint32_t t : tokens) bytes.push_back(static_cast<char>(t & 0xff));
  // Keep well-formed UTF-8 sequences, replace anything else.
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + len <= bytes.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(bytes[i + k]) >> 6) == 2;
    if (ok && (c >= 0x20 || c == '\n' || c == '\t')) {
      out.append(bytes, i, len);
      i += len;
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  return out;
}

// JSONL records: data_jsonl.cpp; token files, memory-mapped: data_tokens.cpp.
TokenData load_jsonl(const DataOptions& o, const std::string& bytes);
TokenData load_token_files(const DataOptions& o);

namespace {

std::string token_list(const text::Tokenizer& t, const std::vector<int32_t>& ids) {
  std::string s;
  for (const int32_t id : ids) s += (s.empty() ? "" : " ") + t.token(id) + " (id " + std::to_string(id) + ")";
  return s;
}

// What the tokenizer's post-processor adds to a text, in words.
std::string post_processor_words(const text::Tokenizer& t) {
  const std::vector<int32_t>& b = t.special_before();
  const std::vector<int32_t>& a = t.special_after();
  if (b.empty() && a.empty()) return "the tokenizer's post-processor adds no special tokens";
  std::string s = "the tokenizer's post-processor puts ";
  if (!b.empty()) s += token_list(t, b) + " before";
  if (!b.empty() && !a.empty()) s += " and ";
  if (!a.empty()) s += token_list(t, a) + " after";
  return s + " it";
}

}  // namespace

std::vector<std::string_view> text_lines(std::string& text) {
  // Python's universal newlines first: "\r\n" and a lone "\r" read as "\n".
  size_t w = 0;
  for (size_t r = 0; r < text.size(); ++r) {
    if (text[r] == '\r') {
      text[w++] = '\n';
      if (r + 1 < text.size() && text[r + 1] == '\n') ++r;
    } else {
      text[w++] = text[r];
    }
  }
  text.resize(w);
  // Then StringIO.readlines(): a line ends after each "\n", which it keeps (other separators
  // str.splitlines knows, U+2028 or a form feed, do not end a line there).
  std::vector<std::string_view> lines;
  const std::string_view all(text);
  size_t begin = 0;
  for (size_t nl = all.find('\n'); nl != std::string_view::npos; nl = all.find('\n', begin)) {
    lines.push_back(all.substr(begin, nl + 1 - begin));
    begin = nl + 1;
  }
  if (begin < all.size()) lines.push_back(all.substr(begin));
  return lines;
}

namespace {

// For the run's header: which special tokens the data got, and from where.
std::string special_tokens_words(const DataOptions& o) {
  if (!o.tokenizer) return "";
  const text::Tokenizer& t = *o.tokenizer;
  if (o.format == "text" && o.text_documents == "lines") {
    return "each line is a document (data.text_documents lines: datasets' text loader with its line ends, as "
           "run_clm reads a .txt), encoded as tokenizer(line) encodes it: " + post_processor_words(t);
  }
  if (o.format == "text") {
    return "the file is one document, encoded as tokenizer(text) encodes it (data.text_documents lines: one per "
           "line): " + post_processor_words(t);
  }
  if (o.format != "jsonl") return "";
  std::string s = "each prompt and text record encoded as tokenizer(text) encodes it: " + post_processor_words(t);
  s += o.eos >= 0 ? "; prompt/completion and text records end with " + token_list(t, {o.eos}) + ", " + o.eos_from
                  : std::string("; no end token appended (the tokenizer names no eos_token, config.json no eos_token_id)");
  if (o.chat) s += "; messages records rendered by the chat template of " + o.chat->where();
  return s;
}

}  // namespace

TokenData TokenData::load(const DataOptions& o) {
  if (!o.val_path.empty()) {
    // data.val_path: data.path is all training, the other file all validation, each read
    // as data.path is (format, tokenizer, special tokens, chat template).
    DataOptions t = o, v = o;
    t.val_path.clear();
    t.val_fraction = 0;
    v.val_path.clear();
    v.path = o.val_path;
    v.val_fraction = 1;
    TokenData d = load(t);
    auto val = [&] {
      try {
        return std::make_shared<const TokenData>(load(v));
      } catch (const std::runtime_error& e) {
        // The loaders name the key they read: here it is data.val_path.
        std::string m = e.what();
        for (size_t at = m.find("data.path"); at != std::string::npos; at = m.find("data.path", at + 13)) {
          m.replace(at, 9, "data.val_path");
        }
        throw std::runtime_error(m);
      }
    }();
    if (val->records() != d.records()) {
      throw std::runtime_error("data.val_path '" + o.val_path + "' holds " + (val->records() ? "records" : "a stream") +
                               " but data.path '" + o.path + "' " + (d.records() ? "records" : "a stream") +
                               "; give the validation data in the training data's form");
    }
    d.val_file_ = std::move(val);
    d.wants_val_ = true;
    return d;
  }
  TokenData d = load_one(o);
  d.wants_val_ = o.val_fraction > 0;
  return d;
}

TokenData TokenData::load_one(const DataOptions& o) {
  if (o.format == "tokens") {
    TokenData d = load_token_files(o);
    d.ids_given_ = true;
    d.tokenizer_ = o.tokenizer;
    d.vocab_ = o.vocab_size;
    return d;
  }
  std::ifstream in(o.path, std::ios::binary);
  if (!in) throw std::runtime_error("data.path: cannot open '" + o.path + "'");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (o.format == "jsonl") {
    TokenData d = load_jsonl(o, bytes);
    d.tokenizer_ = o.tokenizer;
    d.special_ = special_tokens_words(o);
    return d;
  }
  std::vector<uint32_t> tokens;
  if (o.format == "text") {
    if (o.tokenizer) {
      try {
        // One document, or one per line: the special tokens tokenizer(text) adds (Llama 3:
        // <|begin_of_text|>) to each.
        for (const std::string_view doc : o.text_documents == "lines" ? text_lines(bytes)
                                                                       : std::vector<std::string_view>{bytes}) {
          const std::vector<int32_t> ids = o.tokenizer->encode(doc, /*add_special_tokens=*/true);
          tokens.insert(tokens.end(), ids.begin(), ids.end());
        }
      } catch (const text::TokenizerError& e) {
        throw std::runtime_error("data.path '" + o.path + "': " + e.what());
      }
    } else {
      tokens = ByteTokenizer::encode(bytes);
    }
  } else if (o.format == "uint16") {
    if (bytes.size() % 2 != 0) {
      throw std::runtime_error("data.path '" + o.path + "': a uint16 token file must have an even size, it has " +
                               std::to_string(bytes.size()) + " bytes");
    }
    tokens.resize(bytes.size() / 2);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<uint32_t>(static_cast<unsigned char>(bytes[2 * i]) |
                                        (static_cast<unsigned char>(bytes[2 * i + 1]) << 8));
    }
  } else {
    throw std::runtime_error("data.format: unknown format '" + o.format + "'");
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= o.vocab_size) {
      throw std::runtime_error("data.path '" + o.path + "': token " + std::to_string(tokens[i]) + " at index " +
                               std::to_string(i) + " is not below model.vocab_size " + std::to_string(o.vocab_size));
    }
  }
  TokenData d(std::move(tokens), o.val_fraction, o.path);
  d.tokenizer_ = o.tokenizer;
  d.special_ = special_tokens_words(o);
  d.ids_given_ = o.format == "uint16";
  return d;
}

TokenData::TokenData(std::vector<uint32_t> tokens, double val_fraction, std::string source) : source_(std::move(source)) {
  auto owned = std::make_shared<std::vector<uint32_t>>(std::move(tokens));
  all_.append(owned->data(), owned->size(), owned);
  split(val_fraction);
}

void TokenData::split(double val_fraction) {
  const auto n_val = static_cast<size_t>(std::llround(val_fraction * static_cast<double>(all_.size())));
  n_train_ = all_.size() - std::min(n_val, all_.size());
}

TokenData::Record TokenData::record(bool val, size_t index) const {
  if (val && val_file_) return val_file_->record(true, index);
  const size_t i = (val ? n_train_records_ : 0) + index;
  const size_t b = starts_.at(i), e = starts_.at(i + 1);
  return {{rec_tokens_ + b, e - b}, {counted_ + b, e - b}};
}

int64_t TokenData::counted_tokens() const {
  if (!records()) return static_cast<int64_t>(all_.size());
  int64_t n = 0;
  for (size_t r = 0; r + 1 < starts_.size(); ++r)
    for (size_t t = starts_[r] + 1; t < starts_[r + 1]; ++t) n += counted_[t];  // a record's first token is no target
  return n;
}

std::string TokenData::decode(std::span<const uint32_t> tokens) const {
  if (!tokenizer_) return ByteTokenizer::decode(tokens);
  return tokenizer_->decode(std::vector<int32_t>(tokens.begin(), tokens.end()), /*skip_special_tokens=*/false);
}

std::string TokenData::describe() const {
  std::ostringstream s;
  s << source_ << ": ";
  if (records()) {
    s << num_records(false) << " training and " << num_records(true) << " validation records, " << all_.size()
      << " tokens of which " << counted_tokens() << " are trained on";
  } else {
    s << train().size() << " training and " << val().size() << " validation tokens";
  }
  if (val_file_) s << " (validation: all of " << val_file_->source() << ")";
  if (!wants_val_) s << " (data.val_fraction 0: no validation, every " << (records() ? "record" : "token") << " trains)";
  // Without a tokenizer, text and JSONL are bytes; uint16 and token files hold ids already.
  s << (tokenizer_ ? " (the model's tokenizer)" : ids_given_ ? " (token ids as given)" : " (bytes as tokens)");
  if (!special_.empty()) s << "; " << special_;
  return s.str();
}

BatchSampler::BatchSampler(const TokenData& data, uint64_t seed, int64_t B, int64_t T, bool packed)
    : data_(data), seed_(seed), B_(B), T_(T), packed_(packed && data.records()) {
  if (packed && !data.records()) throw std::runtime_error("data.packing packed needs records (data.format jsonl)");
  if (data.records()) {
    if (data.num_records(false) == 0 || (data.wants_validation() && data.num_records(true) == 0)) {
      throw std::runtime_error("data '" + data.source() + "': " + std::to_string(data.num_records(false)) +
                               " training and " + std::to_string(data.num_records(true)) +
                               " validation records; each split needs one at least (data.val_fraction, data.val_path)");
    }
    for (bool val : {false, true})
      for (size_t r = 0; r < data.num_records(val); ++r)
        truncated_ += static_cast<int64_t>(data.record(val, r).tokens.size()) > T + 1;
    return;
  }
  const auto need = static_cast<size_t>(T + 1);
  if (data.train().size() < need || (data.wants_validation() && data.val().size() < need)) {
    throw std::runtime_error("data '" + data.source() + "': the train split (" + std::to_string(data.train().size()) +
                             " tokens) and the validation split (" + std::to_string(data.val().size()) +
                             " tokens) each need at least block_size + 1 = " + std::to_string(need) + " tokens");
  }
}

Batch BatchSampler::make(const TokenView& split, uint64_t stream, uint64_t a, uint64_t first_seq) const {
  Batch batch;
  batch.B = B_;
  batch.T = T_;
  batch.inputs.resize(static_cast<size_t>(B_ * T_));
  batch.targets.resize(static_cast<size_t>(B_ * T_));
  const uint64_t starts = split.size() - static_cast<uint64_t>(T_);  // offsets with T+1 tokens after them
  std::vector<uint32_t> window;
  for (int64_t b = 0; b < B_; ++b) {
    nn::Rng rng = nn::Rng::derive({seed_, stream, a, first_seq + static_cast<uint64_t>(b)});
    const uint64_t off = rng.below(starts);
    window.resize(static_cast<size_t>(T_ + 1));
    split.copy(off, window.size(), window.data());
    for (const uint32_t id : window) {
      if (id >= data_.vocab_size()) {
        throw std::runtime_error("data '" + data_.source() + "': token " + std::to_string(id) + " near index " +
                                 std::to_string(off) + " of the " + (stream == 0 ? "training" : "validation") +
                                 " split is not below model.vocab_size " + std::to_string(data_.vocab_size()));
      }
    }
    for (int64_t t = 0; t < T_; ++t) {
      batch.inputs[static_cast<size_t>(b * T_ + t)] = static_cast<int32_t>(window[static_cast<size_t>(t)]);
      batch.targets[static_cast<size_t>(b * T_ + t)] = static_cast<int32_t>(window[static_cast<size_t>(t + 1)]);
    }
  }
  return batch;
}

void BatchSampler::fill_row(Batch& batch, int64_t row, const TokenData::Record& r) const {
  const auto L = static_cast<int64_t>(r.tokens.size());
  for (int64_t t = 0; t < T_; ++t) {
    const auto i = static_cast<size_t>(row * T_ + t);
    batch.inputs[i] = t < L ? static_cast<int32_t>(r.tokens[static_cast<size_t>(t)]) : 0;  // padding: any id
    const bool counts = t + 1 < L && r.counted[static_cast<size_t>(t + 1)];
    batch.targets[i] = counts ? static_cast<int32_t>(r.tokens[static_cast<size_t>(t + 1)]) : nn::kIgnoreTarget;
  }
}

const std::vector<uint32_t>& BatchSampler::permutation(uint64_t epoch) const {
  if (epoch != perm_epoch_) {
    const size_t n = data_.num_records(false);
    perm_.resize(n);
    for (size_t i = 0; i < n; ++i) perm_[i] = static_cast<uint32_t>(i);
    nn::Rng rng = nn::Rng::derive({seed_, /*stream=*/2, epoch});
    for (size_t i = n; i > 1; --i) std::swap(perm_[i - 1], perm_[rng.below(i)]);  // Fisher-Yates
    perm_epoch_ = epoch;
  }
  return perm_;
}

Batch BatchSampler::train_batch(int64_t step, int64_t micro, int rank, int world, int64_t accum) const {
  const auto first = static_cast<uint64_t>((micro * world + rank) * B_);
  if (!data_.records()) return make(data_.train(), /*stream=*/0, static_cast<uint64_t>(step), first);
  Batch batch{B_, T_, std::vector<int32_t>(static_cast<size_t>(B_ * T_)), std::vector<int32_t>(static_cast<size_t>(B_ * T_)), {}};
  const auto per_step = static_cast<uint64_t>(B_ * world * accum);
  if (packed_) {
    batch.doc_start.resize(static_cast<size_t>(B_ * T_));
    for (int64_t b = 0; b < B_; ++b) {
      fill_packed(batch, b, static_cast<uint64_t>(step) * per_step + first + static_cast<uint64_t>(b));
    }
    return batch;
  }
  const uint64_t n = data_.num_records(false);
  for (int64_t b = 0; b < B_; ++b) {
    const uint64_t g = static_cast<uint64_t>(step) * per_step + first + static_cast<uint64_t>(b);
    fill_row(batch, b, data_.record(false, permutation(g / n)[g % n]));
  }
  return batch;
}

Batch BatchSampler::val_batch(int64_t index) const {
  if (!data_.records()) return make(data_.val(), /*stream=*/1, static_cast<uint64_t>(index), 0);
  Batch batch{B_, T_, std::vector<int32_t>(static_cast<size_t>(B_ * T_)), std::vector<int32_t>(static_cast<size_t>(B_ * T_)), {}};
  for (int64_t b = 0; b < B_; ++b) {
    fill_row(batch, b, data_.record(true, static_cast<size_t>(index * B_ + b) % data_.num_records(true)));
  }
  return batch;
}

void BatchSampler::pack(uint64_t epoch, Packing& into) const {
  const std::vector<uint32_t>& perm = permutation(epoch);
  into.epoch = epoch;
  into.begin.assign(1, 0);
  int64_t used = 0;
  for (uint32_t k = 0; k < perm.size(); ++k) {
    const auto L = static_cast<int64_t>(data_.record(false, perm[k]).tokens.size());
    if (used > 0 && used + L > T_) {
      into.begin.push_back(k);
      used = 0;
    }
    used += std::min(L, T_);
  }
  into.begin.push_back(static_cast<uint32_t>(perm.size()));
}

void BatchSampler::fill_packed(Batch& batch, int64_t row, uint64_t window) const {
  // The epoch holding this window. epoch_first_window_[e] is where epoch e starts; its last
  // entry is where the first epoch not yet counted starts (epochs are counted in order).
  if (epoch_first_window_.empty()) epoch_first_window_.push_back(0);
  while (window >= epoch_first_window_.back()) {
    Packing scratch;
    pack(epoch_first_window_.size() - 1, scratch);
    epoch_first_window_.push_back(epoch_first_window_.back() + scratch.begin.size() - 1);
  }
  const auto e = static_cast<uint64_t>(
      std::upper_bound(epoch_first_window_.begin(), epoch_first_window_.end(), window) - epoch_first_window_.begin() - 1);
  if (packing_.epoch != e) pack(e, packing_);
  const std::vector<uint32_t>& perm = permutation(e);
  const uint64_t w = window - epoch_first_window_[e];
  int64_t p = 0;
  for (uint32_t k = packing_.begin[w]; k < packing_.begin[w + 1]; ++k) {
    const TokenData::Record r = data_.record(false, perm[k]);
    const auto L = static_cast<int64_t>(r.tokens.size());
    for (int64_t t = 0; t < L && p + t < T_; ++t) {
      const auto i = static_cast<size_t>(row * T_ + p + t);
      batch.inputs[i] = static_cast<int32_t>(r.tokens[static_cast<size_t>(t)]);
      const bool counts = t + 1 < L && r.counted[static_cast<size_t>(t + 1)];
      batch.targets[i] = counts ? static_cast<int32_t>(r.tokens[static_cast<size_t>(t + 1)]) : nn::kIgnoreTarget;
      batch.doc_start[i] = static_cast<int32_t>(p);
    }
    p += std::min(L, T_ - p);
  }
  for (; p < T_; ++p) {  // padding: each position its own document
    const auto i = static_cast<size_t>(row * T_ + p);
    batch.inputs[i] = 0;
    batch.targets[i] = nn::kIgnoreTarget;
    batch.doc_start[i] = static_cast<int32_t>(p);
  }
}

double BatchSampler::records_per_row() const {
  if (!packed_) return 1.0;
  Packing first;
  pack(0, first);
  return static_cast<double>(data_.num_records(false)) / static_cast<double>(first.begin.size() - 1);
}

double unigram_baseline(const TokenData& data, int64_t vocab_size) {
  // At most the first 16M tokens of each split: a large corpus is not read whole for it.
  constexpr size_t kMax = size_t{1} << 24;
  const TokenView train = data.train(), val = data.val();
  const size_t nt = std::min(train.size(), kMax), nv = std::min(val.size(), kMax);
  std::vector<double> counts(static_cast<size_t>(vocab_size), 1.0);
  std::vector<uint32_t> buf(std::min<size_t>(kMax, std::max(nt, nv)));
  train.copy(0, nt, buf.data());
  for (size_t i = 0; i < nt; ++i) counts[std::min<size_t>(buf[i], counts.size() - 1)] += 1.0;
  const double total = static_cast<double>(nt) + static_cast<double>(vocab_size);
  val.copy(0, nv, buf.data());
  double nll = 0;
  for (size_t i = 0; i < nv; ++i) nll -= std::log(counts[std::min<size_t>(buf[i], counts.size() - 1)] / total);
  return nll / static_cast<double>(std::max<size_t>(1, nv));
}

}  // namespace ferry::runtime
