// 64-bit content hashes: XXH64 (the xxHash algorithm's 64-bit variant, written here from its
// specification), so the checksums in a checkpoint can be checked by any xxHash implementation.
//
//     const uint64_t h = xxh64(t.raw(), t.bytes());        // one buffer
//     h = xxh64(more.data(), more.size(), h);              // chained: seeded with the last hash
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace weft {

/// XXH64 of `bytes` bytes at `data` with `seed`.
uint64_t xxh64(const void* data, size_t bytes, uint64_t seed = 0);

/// Sixteen lower-case hex digits.
std::string hex64(uint64_t value);

}  // namespace weft
