// TensorBoard event files: CRC-32C against its standard vectors; scalars written and read
// back; a second writer's own file; corruption named by file and byte; unknown protobuf
// fields skipped; and the bytes equal to tests/data/tensorboard/scalars.tfevents, a file
// that the real `tensorboard` package read and accepted (make_fixture.py in that folder);
// ScalarMonitors (the trainer's TensorBoard and CSV output) across a resume.
#define BOOST_TEST_MODULE tensorboard
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "runtime/train/monitors.h"
#include "runtime/train/tensorboard.h"
#include "test_util.h"

using namespace ferry::runtime;
namespace fs = std::filesystem;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  BOOST_REQUIRE_MESSAGE(in, "cannot open " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::vector<std::string> event_files(const fs::path& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

std::string error_of(const std::string& path) {
  try {
    read_tensorboard_scalars(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  BOOST_FAIL("no error for " + path);
  return "";
}

std::string le(uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

uint32_t masked(const std::string& s) {
  const uint32_t crc = crc32c(s.data(), s.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

// A TFRecord with correct CRCs around `data`, whose length field says `len`.
std::string record(const std::string& data, uint64_t len) {
  const std::string header = le(len, 8);
  return header + le(masked(header), 4) + data + le(masked(data), 4);
}

// The fixture's scalars: per step, the loss then the learning rate, one second apart.
constexpr double kStart = 1700000000.0;
struct Expected {
  const char* tag;
  int64_t step;
  double value;
};
const Expected kFixture[] = {{"train/loss", 1, 5.5},   {"train/lr", 1, 0.001},
                             {"train/loss", 2, 4.25},  {"train/lr", 2, 0.0009},
                             {"train/loss", 3, 3.125}, {"train/lr", 3, 0.0008}};

}  // namespace

BOOST_AUTO_TEST_CASE(crc32c_standard_vectors) {
  BOOST_TEST(crc32c("123456789", 9) == 0xE3069283u);
  // RFC 3720 (iSCSI), appendix B.4.
  std::string bytes(32, '\0');
  BOOST_TEST(crc32c(bytes.data(), bytes.size()) == 0x8A9136AAu);
  bytes.assign(32, '\xff');
  BOOST_TEST(crc32c(bytes.data(), bytes.size()) == 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) bytes[i] = static_cast<char>(i);
  BOOST_TEST(crc32c(bytes.data(), bytes.size()) == 0x46DD794Eu);
  BOOST_TEST(crc32c("", 0) == 0u);
}

BOOST_AUTO_TEST_CASE(scalars_read_back) {
  ferry::test::TempDir dir("tb_read");
  const fs::path run = dir.path / "runs" / "a";  // parents created
  std::string path;
  {
    TensorBoardWriter w(run.string(), ".rank0");
    path = w.path();
    w.add_scalar("train/loss", 0, 0.0, 100.25);  // zero step and value are still read back
    w.add_scalar("train/loss", 1, 2.5, 101.5);
    w.add_scalar("train/grad_norm", -3, -1e-3, 102.0);
    w.add_scalar("val/loss", int64_t{1} << 40, 1.0 / 3.0, 1700000123.456);
    w.flush();
  }
  const std::string name = fs::path(path).filename().string();
  BOOST_TEST(name.rfind("events.out.tfevents.", 0) == 0, name);
  BOOST_TEST(name.find(std::string(".") + std::to_string(getpid()) + ".") != std::string::npos,
             name);
  BOOST_TEST(name.substr(name.size() - 6) == ".rank0", name);
  BOOST_TEST(fs::path(path).parent_path() == run);

  const auto s = read_tensorboard_scalars(path);
  BOOST_REQUIRE_EQUAL(s.size(), 4u);
  BOOST_TEST(s[0].tag == "train/loss");
  BOOST_TEST(s[0].step == 0);
  BOOST_TEST(s[0].value == 0.0f);
  BOOST_TEST(s[0].wall_time == 100.25);
  BOOST_TEST(s[1].step == 1);
  BOOST_TEST(s[1].value == 2.5f);
  BOOST_TEST(s[1].wall_time == 101.5);
  BOOST_TEST(s[2].tag == "train/grad_norm");
  BOOST_TEST(s[2].step == -3);
  BOOST_TEST(s[2].value == -1e-3f);  // stored as float32
  BOOST_TEST(s[3].tag == "val/loss");
  BOOST_TEST(s[3].step == int64_t{1} << 40);
  BOOST_TEST(s[3].value == static_cast<float>(1.0 / 3.0));
  BOOST_TEST(s[3].wall_time == 1700000123.456);
}

BOOST_AUTO_TEST_CASE(a_second_writer_makes_a_second_file) {
  ferry::test::TempDir dir("tb_two");
  {
    TensorBoardWriter w(dir.path.string(), "");
    w.add_scalar("loss", 1, 3.0, 1.0);
  }
  {  // a resumed run: same folder, the first file untouched
    TensorBoardWriter w(dir.path.string(), "");
    w.add_scalar("loss", 2, 2.0, 2.0);
  }
  const auto files = event_files(dir.path);
  BOOST_REQUIRE_EQUAL(files.size(), 2u);
  std::vector<int64_t> steps;
  for (const auto& f : files)
    for (const auto& s : read_tensorboard_scalars(f)) steps.push_back(s.step);
  BOOST_TEST(steps == (std::vector<int64_t>{1, 2}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(corruption_names_the_file_and_byte) {
  ferry::test::TempDir dir("tb_bad");
  std::string good;
  {
    TensorBoardWriter w(dir.path.string(), "", kStart);
    w.add_scalar("loss", 1, 3.0, kStart + 1);
    good = w.path();
  }
  const std::string bytes = read_bytes(good);
  const size_t second =
      16 + static_cast<unsigned char>(bytes[0]);  // after file_version's record (< 256 bytes)
  const std::string p = (dir.path / "bad").string();

  std::string flipped = bytes;
  flipped[second + 12 + 3] ^= 0x01;  // inside the second record's data
  write_bytes(p, flipped);
  BOOST_TEST(error_of(p) ==
             p + ": byte " + std::to_string(second) + ": bad CRC of the record data");

  flipped = bytes;
  flipped[second + 2] ^= 0x40;  // the length field
  write_bytes(p, flipped);
  BOOST_TEST(error_of(p) ==
             p + ": byte " + std::to_string(second) + ": bad CRC of the record length");

  write_bytes(p, bytes.substr(0, bytes.size() - 1));  // the last data CRC cut short
  BOOST_TEST(error_of(p).find(p + ": byte " + std::to_string(second) + ": record length") == 0,
             error_of(p));
  write_bytes(p, bytes.substr(0, second + 5));  // inside a header
  BOOST_TEST(error_of(p) ==
             p + ": byte " + std::to_string(second) + ": truncated record header (5 bytes left)");

  // A length whose own CRC is right but that is far past the end: refused before any
  // allocation (an allocation of 2^62 bytes would throw bad_alloc, not this).
  write_bytes(p, bytes.substr(0, second) + record("abc", uint64_t{1} << 62));
  BOOST_TEST(error_of(p).find(p + ": byte " + std::to_string(second) +
                              ": record length 4611686018427387904 runs past") == 0,
             error_of(p));

  // Framing intact, protobuf broken: a wire type (3, a group) that proto3 never writes, and
  // a string whose length runs past its message.
  write_bytes(p, bytes.substr(0, second) + record("\x0b", 1));
  BOOST_TEST(error_of(p) ==
             p + ": byte " + std::to_string(second) + ": malformed Event: unsupported wire type 3");
  write_bytes(p, record("\x2a\x05\x0a\x09", 4));
  BOOST_TEST(error_of(p).find(p + ": byte 0: malformed Event: field length") == 0, error_of(p));

  const std::string missing = (dir.path / "none").string();
  BOOST_TEST(error_of(missing) == missing + ": cannot open the event file");
}

BOOST_AUTO_TEST_CASE(unknown_fields_are_skipped) {
  // Event{wall_time=2.0, unknown varint 9, unknown fixed32 10, step=7, unknown fixed64 11,
  //       summary{Value{unknown metadata 9 {...}, tag "x", simple_value 1.5},
  //               Value{tag "img", image 4 {...}}}, unknown string 6}: a newer writer's file.
  // Built by appending: GCC 12 warns (-Wrestrict, falsely) on "literal" + std::string&&.
  const auto len = [](const std::string& m) { return std::string(1, static_cast<char>(m.size())); };
  std::string v1("\x4a\x02\x08\x01", 4);
  v1 += "\x0a\x01x\x15";
  v1 += le(0x3fc00000u, 4);
  const std::string v2 = "\x0a\x03img\x22\x02\x08\x01";
  std::string summary = "\x0a";
  summary += len(v1) + v1;
  summary += "\x0a";
  summary += len(v2) + v2;
  std::string event = "\x09";
  event += le(0x4000000000000000ull, 8);
  event += "\x48\x96\x01\x55";
  event += le(7, 4);
  event += "\x10\x07\x59";
  event += le(1, 8);
  event += "\x2a";
  event += len(summary) + summary;
  event += "\x32\x02hi";
  ferry::test::TempDir dir("tb_unknown");
  const std::string p = (dir.path / "f").string();
  write_bytes(p, record(event, event.size()));
  const auto s = read_tensorboard_scalars(p);
  BOOST_REQUIRE_EQUAL(s.size(), 1u);
  BOOST_TEST(s[0].tag == "x");
  BOOST_TEST(s[0].step == 7);
  BOOST_TEST(s[0].value == 1.5f);
  BOOST_TEST(s[0].wall_time == 2.0);
}

// The whole file, byte for byte, against the fixture that TensorBoard accepted. The first
// record's wall time is fixed by the constructor (the clock's would differ every run), so
// the comparison covers the file_version record too, not only the scalars. To make the
// fixture again: FERRY_TENSORBOARD_FIXTURE_OUT=/tmp/f.tfevents test_tensorboard, then
// tests/data/tensorboard/make_fixture.py /tmp/f.tfevents.
BOOST_AUTO_TEST_CASE(bytes_equal_the_fixture_tensorboard_read) {
  ferry::test::TempDir dir("tb_fixture");
  std::string path;
  {
    TensorBoardWriter w(dir.path.string(), "", kStart);
    for (const auto& e : kFixture)
      w.add_scalar(e.tag, e.step, e.value, kStart + static_cast<double>(e.step));
    w.flush();
    path = w.path();
  }
  const std::string written = read_bytes(path);
  if (const char* out = std::getenv("FERRY_TENSORBOARD_FIXTURE_OUT")) write_bytes(out, written);

  const std::string fixture =
      std::string(FERRY_SOURCE_DIR) + "/tests/data/tensorboard/scalars.tfevents";
  const std::string expected = read_bytes(fixture);
  BOOST_TEST(written.size() == expected.size());
  BOOST_TEST(written == expected, "the bytes differ from " + fixture);

  const auto s = read_tensorboard_scalars(fixture);
  BOOST_REQUIRE_EQUAL(s.size(), std::size(kFixture));
  for (size_t i = 0; i < s.size(); ++i) {
    BOOST_TEST(s[i].tag == kFixture[i].tag);
    BOOST_TEST(s[i].step == kFixture[i].step);
    BOOST_TEST(s[i].value == static_cast<float>(kFixture[i].value));
    BOOST_TEST(s[i].wall_time == kStart + static_cast<double>(kFixture[i].step));
  }
}

// The SessionLog START event a resumed run writes: the bytes protobuf's own serializer gives
// for Event{wall_time: 1.5, step: 5, session_log: {status: START}} (tensorboard 2.21's
// event_pb2, printed as hex: 09000000000000f83f10053a020801).
BOOST_AUTO_TEST_CASE(session_start_is_protobufs_encoding) {
  ferry::test::TempDir dir("tb_session");
  std::string path;
  {
    TensorBoardWriter w(dir.path.string(), "", kStart);
    w.session_start(5, 1.5);
    path = w.path();
  }
  const std::string bytes = read_bytes(path);
  const std::string event("\x09\x00\x00\x00\x00\x00\x00\xf8\x3f\x10\x05\x3a\x02\x08\x01", 15);
  BOOST_TEST(bytes.size() >= record(event, event.size()).size());
  BOOST_TEST((bytes.substr(bytes.size() - record(event, event.size()).size()) == record(event, event.size())));
  BOOST_TEST(read_tensorboard_scalars(path).empty());  // no scalar in it, and it reads cleanly
}

// ScalarMonitors: a step record and an evaluation record become TensorBoard scalars and
// DeepSpeed-style CSV files; a resumed run appends rows without a second header and adds an
// event file that starts with a SessionLog START.
BOOST_AUTO_TEST_CASE(monitors_write_scalars_and_csv_and_continue_after_a_resume) {
  ferry::test::TempDir dir("tb_monitors");
  const std::string tb = (dir.path / "tb").string(), csv = (dir.path / "csv").string();
  const nlohmann::json step1 = {{"step", 1},          {"loss", 5.5},
                                {"lr", 0.001},        {"grad_norm", 2.0},
                                {"tokens_per_s", 900}, {"bytes", {{"nvme_read", 4096}}},
                                {"memory", {{"device_peak", 1024}}}};
  {
    ScalarMonitors m(tb, csv);
    m.write(step1);
    m.write({{"step", 1}, {"val_loss", 5.0}});
  }
  {
    ScalarMonitors m(tb, csv);
    m.resumed_at(2);
    m.write({{"step", 2}, {"loss", 4.5}, {"lr", 0.0009}});
  }
  const auto files = event_files(tb);
  BOOST_REQUIRE(files.size() == 2u);
  std::vector<TensorBoardScalar> all;
  for (const auto& f : files) {
    const auto s = read_tensorboard_scalars(f);
    all.insert(all.end(), s.begin(), s.end());
  }
  const auto find = [&](const std::string& tag, int64_t step) {
    for (const auto& s : all)
      if (s.tag == tag && s.step == step) return static_cast<double>(s.value);
    BOOST_FAIL("no scalar " + tag);
    return 0.0;
  };
  BOOST_TEST(find("train/loss", 1) == 5.5);
  BOOST_TEST(find("train/grad_norm", 1) == 2.0);
  BOOST_TEST(find("perf/tokens_per_s", 1) == 900.0);
  BOOST_TEST(find("bytes/nvme_read", 1) == 4096.0);
  BOOST_TEST(find("memory/device_peak", 1) == 1024.0);
  BOOST_TEST(find("eval/loss", 1) == 5.0);
  BOOST_TEST(find("train/loss", 2) == 4.5);
  BOOST_TEST(read_bytes(csv + "/train_loss.csv") == "step,loss\n1,5.5\n2,4.5\n");
  BOOST_TEST(read_bytes(csv + "/eval_loss.csv") == "step,loss\n1,5\n");
  BOOST_TEST(read_bytes(csv + "/train_lr.csv") == "step,lr\n1,0.001\n2,0.0009\n");
}
