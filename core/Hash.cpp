#include "core/Hash.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace weft {
namespace {

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kPrime3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ULL;

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/// A little-endian T at p, whatever the host's byte order.
template <class T>
uint64_t load(const unsigned char* p) {
  unsigned char bytes[sizeof(T)];
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  std::reverse_copy(p, p + sizeof(T), bytes);
#else
  std::copy(p, p + sizeof(T), bytes);
#endif
  T v;
  std::memcpy(&v, bytes, sizeof v);
  return v;
}

uint64_t lane(uint64_t acc, uint64_t input) { return rotl(acc + input * kPrime2, 31) * kPrime1; }
uint64_t mergeLane(uint64_t acc, uint64_t v) { return (acc ^ lane(0, v)) * kPrime1 + kPrime4; }

}  // namespace

uint64_t xxh64(const void* data, size_t bytes, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + bytes;
  uint64_t h;
  if (bytes >= 32) {
    // Four lanes over 32-byte stripes.
    uint64_t v1 = seed + kPrime1 + kPrime2, v2 = seed + kPrime2, v3 = seed, v4 = seed - kPrime1;
    for (; end - p >= 32; p += 32) {
      v1 = lane(v1, load<uint64_t>(p));
      v2 = lane(v2, load<uint64_t>(p + 8));
      v3 = lane(v3, load<uint64_t>(p + 16));
      v4 = lane(v4, load<uint64_t>(p + 24));
    }
    h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    h = mergeLane(mergeLane(mergeLane(mergeLane(h, v1), v2), v3), v4);
  } else {
    h = seed + kPrime5;
  }
  h += bytes;
  for (; end - p >= 8; p += 8) h = rotl(h ^ lane(0, load<uint64_t>(p)), 27) * kPrime1 + kPrime4;
  if (end - p >= 4) {
    h = rotl(h ^ (load<uint32_t>(p) * kPrime1), 23) * kPrime2 + kPrime3;
    p += 4;
  }
  for (; p < end; ++p) h = rotl(h ^ (*p * kPrime5), 11) * kPrime1;
  // Avalanche.
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  return h ^ (h >> 32);
}

std::string hex64(uint64_t value) { return fmt::format("{:016x}", value); }

}  // namespace weft
