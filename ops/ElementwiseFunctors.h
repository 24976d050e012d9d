// The scalar functions of the binary elementwise ops, shared by their CPU kernels
// (ops/Elementwise.cpp) and CUDA kernels (ops/cuda/Elementwise.cu), so both compute one formula.
#pragma once

#include "core/HostDevice.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace weft::functors {

// kCost: rough nanoseconds per element on the CPU (sizes the thread pool's chunks).
struct Add {
  static constexpr int64_t kCost = 1;
  template <class T>
  WEFT_HOST_DEVICE static T apply(T a, T b) {
    return a + b;
  }
};
struct Sub {
  static constexpr int64_t kCost = 1;
  template <class T>
  WEFT_HOST_DEVICE static T apply(T a, T b) {
    return a - b;
  }
};
struct Mul {
  static constexpr int64_t kCost = 1;
  template <class T>
  WEFT_HOST_DEVICE static T apply(T a, T b) {
    return a * b;
  }
};
struct Div {
  static constexpr int64_t kCost = 2;
  template <class T>
  WEFT_HOST_DEVICE static T apply(T a, T b) {
    return a / b;
  }
};
struct Max {
  static constexpr int64_t kCost = 1;
  template <class T>
  WEFT_HOST_DEVICE static T apply(T a, T b) {
    return a >= b ? a : b;
  }
};
struct Min {
  static constexpr int64_t kCost = 1;
  template <class T>
  WEFT_HOST_DEVICE static T apply(T a, T b) {
    return a <= b ? a : b;
  }
};
/// Integers raise exactly, by squaring, wrapping on overflow like the other integer ops (the
/// library pow's rounding differs between CPU and GPU); a negative exponent gives the truncated
/// reciprocal: 1 for a = 1, +-1 for a = -1, 0 otherwise (also for a = 0).
struct Pow {
  static constexpr int64_t kCost = 20;
  template <class T>
  WEFT_HOST_DEVICE static T apply(T a, T b) {
    if constexpr (std::is_same_v<T, float>) {
      return ::powf(a, b);
    } else if constexpr (std::is_floating_point_v<T>) {
      return ::pow(a, b);
    } else {
      using U = std::make_unsigned_t<T>;
      if (b < 0) return a == 1 ? T(1) : a == -1 ? T(b % 2 == 0 ? 1 : -1) : T(0);
      U result = 1, base = static_cast<U>(a);
      for (auto e = static_cast<U>(b); e != 0; e >>= 1) {
        if (e & 1) result *= base;
        base *= base;
      }
      return static_cast<T>(result);
    }
  }
};
struct Less {
  static constexpr int64_t kCost = 1;
  template <class T>
  WEFT_HOST_DEVICE static T apply(T a, T b) {
    return a < b;
  }
};
struct LessEqual {
  static constexpr int64_t kCost = 1;
  template <class T>
  WEFT_HOST_DEVICE static T apply(T a, T b) {
    return a <= b;
  }
};
struct Greater {
  static constexpr int64_t kCost = 1;
  template <class T>
  WEFT_HOST_DEVICE static T apply(T a, T b) {
    return a > b;
  }
};
struct GreaterEqual {
  static constexpr int64_t kCost = 1;
  template <class T>
  WEFT_HOST_DEVICE static T apply(T a, T b) {
    return a >= b;
  }
};
struct Equal {
  static constexpr int64_t kCost = 1;
  template <class T>
  WEFT_HOST_DEVICE static T apply(T a, T b) {
    return a == b;
  }
};
struct NotEqual {
  static constexpr int64_t kCost = 1;
  template <class T>
  WEFT_HOST_DEVICE static T apply(T a, T b) {
    return a != b;
  }
};

}  // namespace weft::functors
