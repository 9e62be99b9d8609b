// Training data: byte-level or Hugging Face tokenizers, token streams, JSONL fine-tuning
// records with loss masks, a train/validation split and a deterministic batch sampler.
//
// Two kinds of data:
// - a stream (data.format text or uint16): one token sequence; sequence i of a step is a
//   window of block_size + 1 tokens at an offset drawn from Rng::derive({seed, step, i}).
//   A text file through a tokenizer is one document, encoded as the Hugging Face tokenizer
//   encodes it (tokenizer(text), add_special_tokens=True): the post-processor's tokens
//   (Llama 3's <|begin_of_text|>) come before and after it;
// - records (data.format jsonl): one line per example, {"text": ...} or {"prompt": ...,
//   "completion": ...} or {"messages": [{"role", "content"}, ...]} (a conversation, rendered
//   by the chat template: the prompt is everything before the last turn, which must be the
//   assistant's, plus the generation prompt; the completion is the rest of the rendering),
//   each encoded to tokens (the prompt and a text record as tokenizer(text) encodes them,
//   with the post-processor's tokens; the completion without; then EOS for the first two kinds)
//   with a per-token flag: does the loss count when this token is the target. With
//   mask_prompt the prompt's tokens do not count (only the completion is learnt). A row of
//   a batch holds one record, cut at block_size + 1 tokens and padded after its end; padding
//   and uncounted targets are kIgnoreTarget, so the loss is the mean over counted tokens.
//   Training records are visited in epochs, each a permutation drawn from (seed, epoch):
//   global sequence g of the run is record perm(g / n)[g % n]. Packed (data.packing
//   packed): consecutive records of the epoch's permutation share a row while they fit
//   whole (a longer one starts a row and is cut), each attending only within itself
//   (Batch::doc_start); global sequence g is the epoch's windows in order. Validation rows
//   hold one record each either way.
// Either way batches are a pure function of (seed, step, global sequence index): rank r's
// micro-batch m of a step holds the global sequences (m * world + r) * B + b of the step,
// so the same global batch is read whatever the world size and accumulation split.
// Errors: std::runtime_error naming the file (and for JSONL the line).
// Threads: TokenData is immutable; a BatchSampler is used by one thread.
#pragma once

#include <climits>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/train/token_view.h"

namespace ferry::text {
class Tokenizer;
class ChatTemplate;
}

namespace ferry::runtime {

// Bytes are tokens: vocabulary 256, nothing to download, every input encodes.
struct ByteTokenizer {
  static std::vector<uint32_t> encode(std::string_view text);
  // Printable rendering: bytes that are not valid UTF-8 come out as U+FFFD.
  static std::string decode(std::span<const uint32_t> tokens);
};

// The lines of a text file as Hugging Face datasets' text loader reads them for run_clm
// (sample_by "line", keep_linebreaks): Python's universal newlines ("\r\n" and "\r" become
// "\n", in `text` itself), then a line after each "\n", kept (StringIO.readlines). Views
// into `text`.
std::vector<std::string_view> text_lines(std::string& text);

struct DataOptions {
  std::string path;
  std::string format = "text";  // text | uint16 | tokens | jsonl
  std::string dtype = "auto";   // tokens: uint16 | uint32 | auto (by vocab_size; a ferry tokenize folder says)
  int64_t vocab_size = 256;
  // The validation split: the last val_fraction of `path` (0: none, every record trains),
  // or, with val_path, all of that file (read in the same format) and none of `path`.
  double val_fraction = 0.05;
  std::string val_path;
  // data.format text through a tokenizer: "file", one document (tokenizer(text)), or
  // "lines", one per line as the datasets text loader splits a file (text_lines).
  std::string text_documents = "file";
  std::shared_ptr<const text::Tokenizer> tokenizer;  // null: bytes are tokens
  bool mask_prompt = true;
  // Appended to every prompt/completion and text record when >= 0: the tokenizer's
  // eos_token (data_options: tokenizer_config.json, as tokenizer.eos_token_id), else
  // config.json's eos_token_id. eos_from says which, for the run's header.
  int32_t eos = -1;
  std::string eos_from;
  // {"messages": [...]} records: rendered by the model's chat template, with these tokens.
  std::shared_ptr<const text::ChatTemplate> chat;
  std::string bos_token, eos_token;
  // Records longer than this many tokens (block_size + 1) are an error naming the line;
  // 0: they are cut to fit a row (data.truncate).
  int64_t max_record_tokens = 0;
};

class TokenData {
 public:
  static TokenData load(const DataOptions& options);
  // A stream whose last val_fraction is the validation split.
  TokenData(std::vector<uint32_t> tokens, double val_fraction, std::string source);

  // Streams: the two splits. Records: the tokens of the training / validation records.
  // With a validation file (DataOptions::val_path) the validation side is that file's.
  TokenView train() const { return all_.sub(0, n_train_); }
  TokenView val() const { return val_file_ ? val_file_->val() : all_.sub(n_train_, all_.size() - n_train_); }
  const std::string& source() const { return source_; }
  // Whether the run evaluates: a validation fraction above 0 or a validation file.
  bool wants_validation() const { return wants_val_; }

