#include "runtime/train/data.h"

#include <cmath>
#include <fstream>
#include <stdexcept>

#include "nn/rng.h"

namespace ferry::runtime {

std::vector<uint16_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<uint16_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string ByteTokenizer::decode(std::span<const uint16_t> tokens) {
  std::string bytes;
  for (uint16_t t : tokens) bytes.push_back(static_cast<char>(t & 0xff));
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

TokenData TokenData::load(const std::string& path, const std::string& format, int64_t vocab_size,
                          double val_fraction) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("data.path: cannot open '" + path + "'");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<uint16_t> tokens;
  if (format == "text") {
    tokens = ByteTokenizer::encode(bytes);
  } else if (format == "uint16") {
    if (bytes.size() % 2 != 0) {
      throw std::runtime_error("data.path '" + path + "': a uint16 token file must have an even size, it has " +
                               std::to_string(bytes.size()) + " bytes");
    }
    tokens.resize(bytes.size() / 2);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<uint16_t>(static_cast<unsigned char>(bytes[2 * i]) |
                                        (static_cast<unsigned char>(bytes[2 * i + 1]) << 8));
    }
  } else {
    throw std::runtime_error("data.format: unknown format '" + format + "'");
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size) {
      throw std::runtime_error("data.path '" + path + "': token " + std::to_string(tokens[i]) + " at index " +
                               std::to_string(i) + " is not below model.vocab_size " + std::to_string(vocab_size));
    }
  }
  return TokenData(std::move(tokens), val_fraction, path);
}

TokenData::TokenData(std::vector<uint16_t> tokens, double val_fraction, std::string source)
    : tokens_(std::move(tokens)), source_(std::move(source)) {
  const auto n_val = static_cast<size_t>(std::llround(val_fraction * static_cast<double>(tokens_.size())));
  n_train_ = tokens_.size() - std::min(n_val, tokens_.size());
}

BatchSampler::BatchSampler(const TokenData& data, uint64_t seed, int64_t B, int64_t T)
    : data_(data), seed_(seed), B_(B), T_(T) {
  const auto need = static_cast<size_t>(T + 1);
  if (data.train().size() < need || data.val().size() < need) {
    throw std::runtime_error("data '" + data.source() + "': the train split (" + std::to_string(data.train().size()) +
                             " tokens) and the validation split (" + std::to_string(data.val().size()) +
                             " tokens) each need at least block_size + 1 = " + std::to_string(need) + " tokens");
  }
}

Batch BatchSampler::make(std::span<const uint16_t> split, uint64_t stream, uint64_t a, uint64_t first_seq) const {
  Batch batch;
  batch.B = B_;
  batch.T = T_;
  batch.inputs.resize(static_cast<size_t>(B_ * T_));
  batch.targets.resize(static_cast<size_t>(B_ * T_));
  const uint64_t starts = split.size() - static_cast<uint64_t>(T_);  // offsets with T+1 tokens after them
  for (int64_t b = 0; b < B_; ++b) {
    nn::Rng rng = nn::Rng::derive({seed_, stream, a, first_seq + static_cast<uint64_t>(b)});
    const uint64_t off = rng.below(starts);
    for (int64_t t = 0; t < T_; ++t) {
      batch.inputs[static_cast<size_t>(b * T_ + t)] = split[off + static_cast<uint64_t>(t)];
      batch.targets[static_cast<size_t>(b * T_ + t)] = split[off + static_cast<uint64_t>(t) + 1];
    }
  }
  return batch;
}

Batch BatchSampler::train_batch(int64_t step, int64_t micro, int rank, int world) const {
  const auto first = static_cast<uint64_t>((micro * world + rank) * B_);
  return make(data_.train(), /*stream=*/0, static_cast<uint64_t>(step), first);
}

Batch BatchSampler::val_batch(int64_t index) const {
  return make(data_.val(), /*stream=*/1, static_cast<uint64_t>(index), 0);
}

double unigram_baseline(const TokenData& data, int64_t vocab_size) {
  std::vector<double> counts(static_cast<size_t>(vocab_size), 1.0);
  for (uint16_t t : data.train()) counts[t] += 1.0;
  const double total = static_cast<double>(data.train().size()) + static_cast<double>(vocab_size);
  double nll = 0;
  for (uint16_t t : data.val()) nll -= std::log(counts[t] / total);
  return nll / static_cast<double>(data.val().size());
}

}  // namespace ferry::runtime
