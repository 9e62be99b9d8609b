// Deterministic random numbers that are the same on every platform and compiler:
// SplitMix64 for the stream and hand-written transforms for the distributions (the
// standard library's distributions are implementation-defined, so they would make a
// run's numbers depend on the toolchain).
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>

namespace ferry::nn {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  // A generator for a sub-stream named by several integers (seed, step, rank...).
  static Rng derive(std::initializer_list<uint64_t> keys) {
    uint64_t h = 0x6a09e667f3bcc909ull;
    for (uint64_t k : keys) h = mix(h ^ mix(k + 0x9e3779b97f4a7c15ull));
    return Rng(h);
  }

  uint64_t next_u64() {
    state_ += 0x9e3779b97f4a7c15ull;
    return mix(state_);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n), n > 0, without modulo bias.
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = next_u64();
    while (x >= limit);
    return x % n;
  }
  // Standard normal (Box-Muller; one value per call, the pair's second half is dropped
  // so that a draw depends only on the stream position).
  double normal() {
    double u1 = uniform();
    while (u1 <= 0.0) u1 = uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

}  // namespace ferry::nn
