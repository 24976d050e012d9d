#include "core/Shape.h"

#include "core/Error.h"

namespace weft {

bool Shape::isFullyDefined() const {
  for (int64_t d : dims_) {
    if (d < 0) return false;
  }
  return true;
}

int64_t Shape::numel() const {
  if (!isFullyDefined()) return -1;
  int64_t n = 1;
  for (int64_t d : dims_) {
    WEFT_CHECK(!__builtin_mul_overflow(n, d, &n), "shape {} has more than 2^63 - 1 elements", str());
  }
  return n;
}

size_t Shape::bytes(size_t elementSize) const {
  const int64_t n = numel();
  WEFT_CHECK(n >= 0, "shape {} is not fully known, so its size in bytes is not either", str());
  size_t total = 0;
  WEFT_CHECK(!__builtin_mul_overflow(static_cast<size_t>(n), elementSize, &total),
             "shape {} of {}-byte elements has more than 2^64 - 1 bytes", str(), elementSize);
  return total;
}

std::string Shape::str() const {
  std::string s = "[";
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (i) s += ", ";
    s += dims_[i] < 0 ? std::string("?") : std::to_string(dims_[i]);
  }
  return s + "]";
}

bool Shape::compatibleWith(const Shape& other) const {
  if (rank() != other.rank()) return false;
  for (int i = 0; i < rank(); ++i) {
    if ((*this)[i] >= 0 && other[i] >= 0 && (*this)[i] != other[i]) return false;
  }
  return true;
}

int Shape::axis(int64_t a) const {
  const int64_t r = rank();
  WEFT_CHECK(a >= -r && a < r, "axis {} is out of range for a tensor of rank {} (shape {})", a, r,
             str());
  return static_cast<int>(a < 0 ? a + r : a);
}

std::vector<int64_t> contiguousStrides(const Shape& s) {
  std::vector<int64_t> strides(static_cast<size_t>(s.rank()), 1);
  for (int i = s.rank() - 2; i >= 0; --i) strides[i] = strides[i + 1] * s[i + 1];
  return strides;
}

}  // namespace weft
