// Tokenizer, token files, the split, the batch sampler and the unigram baseline.
#define BOOST_TEST_MODULE data
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <functional>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "nn/dtype.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "runtime/train/data.h"
#include "runtime/train/trainer.h"

using namespace ferry::runtime;
namespace fs = std::filesystem;

namespace {

std::vector<uint32_t> counting(size_t n, uint32_t mod) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint32_t>(i % mod);
  return t;
}

DataOptions opts(const fs::path& path, const std::string& format, int64_t vocab, double val = 0.0) {
  DataOptions o;
  o.path = path.string();
  o.format = format;
  o.vocab_size = vocab;
  o.val_fraction = val;
  return o;
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("ferry_test_data_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(byte_tokenizer_round_trips) {
  const std::string text = "In the beginning\n\xc3\xa9t\xc3\xa9";  // UTF-8 too
  const auto tokens = ByteTokenizer::encode(text);
  BOOST_TEST(tokens.size() == text.size());
  BOOST_TEST(tokens[0] == 'I');
  BOOST_TEST(tokens[17] == 0xc3);
  BOOST_TEST(ByteTokenizer::decode(tokens) == text);
  // A lone continuation byte is not valid UTF-8: replaced, not passed through.
  BOOST_TEST(ByteTokenizer::decode(std::vector<uint32_t>{'a', 0x80, 'b'}) == "a\xef\xbf\xbd" "b");
}

BOOST_AUTO_TEST_CASE(token_files_load_and_errors_name_the_path) {
  TempDir dir;
  const fs::path text = dir.path / "t.txt", u16 = dir.path / "t.bin", odd = dir.path / "odd.bin";
  std::ofstream(text) << "hello world";
  {
    std::ofstream out(u16, std::ios::binary);
    const unsigned char bytes[] = {1, 0, 0x34, 0x12, 7, 0};
    out.write(reinterpret_cast<const char*>(bytes), sizeof bytes);
    std::ofstream(odd, std::ios::binary) << "abc";
  }
  TokenData t = TokenData::load(opts(text, "text", 256));
  BOOST_TEST(t.train().size() == 11u);
  TokenData u = TokenData::load(opts(u16, "uint16", 0x2000));
  BOOST_TEST(u.train().size() == 3u);
  BOOST_TEST(u.train()[1] == 0x1234);
  try {
    TokenData::load(opts(u16, "uint16", 256));
    BOOST_FAIL("token above the vocabulary accepted");
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    BOOST_TEST(m.find(u16.string()) != std::string::npos, m);
    BOOST_TEST(m.find("token 4660 at index 1") != std::string::npos, m);
  }
  try {
    TokenData::load(opts(odd, "uint16", 256));
    BOOST_FAIL("odd-sized uint16 file accepted");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(std::string(e.what()).find("even size") != std::string::npos);
  }
  BOOST_CHECK_THROW(TokenData::load(opts(dir.path / "missing", "text", 256)), std::runtime_error);
}

BOOST_AUTO_TEST_CASE(split_and_sampler) {
  TokenData data(counting(1000, 60000), 0.1, "mem");  // token value = position
  BOOST_TEST(data.train().size() == 900u);
  BOOST_TEST(data.val().size() == 100u);
  BOOST_TEST(data.val()[0] == 900);
  BatchSampler s(data, 42, 4, 8);
  const Batch a = s.train_batch(3, 0), b = s.train_batch(3, 0), c = s.train_batch(4, 0);
  BOOST_TEST(a.inputs == b.inputs);  // a function of (seed, step, micro)
  BOOST_TEST(a.inputs != c.inputs);
  for (size_t i = 0; i < a.inputs.size(); ++i) BOOST_TEST(a.targets[i] == a.inputs[i] + 1);
  // Every training window, targets included, lies inside the training split; every
  // validation window inside the validation split.
  for (int64_t step = 0; step < 200; ++step) {
    const Batch x = s.train_batch(step, 0), v = s.val_batch(step);
    for (int64_t r = 0; r < 4; ++r) {
      BOOST_TEST(x.targets[static_cast<size_t>(r * 8 + 7)] <= 899);
      BOOST_TEST(v.inputs[static_cast<size_t>(r * 8)] >= 900);
      BOOST_TEST(v.targets[static_cast<size_t>(r * 8 + 7)] <= 999);
    }
  }
  const Batch v1 = s.val_batch(2), v2 = s.val_batch(2);
  BOOST_TEST(v1.inputs == v2.inputs);
}

BOOST_AUTO_TEST_CASE(global_batch_is_the_same_for_any_world_size) {
  TokenData data(counting(5000, 997), 0.1, "mem");
  BatchSampler s(data, 7, 2, 5);
  // World 1 with 4 micro-batches and world 2 with 2 micro-batches read the same sequences.
  std::multiset<std::vector<int32_t>> one, two;
  auto rows = [](const Batch& b, std::multiset<std::vector<int32_t>>& into) {
    for (int64_t r = 0; r < b.B; ++r) into.insert({b.inputs.begin() + r * b.T, b.inputs.begin() + (r + 1) * b.T});
  };
  for (int64_t m = 0; m < 4; ++m) rows(s.train_batch(9, m, 0, 1), one);
  for (int64_t m = 0; m < 2; ++m)
    for (int r = 0; r < 2; ++r) rows(s.train_batch(9, m, r, 2), two);
  BOOST_TEST((one == two));
}

BOOST_AUTO_TEST_CASE(short_corpus_is_refused) {
  TokenData data(counting(40, 10), 0.1, "tiny.txt");
  BOOST_CHECK_THROW(BatchSampler(data, 1, 2, 8), std::runtime_error);  // 4 validation tokens < 9
}

BOOST_AUTO_TEST_CASE(unigram_baseline_is_the_cross_entropy_of_frequencies) {
  // Train: 'a' x 6, 'b' x 2; validation: "ab". Add-one over vocab 4: p(a) = 7/12, p(b) = 3/12.
  std::vector<uint32_t> t = {0, 0, 0, 1, 0, 1, 0, 0, 0, 1};
  TokenData data(t, 0.2, "mem");
  const double want = -(std::log(7.0 / 12) + std::log(3.0 / 12)) / 2;
  BOOST_TEST(unigram_baseline(data, 4) == want, boost::test_tools::tolerance(1e-12));
}

// JSONL records: prompt/completion and text, the prompt masked, EOS appended, one record
// per row padded with ignored targets, epochs that visit every record once, the same
// global batch at any world size; bad lines named.
BOOST_AUTO_TEST_CASE(jsonl_records_masks_and_epochs) {
  TempDir dir;
  const fs::path f = dir.path / "ft.jsonl";
  {
    std::ofstream out(f);
    out << R"({"prompt": "Q: 1+1?", "completion": " A: 2"})" << "\n\n";  // a blank line is skipped
    for (int i = 0; i < 9; ++i) out << R"({"text": "rec )" << i << R"("})" << "\n";
    out << R"({"prompt": "last ", "completion": "one"})";  // no final newline
  }
  DataOptions o = opts(f, "jsonl", 300, 0.1);
  o.eos = 299;
  const TokenData d = TokenData::load(o);
  BOOST_TEST(d.records());
  BOOST_TEST(d.num_records(false) == 10u);
  BOOST_TEST(d.num_records(true) == 1u);
  const TokenData::Record r0 = d.record(false, 0);
  BOOST_TEST(r0.tokens.size() == 7u + 5u + 1u);  // bytes of the prompt, of the completion, EOS
  BOOST_TEST(r0.tokens.back() == 299u);
  for (size_t t = 0; t < r0.tokens.size(); ++t) BOOST_TEST(r0.counted[t] == (t >= 7 ? 1 : 0));
  // Counted: each completion token and EOS where it is a target: 5 + 1 of record 0, every
  // token but the first of each text record (9 x (4 + 1 EOS)), 3 + 1 of the last.
  BOOST_TEST(d.counted_tokens() == 6 + 9 * 5 + 4);
  BatchSampler s(d, 3, 2, 8);
  BOOST_TEST(s.truncated_records() == 1);  // record 0's 13 tokens > 9
  const Batch v = s.val_batch(0);  // the last record, "last one" + EOS: 9 tokens
  for (int64_t t = 0; t < 8; ++t) {
    const int32_t want = t < 4 ? ferry::nn::kIgnoreTarget : static_cast<int32_t>(d.record(true, 0).tokens[static_cast<size_t>(t + 1)]);
    BOOST_TEST(v.targets[static_cast<size_t>(t)] == want);
  }
  // A short record: padding after its end has ignored targets.
  bool padded = false;
  for (int64_t step = 0; step < 5 && !padded; ++step) {
    const Batch b = s.train_batch(step, 0, 0, 1, 1);
    for (int64_t row = 0; row < 2; ++row)
      padded |= b.targets[static_cast<size_t>(row * 8 + 7)] == ferry::nn::kIgnoreTarget;
  }
  BOOST_TEST(padded);
  // One epoch (10 records, 2 per step x 1 rank) visits every record once.
  std::multiset<std::vector<int32_t>> epoch, all;
  for (int64_t step = 0; step < 5; ++step) {
    const Batch b = s.train_batch(step, 0, 0, 1, 1);
    for (int64_t row = 0; row < 2; ++row) epoch.insert({b.inputs.begin() + row * 8, b.inputs.begin() + row * 8 + 8});
  }
  for (size_t r = 0; r < 10; ++r) {
    Batch one{1, 8, std::vector<int32_t>(8), std::vector<int32_t>(8), {}};
    const TokenData::Record rec = d.record(false, r);
    for (size_t t = 0; t < 8; ++t) one.inputs[t] = t < rec.tokens.size() ? static_cast<int32_t>(rec.tokens[t]) : 0;
    all.insert(one.inputs);
  }
  BOOST_TEST((epoch == all));
  // World 2 with 1 micro-batch of 1 reads what world 1 with 2 micro-batches of 1 reads.
  BatchSampler one(d, 3, 1, 8);
  std::multiset<std::vector<int32_t>> w1, w2;
  for (int64_t step = 0; step < 7; ++step) {
    for (int64_t m = 0; m < 2; ++m) w1.insert(one.train_batch(step, m, 0, 1, 2).inputs);
    for (int r = 0; r < 2; ++r) w2.insert(one.train_batch(step, 0, r, 2, 1).inputs);
  }
  BOOST_TEST((w1 == w2));
  // mask_prompt off: the prompt counts too.
  o.mask_prompt = false;
  BOOST_TEST(TokenData::load(o).counted_tokens() == d.counted_tokens() + 6 + 4);  // the prompts' tokens after their first
  // Bad lines, named.
  auto error = [&](const std::string& text) {
    std::ofstream(f) << text;
    try {
      TokenData::load(o);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  BOOST_TEST(error("{\"text\": \"ok\"}\n{broken\n").find("ft.jsonl': line 2: not a JSON object") != std::string::npos);
  BOOST_TEST(error("{\"prompt\": \"p\"}").find("line 1: \"completion\" must be a string") != std::string::npos);
  BOOST_TEST(error("{\"x\": 1}").find("line 1: a record needs \"text\", \"prompt\" and \"completion\", or \"messages\"") != std::string::npos);
  BOOST_TEST(error("{\"messages\": []}").find("line 1: \"messages\" records need a chat template") != std::string::npos);
  BOOST_TEST(error("\n\n").find("no records") != std::string::npos);
  o.max_record_tokens = 9;  // data.truncate false at block_size 8
  BOOST_TEST(error("{\"text\": \"abc\"}\n{\"text\": \"abcdefghijk\"}").find(
                 "line 2: the record has 12 tokens, more than block_size + 1 = 9") != std::string::npos);
  o.max_record_tokens = 0;
  BOOST_TEST(error("{\"text\": \"\xff\"}").find("line 1: not a JSON object") != std::string::npos);  // not UTF-8
}

// Text through a Hugging Face tokenizer: the ids the tokenizer gives, decoded back.
BOOST_AUTO_TEST_CASE(text_through_a_tokenizer) {
  TempDir dir;
  const fs::path f = dir.path / "c.txt";
  std::ofstream(f) << "In the beginning God created the heaven and the earth.\n";
  DataOptions o = opts(f, "text", 1100);
  o.tokenizer = std::make_shared<ferry::text::Tokenizer>(
      ferry::text::Tokenizer::from_file(std::string(FERRY_SOURCE_DIR) + "/tests/data/tokenizers/llama3/tokenizer.json"));
  const TokenData d = TokenData::load(o);
  // One document, encoded as tokenizer(text) encodes it: Llama 3's post-processor puts
  // <|begin_of_text|> (1001) before it.
  const std::vector<int32_t> want = o.tokenizer->encode("In the beginning God created the heaven and the earth.\n", true);
  BOOST_TEST(d.train().size() == want.size());
  BOOST_TEST(d.train().size() < 30u);  // merges, not bytes
  std::vector<uint32_t> ids(d.train().size());
  d.train().copy(0, ids.size(), ids.data());
  BOOST_TEST(ids.front() == 1001u);
  BOOST_TEST(d.decode(ids) == "<|begin_of_text|>In the beginning God created the heaven and the earth.\n");
  BOOST_TEST(d.describe().find("the file is one document, encoded as tokenizer(text) encodes it (data.text_documents "
                               "lines: one per line): the tokenizer's post-processor puts <|begin_of_text|> (id 1001) before it") != std::string::npos,
             d.describe());
  o.vocab_size = 500;  // ids above it are refused
  BOOST_CHECK_THROW(TokenData::load(o), std::runtime_error);
}

// Packed rows: whole records share a row, each position's doc_start is its record's first
// position, a record's last token and the padding predict nothing, and an epoch's windows
// hold every training record exactly once; the same global batch at any world size.
BOOST_AUTO_TEST_CASE(packed_records_share_rows_within_their_documents) {
  TempDir dir;
  const fs::path f = dir.path / "p.jsonl";
  {
    std::ofstream out(f);
    for (int i = 0; i < 40; ++i) out << R"({"prompt": "q)" << std::string(static_cast<size_t>(i % 5), 'x') << R"(", "completion": "a)" << i << R"("})" << "\n";
  }
  DataOptions o = opts(f, "jsonl", 300, 0.1);
  const TokenData d = TokenData::load(o);
  const int64_t T = 16;
  BatchSampler s(d, 9, 2, T, /*packed=*/true);
  BOOST_TEST(s.records_per_row() > 1.5);
  // Walk the first epoch's windows: 36 training records, each seen once.
  std::multiset<std::vector<int32_t>> seen;
  const auto n_windows = static_cast<int64_t>(std::llround(36.0 / s.records_per_row()));
  int64_t windows = 0;
  for (int64_t step = 0; windows < n_windows; ++step) {
    const Batch b = s.train_batch(step, 0, 0, 1, 1);
    BOOST_TEST(b.doc_start.size() == b.inputs.size());
    for (int64_t row = 0; row < 2 && windows < n_windows; ++row, ++windows) {
      for (int64_t t = 0; t < T;) {
        const auto i = static_cast<size_t>(row * T + t);
        const int32_t start = b.doc_start[i];
        BOOST_TEST(start == t);
        int64_t e = t + 1;
        while (e < T && b.doc_start[static_cast<size_t>(row * T + e)] == start) ++e;
        BOOST_TEST(b.targets[static_cast<size_t>(row * T + e - 1)] == ferry::nn::kIgnoreTarget);  // the last predicts nothing
        if (e - t > 1) seen.insert(std::vector<int32_t>(b.inputs.begin() + row * T + t, b.inputs.begin() + row * T + e));
        t = e;
      }
    }
  }
  std::multiset<std::vector<int32_t>> records;
  for (size_t r = 0; r < d.num_records(false); ++r) {
    const TokenData::Record rec = d.record(false, r);
    records.insert(std::vector<int32_t>(rec.tokens.begin(), rec.tokens.end()));
  }
  BOOST_TEST((seen == records));
  // Packed, world 2 x 1 micro-batch reads what world 1 x 2 micro-batches reads.
  BatchSampler one(d, 9, 1, T, true);
  std::multiset<std::vector<int32_t>> w1, w2;
  for (int64_t step = 0; step < 12; ++step) {
    for (int64_t m = 0; m < 2; ++m) w1.insert(one.train_batch(step, m, 0, 1, 2).inputs);
    for (int r = 0; r < 2; ++r) w2.insert(one.train_batch(step, 0, r, 2, 1).inputs);
  }
  BOOST_TEST((w1 == w2));
}

// data.format tokens: a uint16 file, a folder of uint32 files as one stream (memory-mapped),
// and a folder `ferry tokenize` wrote (TokenData::save) giving back the same records.
BOOST_AUTO_TEST_CASE(token_files_are_mapped_and_tokenize_output_reads_back) {
  TempDir dir;
  fs::create_directories(dir.path / "shards");
  auto write32 = [](const fs::path& p, uint32_t first, size_t n) {
    std::vector<uint32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = first + static_cast<uint32_t>(i);
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(n * 4));
  };
  write32(dir.path / "shards" / "a.bin", 0, 300);
  write32(dir.path / "shards" / "b.bin", 300, 200);
  DataOptions o = opts(dir.path / "shards", "tokens", 100000, 0.2);
  o.dtype = "uint32";
  const TokenData d = TokenData::load(o);
  BOOST_TEST(d.train().size() == 400u);
  BOOST_TEST(d.val().size() == 100u);
  BOOST_TEST(d.train()[299] == 299u);
  BOOST_TEST(d.train()[300] == 300u);  // the second file continues the stream
  BatchSampler s(d, 1, 4, 16);
  for (int64_t step = 0; step < 50; ++step) {
    const Batch b = s.train_batch(step, 0);
    for (size_t i = 0; i < b.inputs.size(); ++i) BOOST_TEST(b.targets[i] == b.inputs[i] + 1);  // windows cross files
  }
  // Ids at or above the vocabulary are found as windows are read, naming the data.
  o.vocab_size = 350;  // the training split holds ids up to 399
  const TokenData small = TokenData::load(o);
  BatchSampler bad(small, 1, 4, 16);
  BOOST_CHECK_THROW(for (int64_t step = 0; step < 200; ++step) bad.train_batch(step, 0), std::runtime_error);
  // Odd sizes are refused by name.
  std::ofstream(dir.path / "odd.bin", std::ios::binary) << "abcde";
  o = opts(dir.path / "odd.bin", "tokens", 1000);
  BOOST_CHECK_EXCEPTION(TokenData::load(o), std::runtime_error, [](const std::runtime_error& e) {
    return std::string(e.what()).find("odd.bin") != std::string::npos;
  });
  // ferry tokenize's folder: the same records, counted flags and split.
  const fs::path f = dir.path / "r.jsonl";
  std::ofstream(f) << R"({"prompt": "ab", "completion": "cd"})" << "\n" << R"({"text": "efg"})" << "\n"
                   << R"({"prompt": "h", "completion": "ij"})" << "\n";
  DataOptions j = opts(f, "jsonl", 300, 0.34);
  const TokenData records = TokenData::load(j);
  records.save((dir.path / "tok").string());
  DataOptions t = opts(dir.path / "tok", "tokens", 300, 0.34);
  const TokenData back = TokenData::load(t);
  BOOST_TEST(back.records());
  BOOST_TEST(back.num_records(false) == records.num_records(false));
  BOOST_TEST(back.num_records(true) == records.num_records(true));
  BOOST_TEST(back.counted_tokens() == records.counted_tokens());
  for (size_t r = 0; r < records.num_records(false); ++r) {
    const auto a = records.record(false, r), b = back.record(false, r);
    BOOST_TEST(std::vector<uint32_t>(a.tokens.begin(), a.tokens.end()) == std::vector<uint32_t>(b.tokens.begin(), b.tokens.end()));
    BOOST_TEST(std::vector<uint8_t>(a.counted.begin(), a.counted.end()) == std::vector<uint8_t>(b.counted.begin(), b.counted.end()));
  }
}

// A meta.json whose fields have another JSON type is refused naming it (json's own
// type_error escaped before, naming nothing; found by tests/fuzz/fuzz_tokens.cpp).
BOOST_AUTO_TEST_CASE(a_tokenize_folder_with_a_damaged_meta_json_is_refused_by_name) {
  TempDir dir;
  const fs::path f = dir.path / "tok";
  fs::create_directories(f);
  std::ofstream(f / "tokens.bin", std::ios::binary) << std::string(16, '\0');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"format": 7})", "not a ferry tokenize folder"},
      {R"({"format": "ferry-tokens", "records": "yes"})", "\"records\" must be true or false, got \"yes\""}};
  for (const auto& [meta, message] : cases) {
    std::ofstream(f / "meta.json") << meta;
    std::string err;
    try {
      TokenData::load(opts(f, "tokens", 1000));
    } catch (const std::runtime_error& e) {
      err = e.what();
    }
    BOOST_TEST(err.find((f / "meta.json").string() + ": " + message) != std::string::npos, err);
  }
}

