// Sparse gradient rows summed by id, as a worker pushes them and as a machine's aggregator
// forwards them: each touched row once.
#pragma once

#include "core/DType.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace weft::dist {

struct RowSums {
  std::vector<int64_t> ids;   ///< distinct, ascending
  std::vector<uint8_t> rows;  ///< one summed row per id
};

/// Sums `rows[i]` (`rowBytes` of floating `dtype` each), named by `ids[i]`, by id; the rows of
/// one id are added in the order they come.
RowSums sumRowsById(DType dtype, size_t rowBytes, const std::vector<int64_t>& ids,
                    const std::vector<const uint8_t*>& rows);

}  // namespace weft::dist
