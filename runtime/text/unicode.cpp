#include "runtime/text/unicode.h"

#include <array>
#include <cstdlib>
#include <memory>
#include <stdexcept>

#include <utf8proc.h>

namespace ferry::text {

size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  const size_t left = s.size() - i;
  auto cont = [&](size_t k) { return k < s.size() && (b(k) & 0xC0) == 0x80; };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return left >= 2 && cont(i + 1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (left < 3 || !cont(i + 1) || !cont(i + 2)) return 0;
    if (c == 0xE0 && b(i + 1) < 0xA0) return 0;   // overlong
    if (c == 0xED && b(i + 1) >= 0xA0) return 0;  // surrogates
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (left < 4 || !cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return 0;
    if (c == 0xF0 && b(i + 1) < 0x90) return 0;
    if (c == 0xF4 && b(i + 1) >= 0x90) return 0;
    return 4;
  }
  return 0;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::vector<std::string> utf8_chars(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_sequence_length(s, i);
    if (n == 0) n = 1;  // callers pass valid text; never loop forever
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string utf8_encode(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

uint32_t utf8_decode_one(std::string_view s, size_t i, size_t* len) {
  const size_t n = utf8_sequence_length(s, i);
  *len = n == 0 ? 1 : n;
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k])); };
  switch (n) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    case 4: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    default: return 0xFFFD;
  }
}

namespace {

struct ByteTable {
  std::array<std::string, 256> to_unicode;
  std::array<int, 512> to_byte{};  // every mapped code point is below 512
  ByteTable() {
    to_byte.fill(-1);
    // Printable Latin-1 bytes map to themselves, the rest to 256, 257, ... in byte order.
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const int cp = printable ? b : next++;
      to_unicode[static_cast<size_t>(b)] = utf8_encode(static_cast<uint32_t>(cp));
      to_byte[static_cast<size_t>(cp)] = b;
    }
  }
};

const ByteTable& table() {
  static const ByteTable t;
  return t;
}

}  // namespace

const std::string& byte_to_unicode(uint8_t b) { return table().to_unicode[b]; }

int unicode_to_byte(uint32_t cp) { return cp < 512 ? table().to_byte[cp] : -1; }

std::string normalize(std::string_view s, const std::string& form) {
  int options = UTF8PROC_STABLE;
  if (form == "NFC") options |= UTF8PROC_COMPOSE;
  else if (form == "NFD") options |= UTF8PROC_DECOMPOSE;
  else if (form == "NFKC") options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
  else if (form == "NFKD") options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  else throw std::invalid_argument("normalize: unknown form " + form);
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &out,
                                          static_cast<utf8proc_option_t>(options));
  if (n < 0) throw std::runtime_error(std::string("utf8proc: ") + utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> guard(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    // Skip the maximal prefix of a valid sequence (at least one byte), as Rust does.
    const auto c = static_cast<unsigned char>(s[i]);
    size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 1;
    size_t k = 1;
    while (k < need && i + k < s.size()) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      unsigned lo = 0x80, hi = 0xBF;
      if (k == 1) {
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
      }
      if (d < lo || d > hi) break;
      ++k;
    }
    out += "\xEF\xBF\xBD";
    i += k;
  }
  return out;
}

}  // namespace ferry::text
