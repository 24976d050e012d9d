// The 16-bit floating storage types of mixed precision: bfloat16 (f32's exponent, 8 mantissa
// bits) and IEEE binary16 (5 exponent bits, 11-bit significand). Conversions from float round to
// nearest, ties to even, as cuBLAS and cuDNN do; NaN stays NaN. Both sides of the CUDA backend
// use them, so the element layout matches __nv_bfloat16 and __half bit for bit.
#pragma once

#include "core/DType.h"
#include "core/HostDevice.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace weft {
namespace half_bits {

WEFT_HOST_DEVICE inline uint32_t ofFloat(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

WEFT_HOST_DEVICE inline float toFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/// Drops the low `shift` bits of `value`, rounding to nearest with ties to even.
WEFT_HOST_DEVICE inline uint32_t roundShift(uint32_t value, int shift) {
  const uint32_t kept = value >> shift, rest = value & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  return kept + ((rest > halfway || (rest == halfway && (kept & 1u))) ? 1u : 0u);
}

WEFT_HOST_DEVICE inline uint16_t bfloat16FromFloat(float f) {
  const uint32_t u = ofFloat(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  return static_cast<uint16_t>(roundShift(u, 16));  // a carry into the exponent is the right result
}

WEFT_HOST_DEVICE inline float bfloat16ToFloat(uint16_t b) { return toFloat(static_cast<uint32_t>(b) << 16); }

WEFT_HOST_DEVICE inline uint16_t float16FromFloat(float f) {
  const uint32_t u = ofFloat(f);
  const uint32_t sign = (u >> 16) & 0x8000u, magnitude = u & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  // 65520 lies halfway between the largest half (65504) and 2^16; it and everything above round
  // to infinity.
  if (magnitude >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (magnitude >= 0x38800000u) {  // a normal half: re-bias the exponent (127 -> 15), keep 10 bits
    return static_cast<uint16_t>(sign | roundShift(magnitude - 0x38000000u, 13));
  }
  // Below 2^-14: a subnormal half, counted in units of 2^-24; under 2^-25 rounds to zero.
  const int exponent = static_cast<int>(magnitude >> 23);
  if (exponent < 102) return static_cast<uint16_t>(sign);
  const uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
  return static_cast<uint16_t>(sign | roundShift(significand, 126 - exponent));
}

WEFT_HOST_DEVICE inline float float16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return toFloat(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // 2^-24, exact
    return sign ? -magnitude : magnitude;
  }
  return toFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

}  // namespace half_bits

/// A bfloat16 element. Converts explicitly to and from float (and through float from any
/// arithmetic type), so generic kernels can static_cast between element types.
struct BFloat16 {
  uint16_t bits = 0;

  BFloat16() = default;
  WEFT_HOST_DEVICE explicit BFloat16(float f) : bits(half_bits::bfloat16FromFloat(f)) {}
  WEFT_HOST_DEVICE explicit operator float() const { return half_bits::bfloat16ToFloat(bits); }
};

/// An IEEE binary16 element (largest finite 65504, smallest subnormal 2^-24).
struct Float16 {
  uint16_t bits = 0;

  Float16() = default;
  WEFT_HOST_DEVICE explicit Float16(float f) : bits(half_bits::float16FromFloat(f)) {}
  WEFT_HOST_DEVICE explicit operator float() const { return half_bits::float16ToFloat(bits); }
};

template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::BF16;
};
template <>
struct DTypeOf<Float16> {
  static constexpr DType value = DType::F16;
};

template <class T>
inline constexpr bool kIsHalf = std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>;

/// A floating value truncated to the signed integer type D, saturating at D's limits, NaN to 0:
/// what the GPU's conversion instructions do, given to the CPU too, where C++ leaves the
/// out-of-range cases undefined.
template <class D, class F>
WEFT_HOST_DEVICE inline D truncateSaturating(F value) {
  static_assert(std::is_signed_v<D> && (sizeof(D) == 4 || sizeof(D) == 8), "a 32- or 64-bit signed integer");
  constexpr D largest = static_cast<D>(~std::make_unsigned_t<D>(0) >> 1);
  constexpr F bound = sizeof(D) == 4 ? F(2147483648.0) : F(9223372036854775808.0);  // 2^31, 2^63: exact
  if (value != value) return D(0);
  if (value >= bound) return largest;
  if (value < -bound) return -largest - 1;
  return static_cast<D>(value);
}

/// One element converted between any two element types: through float when a 16-bit type is
/// involved, directly otherwise (so i64 -> f64 keeps 53 bits); floating to integer truncates and
/// saturates (truncateSaturating).
template <class D, class S>
WEFT_HOST_DEVICE inline D convertElement(S value) {
  if constexpr (kIsHalf<S>) {
    return convertElement<D>(static_cast<float>(value));
  } else if constexpr (kIsHalf<D>) {
    return static_cast<D>(static_cast<float>(value));
  } else if constexpr (std::is_integral_v<D> && std::is_floating_point_v<S>) {
    return truncateSaturating<D>(value);
  } else {
    return static_cast<D>(value);
  }
}

/// n floats to f16 and back, in bulk (eight at a time on x86 CPUs with F16C), with the same
/// results as the element conversions above (NaN payloads aside).
void floatsToFloat16(const float* src, Float16* dst, int64_t n);
void float16ToFloats(const Float16* src, float* dst, int64_t n);

/// True for the 16-bit storage types, whose CPU kernels compute in float.
inline bool isHalfPrecision(DType t) { return t == DType::BF16 || t == DType::F16; }

}  // namespace weft
