// How a served variable's rows travel between the workers and the servers: as stored, or, with
// Config::wireDType bf16, narrowed to 16 bits where the variable is f32. The servers keep f32
// values and slots and sum pushes in f32; only what pulls return and pushes carry is narrowed (a
// worker sums its rows of one id before narrowing them). LOAD and FETCH, which carry the initial
// values and checkpoints, stay whole. f16 does not narrow them: a sparse gradient's rows are
// often below f16's smallest normal (6e-5), where it loses bits, and below 6e-8 they would vanish.
#pragma once

#include "core/DType.h"
#include "dist/Placement.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace weft::dist {

struct RowWire {
  size_t rowBytes = 0;  ///< a stored row
  DType wire = DType::F32;
  bool narrowed = false;

  /// How the rows of `v` travel under the job's wire dtype `wire` (f32, bf16 or f16).
  static RowWire of(const ServedVariable& v, DType wire);
  /// A travelling row's bytes.
  size_t bytes() const { return narrowed ? rowBytes / 2 : rowBytes; }
  /// Stored rows as they travel (the same bytes when not narrowed).
  std::vector<uint8_t> narrow(std::vector<uint8_t> rows) const;
  /// Appends stored rows to `out` as they travel.
  void appendTravelling(std::span<const uint8_t> rows, std::vector<uint8_t>& out) const;
  /// Travelling rows into stored ones at `out`.
  void widen(std::span<const uint8_t> rows, uint8_t* out) const;
};

}  // namespace weft::dist
