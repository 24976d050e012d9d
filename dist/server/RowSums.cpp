// Rows summed by id (see the header).
#include "dist/server/RowSums.h"

#include "core/Tensor.h"
#include "ops/RowIds.h"

namespace weft::dist {

RowSums sumRowsById(DType dtype, size_t rowBytes, const std::vector<int64_t>& ids,
                    const std::vector<const uint8_t*>& rows) {
  const RowGroups groups = groupRowsById(ids);
  RowSums out;
  dispatchFloat(dtype, [&](auto z) {
    using T = decltype(z);
    const size_t width = rowBytes / sizeof(T);
    std::vector<T> sums(static_cast<size_t>(groups.count()) * width, T(0));
    for (int64_t g = 0; g < groups.count(); ++g) {
      out.ids.push_back(ids[static_cast<size_t>(groups.order[static_cast<size_t>(groups.begin(g))])]);
      T* dst = sums.data() + static_cast<size_t>(g) * width;
      for (int64_t k = groups.begin(g); k < groups.end(g); ++k) {
        const T* src = reinterpret_cast<const T*>(rows[static_cast<size_t>(groups.order[static_cast<size_t>(k)])]);
        for (size_t j = 0; j < width; ++j) dst[j] += src[j];
      }
    }
    const auto* p = reinterpret_cast<const uint8_t*>(sums.data());
    out.rows.assign(p, p + sums.size() * sizeof(T));
  });
  return out;
}

}  // namespace weft::dist
