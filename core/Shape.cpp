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
  int64_t n = 1;
  for (int64_t d : dims_) {
    if (d < 0) return -1;
    n *= d;
  }
  return n;
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
