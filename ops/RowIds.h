// Row ids as lookups, sparse updates, clipping and the parameter servers read them: integer ids
// checked against a row count, and positions grouped by id, so that rows of one id are summed in
// the order they came, the same way on every run and every machine.
#pragma once

#include "core/OpRegistry.h"
#include "core/Tensor.h"

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace weft {

/// The ids (i32 or i64) as int64.
std::vector<int64_t> rowIds(const Tensor& ids);
/// The same, checked: throws weft::Error "<what> <id> at position <i> is outside
/// [0, <rows>)" for the first one outside [0, rows).
std::vector<int64_t> checkedRowIds(const Tensor& ids, int64_t rows, std::string_view what = "row id");
std::vector<int64_t> checkedRowIds(std::span<const int64_t> ids, int64_t rows, std::string_view what = "row id");
/// The same in a kernel: the error names the op.
std::vector<int64_t> checkedRowIds(const KernelContext& ctx, const Tensor& ids, int64_t rows, std::string_view what);

/// Positions grouped by id: `order` holds the positions sorted by id, stably, and group g (the
/// g-th smallest id) is order[starts[g]] .. order[starts[g + 1] - 1].
struct RowGroups {
  std::vector<int64_t> order;
  std::vector<int64_t> starts;  ///< where each group begins in `order`, then order.size()

  int64_t count() const { return static_cast<int64_t>(starts.size()) - 1; }
  int64_t begin(int64_t g) const { return starts[static_cast<size_t>(g)]; }
  int64_t end(int64_t g) const { return starts[static_cast<size_t>(g) + 1]; }
};
RowGroups groupRowsById(std::span<const int64_t> ids);

}  // namespace weft