// {"messages": [...]} records through a chat template (ChatML here, bytes as tokens): the
// prompt is the rendering of the turns before the last plus the generation prompt, and
// only the last (assistant) turn's rendering is trained on.
BOOST_AUTO_TEST_CASE(messages_records_are_rendered_by_the_chat_template) {
  TempDir dir;
  const fs::path f = dir.path / "chat.jsonl";
  std::ofstream(f) << R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]})"
                   << "\n" << R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]})" << "\n";
  DataOptions o = opts(f, "jsonl", 300, 0.0);
  o.eos = 299;  // not appended: the template ends the turn itself
  o.chat = std::make_shared<ferry::text::ChatTemplate>(
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
      "chatml");
  const TokenData d = TokenData::load(o);
  BOOST_TEST(d.num_records(false) == 2u);
  const std::string prompt = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n";
  const std::string reply = "Hello.<|im_end|>\n";
  const TokenData::Record r = d.record(false, 0);
  BOOST_TEST(r.tokens.size() == prompt.size() + reply.size());
  BOOST_TEST(ByteTokenizer::decode(r.tokens) == prompt + reply);
  for (size_t t = 0; t < r.tokens.size(); ++t) BOOST_TEST(r.counted[t] == (t >= prompt.size() ? 1 : 0));
  auto error = [&](const std::string& text) {
    std::ofstream(f) << text;
    try {
      TokenData::load(o);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  BOOST_TEST(error(R"({"messages": [{"role": "user", "content": "x"}]})").find("line 1: the last message must be the assistant's") != std::string::npos);
  BOOST_TEST(error(R"({"messages": [{"role": "user"}]})").find("line 1: each message needs") != std::string::npos);
  o.chat.reset();
  BOOST_TEST(error(R"({"messages": [{"role": "assistant", "content": "x"}]})").find("need a chat template") != std::string::npos);
}

// A Llama 3.x Instruct folder as transformers 5 saves it (tests/data/user_files/models/
// llama3-instruct: config.json's eos_token_id a list whose first is <|end_of_text|>,
// tokenizer_config.json's eos_token <|eot_id|>, the chat template in chat_template.jinja).
// Every record's ids are those transformers gives (expected/records.ids, made by
// scripts/user_fixtures/make_llama3_instruct.py): prompt/completion and text records end
// with <|eot_id|> (1005), not 1002, and conversations go through chat_template.jinja.
namespace {
const std::string kUser = std::string(FERRY_SOURCE_DIR) + "/tests/data/user_files/models/";

std::vector<std::vector<uint32_t>> id_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<uint32_t>> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ss(line);
    out.emplace_back();
    for (uint32_t id; ss >> id;) out.back().push_back(id);
  }
  return out;
}

