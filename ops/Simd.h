// 64-byte vectors for the hand-tiled CPU kernels (the direct and Winograd convolutions): one
// AVX-512 register, or two or four narrower ones where the target has no AVX-512; GCC's vector
// extensions map the arithmetic onto whatever the build targets.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>

namespace weft::detail::simd {

template <class T>
struct Simd;
template <>
struct Simd<float> {
  typedef float V __attribute__((vector_size(64)));
};
template <>
struct Simd<double> {
  typedef double V __attribute__((vector_size(64)));
};
template <class T>
using Vec = typename Simd<T>::V;
template <class T>
constexpr int64_t kLanes = static_cast<int64_t>(64 / sizeof(T));

template <class T>
inline Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
inline void store(T* p, const Vec<T>& v) {
  std::memcpy(p, &v, sizeof v);
}

namespace transpose_detail {
typedef int32_t Mask __attribute__((vector_size(64)));

/// The shuffle indices of one stage, into the pair (row i, row i + B) as lanes 0-15 and 16-31:
/// lane l of the new row i (keepLow) and of the new row i + B (takeHigh). The two rows exchange
/// their off-diagonal sub-blocks of B lanes.
template <int B>
constexpr int32_t keepLow(int l) {
  return (l & B) ? 16 + l - B : l;
}
template <int B>
constexpr int32_t takeHigh(int l) {
  return (l & B) ? 16 + l : l + B;
}

template <int B, int... L>
inline void stage(Vec<float> v[16], std::integer_sequence<int, L...>) {
  constexpr Mask low{keepLow<B>(L)...}, high{takeHigh<B>(L)...};
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    if (i & B) continue;
    const Vec<float> a = __builtin_shuffle(v[i], v[i + B], low);
    v[i + B] = __builtin_shuffle(v[i], v[i + B], high);
    v[i] = a;
  }
}
}  // namespace transpose_detail

/// Transposes the 16 x 16 block whose row r is v[r]: at each stage the off-diagonal sub-blocks
/// of size b within every 2b x 2b block swap places, for b = 8, 4, 2, 1. The masks are constants
/// and the loops unrolled, so the block stays in registers.
inline void transpose16(Vec<float> v[16]) {
  constexpr auto lanes = std::make_integer_sequence<int, 16>();
  transpose_detail::stage<8>(v, lanes);
  transpose_detail::stage<4>(v, lanes);
  transpose_detail::stage<2>(v, lanes);
  transpose_detail::stage<1>(v, lanes);
}

}  // namespace weft::detail::simd
