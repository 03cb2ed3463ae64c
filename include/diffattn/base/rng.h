// The one seeded generator of diffattn (base layer): fully specified integer arithmetic, no
// <random> distributions, so a seed names the same weights, batches, tasks and samples with any
// standard library and on any machine.
//  - splitmix64(state): the counter-based step (advance by the golden ratio, then mix64).
//  - mix64(x): splitmix64's finaliser, a bijective hash of one 64-bit word.
//  - Rng: xoshiro256** seeded by splitmix64, with uniform, below and Box-Muller normals.
#pragma once

#include <cmath>
#include <cstdint>

namespace diffattn {

inline constexpr uint64_t kGolden64 = 0x9E3779B97F4A7C15ull;

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint64_t splitmix64(uint64_t& state) { return mix64(state += kGolden64); }

// Uniform in [0, 1) from the top 53 bits of a word.
inline double unit_double(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (uint64_t& w : s_) w = splitmix64(x);
  }

  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return unit_double(next()); }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return static_cast<uint64_t>(uniform() * static_cast<double>(n)); }

  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = uniform();
    while (u1 <= 0.0) u1 = uniform();
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * M_PI * u2);
    has_spare_ = true;
    return r * std::cos(2.0 * M_PI * u2);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace diffattn
