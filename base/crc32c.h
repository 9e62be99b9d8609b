// CRC-32C (Castagnoli), the checksum of every tensor in a checkpoint. The SSE4.2 crc32
// instruction where the CPU has it (about 8 GB/s on one core, so a checkpoint's checksums
// cost less than its disk time), a table otherwise; both give the same values.
// Threads: pure functions. Chaining: crc32c(b, nb, crc32c(a, na)) == crc32c(a ++ b).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry {

uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);
// The CRC of a ++ b from crc32c(a), crc32c(b) and b's length (zlib's crc32_combine method:
// O(log bytes_b) 32x32 bit-matrix steps), so pieces can be checksummed on other threads.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b);

}  // namespace ferry
