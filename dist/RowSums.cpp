// Rows summed by id (see the header).
#include "dist/RowSums.h"

#include "core/Tensor.h"

#include <algorithm>
#include <numeric>

namespace weft::dist {

RowSums sumRowsById(DType dtype, size_t rowBytes, const std::vector<int64_t>& ids,
                    const std::vector<const uint8_t*>& rows) {
  std::vector<size_t> order(ids.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ids[a] < ids[b]; });
  RowSums out;
  dispatchFloat(dtype, [&](auto z) {
    using T = decltype(z);
    const size_t width = rowBytes / sizeof(T);
    std::vector<T> sums;
    for (size_t i : order) {
      if (out.ids.empty() || out.ids.back() != ids[i]) {
        out.ids.push_back(ids[i]);
        sums.resize(sums.size() + width, T(0));
      }
      T* dst = sums.data() + sums.size() - width;
      const T* src = reinterpret_cast<const T*>(rows[i]);
      for (size_t k = 0; k < width; ++k) dst[k] += src[k];
    }
    const auto* p = reinterpret_cast<const uint8_t*>(sums.data());
    out.rows.assign(p, p + sums.size() * sizeof(T));
  });
  return out;
}

}  // namespace weft::dist
