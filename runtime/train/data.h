// Training data: a byte-level tokenizer, token files, a train/validation split and a
// deterministic batch sampler.
//
// Batches are a pure function of (seed, step, sequence index): sequence i of a step starts
// at an offset drawn from Rng::derive({seed, step, i}). Rank r's micro-batch m holds the
// global sequence indices (m * world + r) * B + b, so the same global batch is read
// whatever the world size and the accumulation steps that make it up.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::runtime {

// Bytes are tokens: vocabulary 256, nothing to download, every input encodes.
struct ByteTokenizer {
  static std::vector<uint16_t> encode(std::string_view text);
  // Printable rendering: bytes that are not valid UTF-8 come out as U+FFFD.
  static std::string decode(std::span<const uint16_t> tokens);
};

class TokenData {
 public:
  // format "text" (bytes) or "uint16" (little-endian token ids). Errors name the path.
  static TokenData load(const std::string& path, const std::string& format, int64_t vocab_size,
                        double val_fraction);
  // The last val_fraction of `tokens` is the validation split.
  TokenData(std::vector<uint16_t> tokens, double val_fraction, std::string source);

  std::span<const uint16_t> train() const { return {tokens_.data(), n_train_}; }
  std::span<const uint16_t> val() const { return {tokens_.data() + n_train_, tokens_.size() - n_train_}; }
  const std::string& source() const { return source_; }

 private:
  std::vector<uint16_t> tokens_;
  size_t n_train_ = 0;
  std::string source_;
};

struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> inputs, targets;  // [B*T] each; targets are inputs shifted by one
};

class BatchSampler {
 public:
  // Throws std::runtime_error when a split is shorter than T + 1 tokens.
  BatchSampler(const TokenData& data, uint64_t seed, int64_t B, int64_t T);
  Batch train_batch(int64_t step, int64_t micro, int rank = 0, int world = 1) const;
  // Validation batch `index`: the same sequences at every evaluation.
  Batch val_batch(int64_t index) const;

 private:
  Batch make(std::span<const uint16_t> split, uint64_t stream, uint64_t a, uint64_t first_seq) const;
  const TokenData& data_;
  uint64_t seed_;
  int64_t B_, T_;
};

// Cross-entropy (nats per token) of the validation split under the training split's
// token frequencies (add-one smoothed): the score of a model that learnt only how often
// each byte occurs. A model that learnt anything about context beats it.
double unigram_baseline(const TokenData& data, int64_t vocab_size);

}  // namespace ferry::runtime