Config folder_config(const std::string& folder, const std::string& data, const std::string& format) {
  Config c;
  c.init_from = folder;
  c.model.vocab_size = 1024;
  c.model.block_size = 128;
  c.data.path = data;
  c.data.format = format;
  c.data.tokenizer = "auto";
  c.data.chat_template = "auto";
  c.data.val_fraction = 0;
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}
}  // namespace

BOOST_AUTO_TEST_CASE(llama3_instruct_records_are_tokenized_as_transformers_does) {
  const Config c = folder_config(kUser + "llama3-instruct", kUser + "expected/records.jsonl", "jsonl");
  const DataOptions o = data_options(c);
  BOOST_TEST(o.eos == 1005);
  BOOST_TEST(o.eos_token == "<|eot_id|>");
  BOOST_TEST(o.eos_from == "tokenizer_config.json's eos_token");
  BOOST_REQUIRE(o.chat);
  BOOST_TEST(o.chat->where() == kUser + "llama3-instruct/chat_template.jinja");
  const TokenData d = TokenData::load(o);
  const auto want = id_lines(kUser + "expected/records.ids");
  BOOST_REQUIRE(d.num_records(false) == want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    BOOST_TEST_CONTEXT("record " << r) {
      const auto got = d.record(false, r).tokens;
      BOOST_TEST(std::vector<uint32_t>(got.begin(), got.end()) == want[r], boost::test_tools::per_element());
    }
  }
  BOOST_TEST(d.describe().find("prompt/completion and text records end with <|eot_id|> (id 1005), "
                               "tokenizer_config.json's eos_token") != std::string::npos, d.describe());
  BOOST_TEST(d.describe().find("chat template of " + kUser + "llama3-instruct/chat_template.jinja") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_text_corpus_gets_the_tokens_tokenizer_text_gives) {
  const Config c = folder_config(kUser + "llama3-instruct", kUser + "expected/corpus.txt", "text");
  const TokenData d = TokenData::load(data_options(c));
  const auto want = id_lines(kUser + "expected/corpus.ids");
  BOOST_REQUIRE(want.size() == 1u);
  std::vector<uint32_t> got(d.train().size());
  d.train().copy(0, got.size(), got.data());
  BOOST_TEST(got == want[0], boost::test_tools::per_element());
}

// transformers 5's precedence, folder by folder: chat_template.jinja over tokenizer_config's
// chat_template; special_tokens_map.json over tokenizer_config.json only where the latter has no
// added_tokens_decoder (an older save); config.json's eos_token_id (the first of a list) only
// where the tokenizer names no eos_token; an eos_token the tokenizer lacks is refused by name.
BOOST_AUTO_TEST_CASE(special_tokens_and_chat_template_follow_transformers_precedence) {
  TempDir dir;
  const fs::path src = kUser + "llama3-instruct";
  fs::copy_file(src / "tokenizer.json", dir.path / "tokenizer.json");
  fs::copy_file(src / "config.json", dir.path / "config.json");
  const fs::path records = dir.path / "r.jsonl";
  std::ofstream(records) << R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})" << "\n";
  auto write = [&](const char* name, const std::string& text) { std::ofstream(dir.path / name) << text; };
  write("tokenizer_config.json", R"({"eos_token": "<|eot_id|>", "chat_template": "config:{{ messages[0].content }}"})");
  Config c = folder_config(dir.path.string(), records.string(), "jsonl");
  auto render = [&] {
    const DataOptions o = data_options(c);
    return o.chat ? o.chat->render(nlohmann::json::array({{{"role", "user"}, {"content", "x"}}}), false) : "none";
  };
  BOOST_TEST(render() == "config:x");
  write("chat_template.jinja", "jinja:{{ messages[0].content }}");
  BOOST_TEST(render() == "jinja:x");  // the file transformers 5 saves wins, as in from_pretrained
  // An older save (no added_tokens_decoder): special_tokens_map.json's value wins.
  write("special_tokens_map.json", R"({"eos_token": {"content": "<|end_of_text|>"}})");
  BOOST_TEST(data_options(c).eos == 1002);
  BOOST_TEST(data_options(c).eos_from == "special_tokens_map.json's eos_token");
  write("tokenizer_config.json", R"({"eos_token": "<|eot_id|>", "added_tokens_decoder": {}})");
  BOOST_TEST(data_options(c).eos == 1005);
  // No eos_token anywhere: config.json's list, its first id, said so.
  fs::remove(dir.path / "special_tokens_map.json");
  write("tokenizer_config.json", R"({"bos_token": "<|begin_of_text|>"})");
  DataOptions o = data_options(c);
  BOOST_TEST(o.eos == 1002);
  BOOST_TEST(o.eos_token == "<|end_of_text|>");
  BOOST_TEST(o.eos_from == "the first of config.json's eos_token_id [1002,1006,1005] (the tokenizer names no eos_token)");
  write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  const std::string err = error_of([&] { data_options(c); });
  BOOST_TEST(err == (dir.path / "tokenizer_config.json").string() + ": eos_token '</s>' is not a token of " +
                        (dir.path / "tokenizer.json").string(), err);
  // A named chat template that is not there is refused by name.
  write("tokenizer_config.json", R"({"eos_token": "<|eot_id|>"})");
  c.data.chat_template = (dir.path / "missing.jinja").string();
  BOOST_TEST(error_of([&] { data_options(c); }) == "data.chat_template: cannot open '" + c.data.chat_template + "'");
}

