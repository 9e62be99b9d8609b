// The CPU emulation of the PTX instructions nn/cuda/mma.cuh wraps (mma.sync m16n8k16,
// ldmatrix .x4, cp.async.cg 16 bytes) for the emulated test builds (testing/cuda_emulation.h;
// tests only, FERRY_CUDA_EMULATION).
//
// What it keeps of the PTX ISA (sections "Matrix Fragments for mma.m16n8k16 with floating
// point type", "ldmatrix", "cp.async"):
// - mma and ldmatrix are warp-collective: every lane puts its operands (fragments, a row
//   address) into its warp's exchange, the warp's lanes meet (as for __shfl_xor_sync), and
//   each lane then takes what the ISA says lands in its registers from the lanes the ISA
//   says hold it; they meet again before the exchange is reused. A lane's registers hold only
//   its own elements, in the ISA's per-lane layout (nn/cuda/mma.cuh lists it), so a kernel
//   that reads an element from the wrong register or lane computes a wrong result here as on
//   a GPU. The lanes' calls are logged with the warp matrix calls (ferry_emu::wmma_called)
//   and compared whenever the warp meets: a call some lanes skip is reported.
// - d = a b + c: products exact (a bf16 or f16 product fits in f32), sums in f32 in k order
//   from c.
// - ldmatrix row addresses must be 16-byte aligned (std::logic_error otherwise).
// - cp.async: the 16 bytes are read at the call but land in shared memory only when the
//   thread's cp_async_wait retires their group; until then the destination holds 0xFF bytes
//   (NaN in bf16, f16 and f32), written at the call. So a kernel that reads a tile before
//   waiting for it, or before the barrier after the other threads' waits, reads NaN; and
//   one that issues a copy into a buffer another warp still reads (a missing barrier)
//   gives that warp NaN. A thread that starts a new block with copies never waited for is
//   reported (std::logic_error).
// Not emulated: timing, bank conflicts, the .shared window check of the addresses (any
// host pointer is accepted as shared memory).
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "testing/cuda_emulation.h"

namespace ferry_emu::mma {

// One lane's operands of a collective call.
struct LaneOperands {
  uint32_t a[4] = {}, b[2] = {};
  float c[4] = {};
  const unsigned char* row = nullptr;
};

inline std::vector<LaneOperands> exchange;  // per thread of the block

inline LaneOperands& slot(unsigned thread) {
  if (exchange.size() <= thread) exchange.resize(std::max<size_t>(thread + 1, 1024));
  return exchange[thread];
}

inline unsigned lane() {
  return threadIdx.x % 32;
}
inline unsigned warp_base() {
  return threadIdx.x / 32 * 32;
}

inline void meet() {
  ::ferry_emu::wait_at(::ferry_emu::Fiber::at_warp);
}

inline float widen16(uint16_t bits, bool bf16) {
  return bf16 ? ferry::nn::bf16_to_f32(bits) : ferry::nn::f16_to_f32(bits);
}
inline uint16_t half_of(uint32_t reg, int i) {
  return static_cast<uint16_t>(i == 0 ? reg & 0xFFFFu : reg >> 16);
}

// d = a b + c for the warp (layouts in nn/cuda/mma.cuh). Every lane rebuilds the three
// matrices from the lanes' registers with the ISA's element-to-lane map, then computes its
// own four elements of d.
inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4],
                         bool bf16) {
  ::ferry_emu::wmma_called({bf16 ? 10 : 11, nullptr, 0, 0});
  LaneOperands& mine = slot(threadIdx.x);
  std::memcpy(mine.a, a, sizeof mine.a);
  std::memcpy(mine.b, b, sizeof mine.b);
  std::memcpy(mine.c, c, sizeof mine.c);
  meet();
  float A[16][16], B[16][8], C[16][8];
  for (unsigned l = 0; l < 32; ++l) {
    const LaneOperands& o = exchange[warp_base() + l];
    const int g = static_cast<int>(l / 4), t = static_cast<int>(l % 4);
    for (int i = 0; i < 8; ++i) {  // a0..a7: register i / 2, half i % 2
      const int row = g + ((i / 2) % 2 == 1 ? 8 : 0), col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
      A[row][col] = widen16(half_of(o.a[i / 2], i % 2), bf16);
    }
    for (int i = 0; i < 4; ++i) {  // b0..b3
      const int row = t * 2 + (i & 1) + (i >= 2 ? 8 : 0), col = g;
      B[row][col] = widen16(half_of(o.b[i / 2], i % 2), bf16);
    }
    for (int i = 0; i < 4; ++i) C[g + (i >= 2 ? 8 : 0)][t * 2 + (i & 1)] = o.c[i];
  }
  const int g = static_cast<int>(lane() / 4), t = static_cast<int>(lane() % 4);
  float out[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >= 2 ? 8 : 0), col = t * 2 + (i & 1);
    float acc = C[row][col];
    for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
    out[i] = acc;
  }
  meet();  // every lane has read the exchange before any writes it again
  std::memcpy(d, out, sizeof out);
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16.
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans) {
  ::ferry_emu::wmma_called({trans ? 13 : 12, nullptr, 0, 0});
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) {
    throw std::logic_error("cuda emulation: ldmatrix: lane " + std::to_string(lane()) +
                           "'s row address is not 16-byte aligned");
  }
  slot(threadIdx.x).row = static_cast<const unsigned char*>(row);
  meet();
  const unsigned i = lane();
  uint32_t got[4];
  for (unsigned j = 0; j < 4; ++j) {
    auto element = [&](unsigned r, unsigned c) {  // matrix j's element (r, c), 16 bits
      uint16_t v;
      std::memcpy(&v, exchange[warp_base() + 8 * j + r].row + 2 * c, 2);
      return uint32_t{v};
    };
    got[j] = trans ? element(2 * (i % 4), i / 4) | element(2 * (i % 4) + 1, i / 4) << 16
                   : element(i / 4, 2 * (i % 4)) | element(i / 4, 2 * (i % 4) + 1) << 16;
  }
  meet();
  std::memcpy(r, got, sizeof got);
}

