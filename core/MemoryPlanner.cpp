#include "core/MemoryPlanner.h"

#include "core/Device.h"

namespace weft {

MemoryPlanner::Block MemoryPlanner::allocate(size_t bytes) {
  const size_t size = (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
  if (size == 0) return {0, 0};
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second >= size && (best == free_.end() || it->second < best->second)) best = it;
  }
  if (best != free_.end()) {
    Block b{best->first, size};
    const size_t rest = best->second - size;
    const size_t restOffset = best->first + size;
    free_.erase(best);
    if (rest) free_[restOffset] = rest;
    return b;
  }
  // Grow: if the last free block touches the end, extend it instead of leaving a hole.
  if (!free_.empty()) {
    auto last = std::prev(free_.end());
    if (last->first + last->second == end_) {
      Block b{last->first, size};
      end_ = last->first + size;
      free_.erase(last);
      return b;
    }
  }
  Block b{end_, size};
  end_ += size;
  return b;
}

void MemoryPlanner::release(const Block& block) {
  if (block.size == 0) return;
  auto [it, inserted] = free_.emplace(block.offset, block.size);
  if (!inserted) return;
  auto next = std::next(it);
  if (next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

}  // namespace weft