// data.val_path: all of data.path trains, all of the other file validates, read the same
// way; data.val_fraction 0 without it: every record trains and nothing is held out.
BOOST_AUTO_TEST_CASE(a_validation_file_and_no_validation) {
  TempDir dir;
  const auto has = [](const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; };
  const fs::path train = dir.path / "train.jsonl", val = dir.path / "val.jsonl", text = dir.path / "t.txt";
  {
    std::ofstream t(train), v(val), x(text);
    for (int i = 0; i < 6; ++i) t << R"({"prompt": "q)" << i << R"(", "completion": " a"})" << "\n";
    v << R"({"prompt": "held", "completion": " out"})" << "\n" << R"({"text": "second"})" << "\n";
    x << "only some text";
  }
  DataOptions o = opts(train, "jsonl", 300);
  o.val_path = val.string();
  const TokenData d = TokenData::load(o);
  BOOST_TEST(d.num_records(false) == 6u);
  BOOST_TEST(d.num_records(true) == 2u);
  BOOST_TEST(d.wants_validation());
  const TokenData::Record held = d.record(true, 0);
  BOOST_TEST(std::string(held.tokens.begin(), held.tokens.end()) == "held out");
  BOOST_TEST(held.counted[3] == 0);  // the prompt is masked in validation records too
  BOOST_TEST(held.counted[4] == 1);
  BOOST_TEST(has(d.describe(), "(validation: all of " + val.string() + ")"), d.describe());
  BatchSampler s(d, 1, 2, 16);
  const Batch vb = s.val_batch(0);
  BOOST_TEST(vb.inputs[0] == static_cast<int32_t>('h'));
  BOOST_TEST(vb.inputs[16] == static_cast<int32_t>('s'));  // row 1: the second validation record
  // A missing validation file is named under its key; a stream beside records is refused.
  o.val_path = (dir.path / "nope.jsonl").string();
  std::string e = error_of([&] { TokenData::load(o); });
  BOOST_TEST(has(e, "data.val_path: cannot open '" + o.val_path + "'"), e);
  // Streams: the validation file's bytes are the validation split.
  DataOptions streams = opts(text, "text", 256, 0.0);
  streams.val_path = val.string();
  const TokenData ds = TokenData::load(streams);
  BOOST_TEST(ds.train().size() == 14u);  // "only some text", all of it
  std::vector<uint32_t> first(4);
  ds.val().copy(0, 4, first.data());
  BOOST_TEST(std::string(first.begin(), first.end()) == "{\"pr");
  // val_fraction 0: six training records, none held out, and the sampler does not ask for any.
  const TokenData all = TokenData::load(opts(train, "jsonl", 300, 0.0));
  BOOST_TEST(all.num_records(false) == 6u);
  BOOST_TEST(all.num_records(true) == 0u);
  BOOST_TEST(!all.wants_validation());
  BOOST_TEST(has(all.describe(), "data.val_fraction 0: no validation, every record trains"), all.describe());
  BatchSampler s0(all, 1, 2, 16);
  BOOST_TEST(s0.train_batch(0, 0).inputs[0] == static_cast<int32_t>('q'));
  // A fraction above 0 that leaves no validation record is still an error.
  const TokenData few = TokenData::load(opts(train, "jsonl", 300, 0.01));
  BOOST_TEST(few.num_records(true) == 0u);
  e = error_of([&] { const BatchSampler refused(few, 1, 2, 16); });
  BOOST_TEST(has(e, "each split needs one at least"), "got: " << e);
}

// data.text_documents lines: the lines datasets' text loader gives run_clm (universal newlines,
// then a line after each "\n", kept); each line through tokenizer(line), ids as the library's.
BOOST_AUTO_TEST_CASE(text_lines_are_the_datasets_loaders) {
  std::string t = "a\r\nb\rc\n\nd\xE2\x80\xA8" "e\ff";
  const std::vector<std::string_view> lines = text_lines(t);
  const std::vector<std::string> want = {"a\n", "b\n", "c\n", "\n", "d\xE2\x80\xA8" "e\ff"};
  BOOST_TEST(std::vector<std::string>(lines.begin(), lines.end()) == want, boost::test_tools::per_element());
  std::string none;
  BOOST_TEST(text_lines(none).empty());
  Config c = folder_config(kUser + "llama3-instruct", kUser + "expected/lines.txt", "text");
  c.data.text_documents = "lines";
  const TokenData d = TokenData::load(data_options(c));
  const auto ids = id_lines(kUser + "expected/lines.ids");
  BOOST_REQUIRE(ids.size() == 1u);
  std::vector<uint32_t> got(d.train().size());
  d.train().copy(0, got.size(), got.data());
  BOOST_TEST(got == ids[0], boost::test_tools::per_element());
}