  bool records() const { return !starts_.empty(); }
  size_t num_records(bool val) const {
    if (val && val_file_) return val_file_->num_records(true);
    return val ? starts_.size() - 1 - n_train_records_ : n_train_records_;
  }
  struct Record {
    std::span<const uint32_t> tokens;
    std::span<const uint8_t> counted;  // counted[t]: the loss counts where tokens[t] is the target
  };
  Record record(bool val, size_t index) const;
  int64_t counted_tokens() const;  // over all records (streams: every token)
  // The text of tokens, through the tokenizer or as bytes.
  std::string decode(std::span<const uint32_t> tokens) const;
  std::string describe() const;  // for the run's header
  // The special tokens the data got and where each came from ("" with bytes as tokens).
  const std::string& special_tokens() const { return special_; }
  // ferry tokenize: writes DIR/tokens.bin (uint32), for records DIR/counted.bin (uint8) and
  // DIR/starts.bin (uint64, records + 1), and DIR/meta.json; data.format tokens reads it
  // back memory-mapped. Throws std::runtime_error naming the file.
  void save(const std::string& dir) const;
  int64_t vocab_size() const { return vocab_; }
  bool has_tokenizer() const { return tokenizer_ != nullptr; }  // false: ids are bytes, or token files' own

 private:
  friend class JsonlLoader;
  friend class TokenFiles;
  TokenData() = default;
  static TokenData load_one(const DataOptions& options);  // one file, its own split
  void split(double val_fraction);  // a stream's n_train_
  TokenView all_;
  // Records only: their tokens (contiguous uint32), flags and bounds (record i is
  // [starts_[i], starts_[i + 1])), in owned vectors or memory-mapped files (keep_).
  const uint32_t* rec_tokens_ = nullptr;
  const uint8_t* counted_ = nullptr;
  std::vector<size_t> starts_;
  std::vector<std::shared_ptr<const void>> keep_;
  size_t n_train_ = 0, n_train_records_ = 0;
  std::string source_, special_;
  std::shared_ptr<const TokenData> val_file_;  // data.val_path: all of it is the validation split
  bool wants_val_ = true;
  bool ids_given_ = false;  // uint16 and token files: ids, not bytes (describe())
  std::shared_ptr<const text::Tokenizer> tokenizer_;
  int64_t vocab_ = INT64_MAX;  // ids are checked below it as windows are read (mapped files)
};

struct Batch {
  int64_t B = 0, T = 0;
  // [B*T] each; a stream's targets are the inputs shifted by one; a record's are
  // kIgnoreTarget where the loss does not count (prompt, padding, a document's last token).
  std::vector<int32_t> inputs, targets;
  // Packed rows only ([B*T], else empty): the first position of each position's document.
  std::vector<int32_t> doc_start;
};

class BatchSampler {
 public:
  // Throws std::runtime_error when a stream's split is shorter than T + 1 tokens, or a
  // record split is empty (the validation split only where the data wants validation).
  BatchSampler(const TokenData& data, uint64_t seed, int64_t B, int64_t T, bool packed = false);
  // accum: the micro-batches per step (records' epochs count whole steps of sequences).
  Batch train_batch(int64_t step, int64_t micro, int rank = 0, int world = 1, int64_t accum = 1) const;
  // Validation batch `index`: the same sequences at every evaluation.
  Batch val_batch(int64_t index) const;
  int64_t truncated_records() const { return truncated_; }  // records longer than T + 1 tokens
  // Packed: the records per row of the first epoch, on average (1 when padded).
  double records_per_row() const;

 private:
  Batch make(const TokenView& split, uint64_t stream, uint64_t a, uint64_t first_seq) const;
  void fill_row(Batch& batch, int64_t row, const TokenData::Record& r) const;
  const std::vector<uint32_t>& permutation(uint64_t epoch) const;
  // Packed: the windows of an epoch: records perm[begin[w], begin[w + 1]) share row w.
  struct Packing {
    uint64_t epoch = UINT64_MAX;
    std::vector<uint32_t> begin;
  };
  void pack(uint64_t epoch, Packing& into) const;
  void fill_packed(Batch& batch, int64_t row, uint64_t window) const;
  const TokenData& data_;
  uint64_t seed_;
  int64_t B_, T_;
  bool packed_ = false;
  mutable std::vector<uint64_t> epoch_first_window_;  // packed: windows before each epoch built so far
  mutable Packing packing_;
  int64_t truncated_ = 0;
  mutable uint64_t perm_epoch_ = UINT64_MAX;
  mutable std::vector<uint32_t> perm_;
};

// Cross-entropy (nats per token) of the validation split under the training split's
// token frequencies (add-one smoothed): the score of a model that learnt only how often
// each token occurs. A model that learnt anything about context beats it.
double unigram_baseline(const TokenData& data, int64_t vocab_size);

}  // namespace ferry::runtime
