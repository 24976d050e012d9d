#include "ops/Broadcast.h"

namespace weft::detail {

Broadcaster::Broadcaster(const Shape& out, const Shape& in) {
  const int r = std::max(out.rank(), 1);
  outDims_.assign(static_cast<size_t>(r), 1);
  for (int i = 0; i < out.rank(); ++i) outDims_[static_cast<size_t>(r - out.rank() + i)] = out[i];
  std::vector<int64_t> inDims(static_cast<size_t>(r), 1);
  for (int i = 0; i < in.rank(); ++i) inDims[static_cast<size_t>(r - in.rank() + i)] = in[i];
  strides_.assign(static_cast<size_t>(r), 0);
  int64_t stride = 1;
  for (int d = r - 1; d >= 0; --d) {
    const auto u = static_cast<size_t>(d);
    strides_[u] = (inDims[u] == 1 && outDims_[u] != 1) ? 0 : stride;
    stride *= inDims[u];
  }
  inner_ = outDims_.back();
  innerStride_ = strides_.back();
  rows_ = 1;
  for (int d = 0; d < r - 1; ++d) rows_ *= outDims_[static_cast<size_t>(d)];
}

}  // namespace weft::detail
