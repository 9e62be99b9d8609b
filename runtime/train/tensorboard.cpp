#include "runtime/train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace ferry::runtime {

namespace {

// Field numbers of tensorflow/core/util/event.proto and framework/summary.proto.
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5, kEventSessionLog = 7;
constexpr uint32_t kSessionLogStatus = 1, kSessionLogStart = 1;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2;
enum Wire : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

// TFRecord stores a rotated and offset CRC: a CRC computed over data that itself holds
// CRCs is then not trivially zero.
uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

void put_varint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>((v & 0x7f) | 0x80));
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, uint32_t field, Wire wire) {
  put_varint(out, (uint64_t{field} << 3) | wire);
}
void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// The fields in number order, proto3 defaults (zero step, zero wall time) left out: the
// bytes protobuf's own serializer gives, which tests/data/tensorboard/make_fixture.py checks.
std::string encode_event(double wall_time, int64_t step, const std::string* file_version,
                         const std::string* summary, const std::string* session_log = nullptr) {
  std::string e;
  if (const uint64_t bits = std::bit_cast<uint64_t>(wall_time); bits != 0) {
    put_key(e, kEventWallTime, kFixed64);
    put_le(e, bits, 8);
  }
  if (step != 0) {
    put_key(e, kEventStep, kVarint);
    put_varint(e, static_cast<uint64_t>(step));  // negative: ten bytes, as protobuf does
  }
  if (file_version) put_bytes(e, kEventFileVersion, *file_version);
  if (summary) put_bytes(e, kEventSummary, *summary);
  if (session_log) put_bytes(e, kEventSessionLog, *session_log);
  return e;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

double clock_now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A view of the bytes of one message; every read checks what is left.
struct Cursor {
  const unsigned char* p;
  const unsigned char* end;
  size_t left() const { return static_cast<size_t>(end - p); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p == end) throw std::runtime_error("varint runs past the end of its message");
      const unsigned char b = *p++;
      if (shift == 63 && b > 1) throw std::runtime_error("varint longer than 64 bits");
      v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) return v;
    }
    throw std::runtime_error("varint longer than 10 bytes");
  }
  uint64_t fixed(int bytes) {
    if (left() < static_cast<size_t>(bytes))
      throw std::runtime_error("fixed field runs past the end of its message");
    const uint64_t v = get_le(p, bytes);
    p += bytes;
    return v;
  }
  Cursor sub() {
    const uint64_t n = varint();
    if (n > left())
      throw std::runtime_error("field length " + std::to_string(n) + " exceeds the " +
                               std::to_string(left()) + " bytes left of its message");
    Cursor c{p, p + n};
    p += n;
    return c;
  }
  void skip(uint32_t wire) {
    switch (wire) {
      case kVarint:
        varint();
        return;
      case kFixed64:
        fixed(8);
        return;
      case kLengthDelimited:
        sub();
        return;
      case kFixed32:
        fixed(4);
        return;
      default:
        throw std::runtime_error("unsupported wire type " + std::to_string(wire));
    }
  }
  // Reads a key; false at the end of the message.
  bool key(uint32_t& field, uint32_t& wire) {
    if (p == end) return false;
    const uint64_t k = varint();
    field = static_cast<uint32_t>(k >> 3);
    wire = static_cast<uint32_t>(k & 7);
    if (field == 0 || (k >> 3) > 0x1fffffff) throw std::runtime_error("invalid field number");
    return true;
  }
};

