// Tokenizer, token files, the split, the batch sampler and the unigram baseline.
#define BOOST_TEST_MODULE data
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "runtime/train/data.h"

using namespace ferry::runtime;
namespace fs = std::filesystem;

namespace {

std::vector<uint16_t> counting(size_t n, uint16_t mod) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(i % mod);
  return t;
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
  BOOST_TEST(ByteTokenizer::decode(std::vector<uint16_t>{'a', 0x80, 'b'}) == "a\xef\xbf\xbd" "b");
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
  TokenData t = TokenData::load(text.string(), "text", 256, 0.0);
  BOOST_TEST(t.train().size() == 11u);
  TokenData u = TokenData::load(u16.string(), "uint16", 0x2000, 0.0);
  BOOST_TEST(u.train().size() == 3u);
  BOOST_TEST(u.train()[1] == 0x1234);
  try {
    TokenData::load(u16.string(), "uint16", 256, 0.0);
    BOOST_FAIL("token above the vocabulary accepted");
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    BOOST_TEST(m.find(u16.string()) != std::string::npos, m);
    BOOST_TEST(m.find("token 4660 at index 1") != std::string::npos, m);
  }
  try {
    TokenData::load(odd.string(), "uint16", 256, 0.0);
    BOOST_FAIL("odd-sized uint16 file accepted");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(std::string(e.what()).find("even size") != std::string::npos);
  }
  BOOST_CHECK_THROW(TokenData::load((dir.path / "missing").string(), "text", 256, 0.0), std::runtime_error);
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
  std::vector<uint16_t> t = {0, 0, 0, 1, 0, 1, 0, 0, 0, 1};
  TokenData data(t, 0.2, "mem");
  const double want = -(std::log(7.0 / 12) + std::log(3.0 / 12)) / 2;
  BOOST_TEST(unigram_baseline(data, 4) == want, boost::test_tools::tolerance(1e-12));
}
