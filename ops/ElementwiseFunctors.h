// The scalar functions of the binary elementwise ops, shared by their CPU kernels
// (ops/Elementwise.cpp) and CUDA kernels (ops/cuda/Elementwise.cu), so both compute one formula.
#pragma once

#include "core/HostDevice.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace weft::functors {

// kCost: rough nanoseconds per element on the CPU (sizes the thread pool's chunks).
struct Add { static constexpr int64_t kCost = 1; template <class T> WEFT_HOST_DEVICE static T apply(T a, T b) { return a + b; } };
struct Sub { static constexpr int64_t kCost = 1; template <class T> WEFT_HOST_DEVICE static T apply(T a, T b) { return a - b; } };
struct Mul { static constexpr int64_t kCost = 1; template <class T> WEFT_HOST_DEVICE static T apply(T a, T b) { return a * b; } };
struct Div { static constexpr int64_t kCost = 2; template <class T> WEFT_HOST_DEVICE static T apply(T a, T b) { return a / b; } };
struct Max { static constexpr int64_t kCost = 1; template <class T> WEFT_HOST_DEVICE static T apply(T a, T b) { return a >= b ? a : b; } };
struct Min { static constexpr int64_t kCost = 1; template <class T> WEFT_HOST_DEVICE static T apply(T a, T b) { return a <= b ? a : b; } };
struct Pow {
  static constexpr int64_t kCost = 20;
  template <class T>
  WEFT_HOST_DEVICE static T apply(T a, T b) {
    if constexpr (std::is_same_v<T, float>) return ::powf(a, b);
    else return static_cast<T>(::pow(static_cast<double>(a), static_cast<double>(b)));
  }
};
struct Less { static constexpr int64_t kCost = 1; template <class T> WEFT_HOST_DEVICE static T apply(T a, T b) { return a < b; } };
struct LessEqual { static constexpr int64_t kCost = 1; template <class T> WEFT_HOST_DEVICE static T apply(T a, T b) { return a <= b; } };
struct Greater { static constexpr int64_t kCost = 1; template <class T> WEFT_HOST_DEVICE static T apply(T a, T b) { return a > b; } };
struct GreaterEqual { static constexpr int64_t kCost = 1; template <class T> WEFT_HOST_DEVICE static T apply(T a, T b) { return a >= b; } };
struct Equal { static constexpr int64_t kCost = 1; template <class T> WEFT_HOST_DEVICE static T apply(T a, T b) { return a == b; } };
struct NotEqual { static constexpr int64_t kCost = 1; template <class T> WEFT_HOST_DEVICE static T apply(T a, T b) { return a != b; } };

}  // namespace weft::functors