// Appends the simple_value scalars of one Event (a field with an unexpected wire type is
// skipped as unknown, as protobuf does).
void decode_event(Cursor c, std::vector<TensorBoardScalar>& out) {
  double wall_time = 0;
  int64_t step = 0;
  const size_t first = out.size();
  uint32_t field, wire;
  while (c.key(field, wire)) {
    if (field == kEventWallTime && wire == kFixed64) {
      wall_time = std::bit_cast<double>(c.fixed(8));
    } else if (field == kEventStep && wire == kVarint) {
      step = static_cast<int64_t>(c.varint());
    } else if (field == kEventSummary && wire == kLengthDelimited) {
      Cursor summary = c.sub();
      uint32_t sf, sw;
      while (summary.key(sf, sw)) {
        if (sf != kSummaryValue || sw != kLengthDelimited) {
          summary.skip(sw);
          continue;
        }
        Cursor value = summary.sub();
        TensorBoardScalar s;
        bool simple = false;
        uint32_t vf, vw;
        while (value.key(vf, vw)) {
          if (vf == kValueTag && vw == kLengthDelimited) {
            const Cursor tag = value.sub();
            s.tag.assign(reinterpret_cast<const char*>(tag.p), tag.left());
          } else if (vf == kValueSimpleValue && vw == kFixed32) {
            s.value = std::bit_cast<float>(static_cast<uint32_t>(value.fixed(4)));
            simple = true;
          } else {
            value.skip(vw);
          }
        }
        if (simple) out.push_back(std::move(s));
      }
    } else {
      c.skip(wire);
    }
  }
  // wall_time and step may follow the summary in the bytes.
  for (size_t i = first; i < out.size(); ++i) {
    out[i].step = step;
    out[i].wall_time = wall_time;
  }
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) crc = kCrcTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, const std::string& filename_suffix,
                                     std::optional<double> start_wall_time_s) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw std::runtime_error("tensorboard: cannot create the folder '" + dir +
                             "': " + ec.message());
  // Two writers of one process in one second differ by the counter; "x" (O_EXCL) makes
  // sure that whatever else shares the name, an existing file is never truncated.
  static std::atomic<uint64_t> counter{0};
  const auto seconds = static_cast<int64_t>(clock_now_s());
  const std::string stem =
      (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(seconds) + "." +
                                     host_name() + "." + std::to_string(getpid()) + "."))
          .string();
  for (int attempt = 0; attempt < 100 && !file_; ++attempt) {
    path_ = stem + std::to_string(counter++) + filename_suffix;
    file_ = std::fopen(path_.c_str(), "wbx");
    if (!file_ && errno != EEXIST) break;
  }
  if (!file_)
    throw std::runtime_error("tensorboard: cannot create '" + path_ + "': " + std::strerror(errno));
  const std::string version = "brain.Event:2";
  try {
    write_record(encode_event(start_wall_time_s.value_or(clock_now_s()), 0, &version, nullptr));
  } catch (...) {
    std::fclose(file_);  // no destructor runs for a constructor that throws
    throw;
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);  // flushes; an error here has no one to go to (see the header)
}

void TensorBoardWriter::add_scalar(const std::string& tag, int64_t step, double value,
                                   double wall_time_s) {
  std::string v;
  put_bytes(v, kValueTag, tag);
  // Always written, zero too: simple_value is a member of a oneof, whose presence counts.
  put_key(v, kValueSimpleValue, kFixed32);
  put_le(v, std::bit_cast<uint32_t>(static_cast<float>(value)), 4);
  std::string summary;
  put_bytes(summary, kSummaryValue, v);
  write_record(encode_event(wall_time_s, step, nullptr, &summary));
}

void TensorBoardWriter::session_start(int64_t step, double wall_time_s) {
  std::string log;
  put_key(log, kSessionLogStatus, kVarint);
  put_varint(log, kSessionLogStart);
  write_record(encode_event(wall_time_s, step, nullptr, nullptr, &log));
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0)
    throw std::runtime_error("tensorboard: flush of '" + path_ +
                             "' failed: " + std::strerror(errno));
}

void TensorBoardWriter::write_record(const std::string& event) {
  std::string r;
  r.reserve(event.size() + 16);
  put_le(r, event.size(), 8);
  put_le(r, masked_crc32c(r.data(), 8), 4);
  r += event;
  put_le(r, masked_crc32c(event.data(), event.size()), 4);
  if (std::fwrite(r.data(), 1, r.size(), file_) != r.size())
    throw std::runtime_error("tensorboard: write to '" + path_ +
                             "' failed: " + std::strerror(errno));
}

std::vector<TensorBoardScalar> read_tensorboard_scalars(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error(file + ": cannot open the event file");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error(file + ": read failed");
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t size = bytes.size();

  std::vector<TensorBoardScalar> out;
  for (size_t off = 0; off < size;) {
    const auto fail = [&](const std::string& what) {
      throw std::runtime_error(file + ": byte " + std::to_string(off) + ": " + what);
    };
    const size_t left = size - off;
    if (left < 12) fail("truncated record header (" + std::to_string(left) + " bytes left)");
    const uint64_t len = get_le(data + off, 8);
    if (masked_crc32c(data + off, 8) != get_le(data + off + 8, 4))
      fail("bad CRC of the record length");
    if (left < 16 || len > left - 16)
      fail("record length " + std::to_string(len) + " runs past the end of the file (" +
           std::to_string(left) + " bytes left)");
    const unsigned char* event = data + off + 12;
    if (masked_crc32c(event, len) != get_le(event + len, 4)) fail("bad CRC of the record data");
    try {
      decode_event(Cursor{event, event + len}, out);
    } catch (const std::runtime_error& e) {
      fail(std::string("malformed Event: ") + e.what());
    }
    off += 16 + len;
  }
  return out;
}

}  // namespace ferry::runtime
