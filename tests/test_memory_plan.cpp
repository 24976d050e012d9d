// The arena plan's rules, on steps written out by hand (core/MemoryPlanner.h): a value's block is
// free again after its last reader, an output never overlaps a live input, an op marked in place
// takes over its dying input's block only when sizes and dtypes agree, a view shares its input's
// block for as long as either lives, values that are not planned take no space, and each
// device's values stay in their own arena.
#include "tests/TestUtil.h"

#include "core/Device.h"
#include "core/MemoryPlanner.h"

using namespace weft;

namespace {

PlannedValue planned(size_t bytes, int arena = 0, DType dtype = f32) { return {bytes, dtype, arena, true}; }

bool overlap(const ArenaPlan& p, int a, int b, size_t bytes) {
  const size_t x = p.offsets[static_cast<size_t>(a)], y = p.offsets[static_cast<size_t>(b)];
  return x < y + bytes && y < x + bytes;
}

}  // namespace

TEST_CASE("a block is reused once its value's last reader has run") {
  // v0 -> v1 -> v2 -> v3: a chain needs two blocks at a time.
  const std::vector<PlannedValue> values(4, planned(1024));
  const std::vector<PlannedItem> items{{{}, {0}, -1}, {{0}, {1}, -1}, {{1}, {2}, -1}, {{2}, {3}, -1}};
  const ArenaPlan p = planArenas(items, values, 1);
  CHECK(p.arenaBytes[0] == 2048);
  CHECK(p.unplannedBytes == 4096);
  CHECK(p.offsets[2] == p.offsets[0]);
}

TEST_CASE("an output never overlaps an input that is still being read") {
  const std::vector<PlannedValue> values(3, planned(256));
  // v2 = f(v0, v1): v0 and v1 die here, yet v2 gets a block of its own.
  const std::vector<PlannedItem> items{{{}, {0}, -1}, {{}, {1}, -1}, {{0, 1}, {2}, -1}};
  const ArenaPlan p = planArenas(items, values, 1);
  CHECK_FALSE(overlap(p, 2, 0, 256));
  CHECK_FALSE(overlap(p, 2, 1, 256));
  CHECK(p.inplaceOps == 0);
}

TEST_CASE("an op in place takes over its dying input's block when size and dtype agree") {
  std::vector<PlannedValue> values(3, planned(512));
  const std::vector<PlannedItem> items{{{}, {0}, -1}, {{0}, {1}, 0}, {{1}, {2}, 1}};
  ArenaPlan p = planArenas(items, values, 1);
  CHECK(p.inplaceOps == 2);
  CHECK(p.offsets[1] == p.offsets[0]);
  CHECK(p.offsets[2] == p.offsets[0]);
  CHECK(p.arenaBytes[0] == 512);

  values[1].dtype = i32;  // same bytes, another dtype: no takeover
  p = planArenas(items, values, 1);
  CHECK(p.inplaceOps == 0);
}

TEST_CASE("an op in place keeps its own block while its input is read later") {
  const std::vector<PlannedValue> values(3, planned(128));
  // v1 = f(v0) in place, but v0 is read again by the last item.
  const std::vector<PlannedItem> items{{{}, {0}, -1}, {{0}, {1}, 0}, {{0, 1}, {2}, -1}};
  const ArenaPlan p = planArenas(items, values, 1);
  CHECK(p.inplaceOps == 0);
  CHECK_FALSE(overlap(p, 1, 0, 128));
}

TEST_CASE("values that are not planned take no space, and each arena holds its own device's values") {
  std::vector<PlannedValue> values{planned(100), planned(300, 1), {200, f32, 0, false}};
  const std::vector<PlannedItem> items{{{}, {0}, -1}, {{0}, {1}, -1}, {{1}, {2}, -1}};
  const ArenaPlan p = planArenas(items, values, 2);
  REQUIRE(p.arenaBytes.size() == 2);
  CHECK(p.arenaBytes[0] == kCpuAlignment * 2);  // 100 bytes, rounded up
  CHECK(p.arenaBytes[1] == 320);
  CHECK(p.unplannedBytes == 400);
}

TEST_CASE("a run condition keeps its value alive until the item it gates") {
  const std::vector<PlannedValue> values(3, planned(64));
  // v0 gates the last item (read as its condition): v1 may not take v0's block.
  const std::vector<PlannedItem> items{{{}, {0}, -1}, {{}, {1}, -1}, {{1, 0}, {2}, -1}};
  const ArenaPlan p = planArenas(items, values, 1);
  CHECK_FALSE(overlap(p, 1, 0, 64));
}

TEST_CASE("a view shares its input's block while the input is still read, and the block outlives both") {
  const std::vector<PlannedValue> values(4, planned(256));
  // v1 = view(v0); v2 = f(v0, v1); v3 = g(v1): v2 may not land on v0's block, v3 neither.
  std::vector<PlannedItem> items{{{}, {0}}, {{0}, {1}}, {{0, 1}, {2}}, {{1, 2}, {3}}};
  items[1].viewInput = 0;
  const ArenaPlan p = planArenas(items, values, 1);
  CHECK(p.viewOps == 1);
  CHECK(p.offsets[1] == p.offsets[0]);
  CHECK_FALSE(overlap(p, 2, 0, 256));
  CHECK_FALSE(overlap(p, 3, 0, 256));
  CHECK_FALSE(overlap(p, 3, 2, 256));
}

TEST_CASE("an op in place does not take over a block that a live view shares") {
  const std::vector<PlannedValue> values(4, planned(512));
  // v1 = view(v0); v2 = f(v1) in place, v1 dying, but v0 is read after it.
  std::vector<PlannedItem> items{{{}, {0}}, {{0}, {1}}, {{1}, {2}, 1}, {{0, 2}, {3}}};
  items[1].viewInput = 0;
  ArenaPlan p = planArenas(items, values, 1);
  CHECK(p.inplaceOps == 0);
  CHECK_FALSE(overlap(p, 2, 0, 512));
  // Once v0 is read no more, v2 takes the block over.
  items[3].reads = {2};
  p = planArenas(items, values, 1);
  CHECK(p.inplaceOps == 1);
  CHECK(p.offsets[2] == p.offsets[0]);
}

TEST_CASE("a view of a value the plan does not hold, or of another size, gets its own block") {
  std::vector<PlannedValue> values{{256, f32, 0, false}, planned(256), planned(128), planned(128)};
  std::vector<PlannedItem> items{{{}, {0}}, {{0}, {1}}, {{1}, {2}}, {{1, 2}, {3}}};
  items[1].viewInput = 0;
  items[2].viewInput = 1;
  const ArenaPlan p = planArenas(items, values, 1);
  CHECK(p.viewOps == 0);
  CHECK_FALSE(overlap(p, 2, 1, 128));
}
