// 64-bit content hashes: XXH64 (the xxHash algorithm's 64-bit variant, written here from its
// specification), so the checksums in a checkpoint can be checked by any xxHash implementation.
//
//     const uint64_t h = xxh64(t.raw(), t.bytes());        // one buffer
//     h = xxh64(more.data(), more.size(), h);              // chained: seeded with the last hash
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace weft {

/// XXH64 of `bytes` bytes at `data` with `seed`.
uint64_t xxh64(const void* data, size_t bytes, uint64_t seed = 0);

/// Sixteen lower-case hex digits.
std::string hex64(uint64_t value);

/// A hash of strings that finds std::string keys by a std::string_view too (with
/// std::equal_to<>), so that looking a token up does not build a string of it.
///
///     std::unordered_map<std::string, int64_t, StringHash, std::equal_to<>> counts;
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

}  // namespace weft
