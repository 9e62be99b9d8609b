#include "base/crc32c.h"

#include <array>
#include <cstring>

namespace ferry {

namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

uint32_t crc_table(const unsigned char* p, size_t n, uint32_t c) {
  for (size_t i = 0; i < n; ++i) c = kTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc_hw(const unsigned char* p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = __builtin_ia32_crc32di(c64, v);
  }
  c = static_cast<uint32_t>(c64);
  for (; n > 0; --n, ++p) c = __builtin_ia32_crc32qi(c, *p);
  return c;
}
const bool kHaveHw = __builtin_cpu_supports("sse4.2");
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t bytes, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (kHaveHw) return ~crc_hw(p, bytes, c);
#endif
  return ~crc_table(p, bytes, c);
}

namespace {
uint32_t gf2_times(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (int i = 0; vec; vec >>= 1, ++i)
    if (vec & 1) sum ^= mat[i];
  return sum;
}
void gf2_square(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = gf2_times(mat, mat[n]);
}
}  // namespace

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b) {
  if (bytes_b == 0) return crc_a;
  uint32_t even[32], odd[32];
  odd[0] = kPoly;  // the operator for one zero bit
  for (uint32_t n = 1, row = 1; n < 32; ++n, row <<= 1) odd[n] = row;
  gf2_square(even, odd);  // two zero bits
  gf2_square(odd, even);  // four
  do {  // apply bytes_b zero bytes to crc_a, squaring the operator per bit of the length
    gf2_square(even, odd);
    if (bytes_b & 1) crc_a = gf2_times(even, crc_a);
    bytes_b >>= 1;
    if (bytes_b == 0) break;
    gf2_square(odd, even);
    if (bytes_b & 1) crc_a = gf2_times(odd, crc_a);
    bytes_b >>= 1;
  } while (bytes_b != 0);
  return crc_a ^ crc_b;
}

}  // namespace ferry
