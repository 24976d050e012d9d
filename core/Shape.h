// Tensor shapes. A dimension of -1 is unknown until run time (e.g. a placeholder's batch size).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace weft {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int axis) const { return dims_[static_cast<size_t>(axis)]; }
  int64_t& operator[](int axis) { return dims_[static_cast<size_t>(axis)]; }
  const std::vector<int64_t>& dims() const { return dims_; }
  std::vector<int64_t>& dims() { return dims_; }

  /// True when no dimension is -1.
  bool isFullyDefined() const;
  /// Product of the dimensions; -1 when any is unknown. Throws when it does not fit an int64_t.
  int64_t numel() const;
  /// numel() x elementSize of a fully known shape; throws when either overflows.
  size_t bytes(size_t elementSize) const;
  /// "[2, 3]"; unknown dimensions print as "?".
  std::string str() const;
  /// True when both have the same rank and every known pair of dimensions agrees.
  bool compatibleWith(const Shape& other) const;
  /// Normalises a possibly negative axis; throws when out of range.
  int axis(int64_t a) const;

  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }

 private:
  std::vector<int64_t> dims_;
};

/// Row-major strides of a fully defined shape, in elements.
std::vector<int64_t> contiguousStrides(const Shape& s);

}  // namespace weft
