// Offsets within one arena for values with known lifetimes: best-fit reuse of released blocks,
// coalescing neighbours, growing the arena only when nothing fits.
#pragma once

#include <cstddef>
#include <map>

namespace weft {

class MemoryPlanner {
 public:
  struct Block {
    size_t offset = 0;
    size_t size = 0;
  };

  /// A block of at least `bytes` (rounded up to the CPU alignment).
  Block allocate(size_t bytes);
  void release(const Block& block);
  size_t arenaBytes() const { return end_; }

 private:
  std::map<size_t, size_t> free_;  // offset -> size, coalesced
  size_t end_ = 0;
};

}  // namespace weft