// ---- cp.async ----------------------------------------------------------------------------------

struct PendingCopy {
  unsigned char* dst;
  unsigned char bytes[16];
};

struct ThreadCopies {
  dim3 block{0, 0, 0};
  const void* shared = nullptr;  // the launch's dynamic shared memory: with block, which block issued
  std::vector<PendingCopy> open;
  std::vector<std::vector<PendingCopy>> committed;  // oldest first
};

inline std::vector<ThreadCopies> copies;  // per thread of the block

inline ThreadCopies& copies_of_this_thread() {
  if (copies.size() <= threadIdx.x) copies.resize(threadIdx.x + 1);
  ThreadCopies& c = copies[threadIdx.x];
  const dim3 b = blockIdx;
  const bool same = c.block.x == b.x && c.block.y == b.y && c.block.z == b.z &&
                    c.shared == ::ferry_emu::dynamic_shared_memory;
  if (!same) {
    if (!c.open.empty() || !c.committed.empty()) {
      c.open.clear();
      c.committed.clear();
      throw std::logic_error("cuda emulation: thread " + std::to_string(threadIdx.x) +
                             " left cp.async copies never waited for (cp.async.wait_group) in an earlier block");
    }
    c.block = b;
    c.shared = ::ferry_emu::dynamic_shared_memory;
  }
  return c;
}

inline void cp_async_16(void* dst, const void* src, bool valid) {
  if ((reinterpret_cast<uintptr_t>(dst) | (valid ? reinterpret_cast<uintptr_t>(src) : 0)) % 16 != 0) {
    throw std::logic_error("cuda emulation: cp.async of 16 bytes at an address not 16-byte aligned");
  }
  ThreadCopies& c = copies_of_this_thread();
  PendingCopy p{static_cast<unsigned char*>(dst), {}};
  if (valid) std::memcpy(p.bytes, src, 16);
  std::memset(dst, 0xFF, 16);  // not there yet: NaN until the wait
  c.open.push_back(p);
}

inline void cp_async_commit() {
  ThreadCopies& c = copies_of_this_thread();
  c.committed.push_back(std::move(c.open));
  c.open.clear();
}

inline void cp_async_wait(int n) {
  ThreadCopies& c = copies_of_this_thread();
  while (c.committed.size() > static_cast<size_t>(n)) {
    for (const PendingCopy& p : c.committed.front()) std::memcpy(p.dst, p.bytes, 16);
    c.committed.erase(c.committed.begin());
  }
}

}  // namespace ferry_emu::mma
