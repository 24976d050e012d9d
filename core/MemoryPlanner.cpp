#include "core/MemoryPlanner.h"

#include "core/Device.h"

#include <algorithm>

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

ArenaPlan planArenas(const std::vector<PlannedItem>& items, const std::vector<PlannedValue>& values, int arenas) {
  // Lifetimes: the item that writes a value and the last that reads it.
  std::vector<int> producer(values.size(), -1), lastUse(values.size(), -1);
  for (size_t k = 0; k < items.size(); ++k) {
    for (int v : items[k].reads) lastUse[static_cast<size_t>(v)] = static_cast<int>(k);
    for (int v : items[k].writes) producer[static_cast<size_t>(v)] = static_cast<int>(k);
  }
  std::vector<std::vector<int>> dying(items.size());
  for (size_t v = 0; v < values.size(); ++v) {
    if (values[v].planned) dying[static_cast<size_t>(std::max(lastUse[v], producer[v]))].push_back(static_cast<int>(v));
  }

  ArenaPlan plan;
  plan.offsets.assign(values.size(), 0);
  std::vector<MemoryPlanner> planners(static_cast<size_t>(arenas));
  // Each planned value's block is its owner's: the value that allocated it. A view or an op in
  // place puts its output on its input's block; the block is free once all its values are dead.
  std::vector<MemoryPlanner::Block> blockOf(values.size());
  std::vector<size_t> owner(values.size());
  std::vector<int> liveOnBlock(values.size(), 0);  // by owner
  const auto alike = [&](size_t a, size_t b) {
    return values[a].planned && values[a].arena == values[b].arena && values[a].bytes == values[b].bytes &&
           values[a].dtype == values[b].dtype;
  };
  const auto share = [&](size_t v, size_t in) {
    owner[v] = owner[in];
    ++liveOnBlock[owner[v]];
  };
  for (size_t k = 0; k < items.size(); ++k) {
    const PlannedItem& item = items[k];
    for (size_t i = 0; i < item.writes.size(); ++i) {
      const auto v = static_cast<size_t>(item.writes[i]);
      if (!values[v].planned) continue;
      plan.unplannedBytes += values[v].bytes;
      if (i == 0 && item.viewInput >= 0 && alike(static_cast<size_t>(item.viewInput), v)) {
        share(v, static_cast<size_t>(item.viewInput));
        ++plan.viewOps;
        continue;
      }
      if (i == 0 && item.inplaceInput >= 0) {
        const auto in = static_cast<size_t>(item.inplaceInput);
        if (alike(in, v) && lastUse[in] == static_cast<int>(k) && liveOnBlock[owner[in]] == 1) {
          share(v, in);
          ++plan.inplaceOps;
          continue;
        }
      }
      blockOf[v] = planners[static_cast<size_t>(values[v].arena)].allocate(values[v].bytes);
      owner[v] = v;
      liveOnBlock[v] = 1;
    }
    for (int v : dying[k]) {
      const size_t block = owner[static_cast<size_t>(v)];
      if (--liveOnBlock[block] == 0) planners[static_cast<size_t>(values[block].arena)].release(blockOf[block]);
    }
  }
  for (size_t v = 0; v < values.size(); ++v)
    if (values[v].planned) plan.offsets[v] = blockOf[owner[v]].offset;
  for (const MemoryPlanner& p : planners) plan.arenaBytes.push_back(p.arenaBytes());
  return plan;
}

}  // namespace weft
