// Counter-based random numbers: value i of stream (seed) is a pure function of (seed, i), so
// results do not depend on thread count or on the order in which elements are drawn, and a GPU
// kernel draws exactly what the CPU draws.
#pragma once

#include "core/HostDevice.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace weft {

/// SplitMix64 finaliser: a bijective 64-bit mix with good avalanche.
WEFT_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// A stream key from a seed and a label (e.g. a variable's name).
inline uint64_t streamKey(uint64_t seed, const std::string& label) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over the label
  for (unsigned char c : label) h = (h ^ c) * 1099511628211ULL;
  return mix64(seed ^ mix64(h));
}

/// The stream of a random op's draws in session step `step`: a fresh one every run.
inline uint64_t stepKey(uint64_t key, uint64_t step) { return mix64(key ^ mix64(step)); }

/// Uniform in [0, 1) with 53 random bits.
WEFT_HOST_DEVICE inline double uniformAt(uint64_t key, uint64_t i) {
  return static_cast<double>(mix64(key ^ mix64(i)) >> 11) * (1.0 / 9007199254740992.0);
}

/// Standard normal (Box-Muller on two counter draws).
inline double normalAt(uint64_t key, uint64_t i) {
  const double u1 = 1.0 - uniformAt(key, 2 * i);  // (0, 1]
  const double u2 = uniformAt(key, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

/// Successive draws from one counter-based stream: what a generator draws for one example
/// depends on the example's key alone, not on how many others were drawn before it.
class Draws {
 public:
  explicit Draws(uint64_t key) : key_(key) {}
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniformAt(key_, next_++); }
  double normal() { return normalAt(key_, next_++); }
  /// An integer in [0, n).
  int64_t below(int64_t n) {
    return std::min(n - 1, static_cast<int64_t>(uniformAt(key_, next_++) * static_cast<double>(n)));
  }

 private:
  uint64_t key_;
  uint64_t next_ = 0;
};

}  // namespace weft
