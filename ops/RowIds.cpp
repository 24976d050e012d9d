// Row ids (see the header).
#include "ops/RowIds.h"

#include "core/Error.h"

#include <algorithm>
#include <numeric>

namespace weft {

namespace {

void checkRange(std::span<const int64_t> ids, int64_t rows, std::string_view what) {
  for (size_t i = 0; i < ids.size(); ++i)
    WEFT_CHECK(ids[i] >= 0 && ids[i] < rows, "{} {} at position {} is outside [0, {})", what, ids[i], i, rows);
}

}  // namespace

std::vector<int64_t> checkedRowIds(std::span<const int64_t> ids, int64_t rows, std::string_view what) {
  checkRange(ids, rows, what);
  return std::vector<int64_t>(ids.begin(), ids.end());
}

std::vector<int64_t> rowIds(const Tensor& ids) {
  std::vector<int64_t> out(static_cast<size_t>(ids.numel()));
  dispatchIndex(ids.dtype(), [&](auto z) {
    using I = decltype(z);
    const I* p = ids.data<I>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int64_t>(p[i]);
  });
  return out;
}

std::vector<int64_t> checkedRowIds(const Tensor& ids, int64_t rows, std::string_view what) {
  std::vector<int64_t> out = rowIds(ids);
  checkRange(out, rows, what);
  return out;
}

std::vector<int64_t> checkedRowIds(const KernelContext& ctx, const Tensor& ids, int64_t rows, std::string_view what) {
  try {
    return checkedRowIds(ids, rows, what);
  } catch (const Error& e) {
    ctx.failMessage(e.what());
  }
}

RowGroups groupRowsById(std::span<const int64_t> ids) {
  RowGroups g;
  g.order.resize(ids.size());
  std::iota(g.order.begin(), g.order.end(), int64_t{0});
  std::stable_sort(g.order.begin(), g.order.end(),
                   [&](int64_t a, int64_t b) { return ids[static_cast<size_t>(a)] < ids[static_cast<size_t>(b)]; });
  for (size_t k = 0; k < g.order.size(); ++k) {
    if (k == 0 || ids[static_cast<size_t>(g.order[k])] != ids[static_cast<size_t>(g.order[k - 1])])
      g.starts.push_back(static_cast<int64_t>(k));
  }
  g.starts.push_back(static_cast<int64_t>(g.order.size()));
  return g;
}

}  // namespace weft
