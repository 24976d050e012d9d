// The static memory plan of a compiled step: every intermediate value gets an offset in its
// device's arena, reused by liveness. Two levels: MemoryPlanner hands out offsets in one arena
// (best-fit reuse of released blocks, coalescing neighbours, growing only when nothing fits),
// and planArenas applies the executor's liveness and in-place rules over a whole step.
#pragma once

#include "core/DType.h"

#include <cstddef>
#include <map>
#include <vector>

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

/// A value of a step, numbered as the executor numbers its slots.
struct PlannedValue {
  size_t bytes = 0;
  DType dtype = DType::F32;
  int arena = 0;         ///< the arena of the device it lives on
  bool planned = false;  ///< placed in the arena (not a variable, feed, constant or fetched value)
};

/// One work item of a step, in plan order: the values it reads (inputs, and a run condition)
/// and writes, the input its first output may overwrite (-1: none), and the input whose bytes
/// its first output is unchanged (-1: none).
struct PlannedItem {
  std::vector<int> reads;
  std::vector<int> writes;
  int inplaceInput = -1;
  int viewInput = -1;
};

/// Where each planned value goes, and what that costs.
struct ArenaPlan {
  std::vector<size_t> offsets;     ///< per value (meaningful where planned)
  std::vector<size_t> arenaBytes;  ///< per arena
  size_t unplannedBytes = 0;       ///< what the planned values would take without reuse
  size_t inplaceOps = 0;           ///< items whose output took over a dying input's block
  size_t viewOps = 0;              ///< items whose output shares its input's block
};

/// The arena plan of a step whose `arenas` arenas hold `values`, written and read by `items` in
/// order. A value lives from the item that writes it to the last that reads it. An item's
/// outputs are placed before its dying inputs are released, so an output never overlaps an input,
/// except that its first output takes over the block of `inplaceInput` when that input is planned,
/// dies at this item, has the same size and dtype, and shares its block with no other live
/// value; and that it shares the block of `viewInput` when that input is planned in the same
/// arena with the same size and dtype. A block shared so is free once every value on it is dead.
ArenaPlan planArenas(const std::vector<PlannedItem>& items, const std::vector<PlannedValue>& values, int arenas);

}  // namespace weft
