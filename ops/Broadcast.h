// Row-wise index mapping from an output shape to a (right-aligned, numpy-broadcast) input shape:
// the output is walked as rows of its last dimension, and each row starts at rowOffset(row) in
// the input, advancing by innerStride (0 where the input's last dimension is broadcast).
#pragma once

#include "core/Shape.h"

#include <vector>

namespace weft::detail {

class Broadcaster {
 public:
  Broadcaster(const Shape& out, const Shape& in);

  int64_t rows() const { return rows_; }
  int64_t inner() const { return inner_; }
  int64_t innerStride() const { return innerStride_; }
  int64_t rowOffset(int64_t row) const {
    int64_t off = 0;
    for (int d = static_cast<int>(outDims_.size()) - 2; d >= 0; --d) {
      const int64_t n = outDims_[static_cast<size_t>(d)];
      off += (row % n) * strides_[static_cast<size_t>(d)];
      row /= n;
    }
    return off;
  }

 private:
  std::vector<int64_t> outDims_, strides_;
  int64_t rows_ = 1, inner_ = 1, innerStride_ = 1;
};

}  // namespace weft::detail
