// Vectors for the hand-tiled CPU kernels (the direct and Winograd convolutions, sums in double),
// sized to the target the build compiles for: one register of the widest kind it has — 64 bytes
// with AVX-512, 32 with AVX/AVX2, 16 otherwise (SSE, NEON) — and the number of those registers,
// from which the kernels choose their register tiles. A tile of accumulators that outgrows the register file
// spills to the stack on every multiply-add: 16 accumulators of 64 bytes fit AVX-512's 32
// registers but are 32 of AVX2's 16, which made AVX2 convolutions 12 times slower. GCC's vector
// extensions map the arithmetic onto the target's instructions.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

namespace weft::detail::simd {

#if defined(__AVX512F__)
inline constexpr int kVectorBytes = 64;
inline constexpr int kVectorRegisters = 32;
#elif defined(__AVX__)
inline constexpr int kVectorBytes = 32;
inline constexpr int kVectorRegisters = 16;
#elif defined(__aarch64__)
inline constexpr int kVectorBytes = 16;
inline constexpr int kVectorRegisters = 32;
#else
inline constexpr int kVectorBytes = 16;
inline constexpr int kVectorRegisters = 16;
#endif

template <class T>
struct Simd;
template <>
struct Simd<float> {
  typedef float V __attribute__((vector_size(kVectorBytes)));
};
template <>
struct Simd<double> {
  typedef double V __attribute__((vector_size(kVectorBytes)));
};
template <class T>
using Vec = typename Simd<T>::V;
template <class T>
constexpr int64_t kLanes = static_cast<int64_t>(kVectorBytes / sizeof(T));

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
constexpr int kFloatLanes = static_cast<int>(kLanes<float>);
typedef int32_t Mask __attribute__((vector_size(kVectorBytes)));

/// The shuffle indices of one stage, into the pair (row i, row i + B) as lanes 0..L-1 and L..2L-1:
/// lane l of the new row i (keepLow) and of the new row i + B (takeHigh). The two rows exchange
/// their off-diagonal sub-blocks of B lanes.
template <int B>
constexpr int32_t keepLow(int l) {
  return (l & B) ? kFloatLanes + l - B : l;
}
template <int B>
constexpr int32_t takeHigh(int l) {
  return (l & B) ? kFloatLanes + l : l + B;
}

template <int B, int... L>
inline void stage(Vec<float> v[kFloatLanes], std::integer_sequence<int, L...>) {
  constexpr Mask low{keepLow<B>(L)...}, high{takeHigh<B>(L)...};
#pragma GCC unroll 16
  for (int i = 0; i < kFloatLanes; ++i) {
    if (i & B) continue;
    const Vec<float> a = __builtin_shuffle(v[i], v[i + B], low);
    v[i + B] = __builtin_shuffle(v[i], v[i + B], high);
    v[i] = a;
  }
}

template <int B>
inline void stages(Vec<float> v[kFloatLanes]) {
  if constexpr (B >= 1) {
    stage<B>(v, std::make_integer_sequence<int, kFloatLanes>());
    stages<B / 2>(v);
  }
}
}  // namespace transpose_detail

/// Transposes the L x L block of floats whose row r is v[r] (L = kLanes<float>): at each stage the
/// off-diagonal sub-blocks of size b within every 2b x 2b block swap places, for b = L/2, ..., 1.
/// The masks are constants and the loops unrolled, so the block stays in registers.
inline void transpose(Vec<float> v[transpose_detail::kFloatLanes]) {
  transpose_detail::stages<transpose_detail::kFloatLanes / 2>(v);
}

// ---- sums in double ------------------------------------------------------------------------

inline constexpr int kDoubleLanes = kVectorBytes / static_cast<int>(sizeof(double));
typedef double Doubles __attribute__((vector_size(kVectorBytes)));
typedef float HalfFloats __attribute__((vector_size(kVectorBytes / 2)));
/// Running sums per reduction: a fixed number, so that the order of additions, and with it
/// every bit of a result, is the same on every target whatever its vector width.
inline constexpr int kPartialSums = 16;

/// u[j .. j + kDoubleLanes) as doubles.
template <class T>
inline Doubles loadDoubles(const T* u) {
  if constexpr (std::is_same_v<T, float>) {
    HalfFloats f;
    std::memcpy(&f, u, sizeof f);
    return __builtin_convertvector(f, Doubles);
  } else {
    Doubles d;
    for (int k = 0; k < kDoubleLanes; ++k) d[k] = double(u[k]);
    return d;
  }
}

/// The N sums over j in [0, n) of terms(u_j, w_j), a std::array of N, with the elements read as
/// doubles; terms takes and returns doubles or vectors of them. Each sum runs in kPartialSums
/// interleaved partial sums, in vectors, added in a fixed order at the end: the order of every
/// addition is written out, so nothing is reassociated and the result is reproducible.
template <int N, class T, class Terms>
std::array<double, N> interleavedSums(int64_t n, const T* u, const T* w, Terms terms) {
  constexpr int kVectors = kPartialSums / kDoubleLanes;
  std::array<Doubles, N> vectors[kVectors] = {};
  int64_t j = 0;
  for (; j + kPartialSums <= n; j += kPartialSums) {
    for (int h = 0; h < kVectors; ++h) {
      const std::array<Doubles, N> t =
          terms(loadDoubles(u + j + kDoubleLanes * h), loadDoubles(w + j + kDoubleLanes * h));
      for (int s = 0; s < N; ++s) vectors[h][s] += t[s];
    }
  }
  double partial[N][kPartialSums];
  for (int h = 0; h < kVectors; ++h) {
    for (int s = 0; s < N; ++s) std::memcpy(partial[s] + kDoubleLanes * h, &vectors[h][s], sizeof(Doubles));
  }
  for (int64_t k = 0; j < n; ++j, ++k) {
    const std::array<double, N> t = terms(double(u[j]), double(w[j]));
    for (int s = 0; s < N; ++s) partial[s][k] += t[s];
  }
  std::array<double, N> sums{};
  for (int s = 0; s < N; ++s) {
    for (int k = 0; k < kPartialSums; ++k) sums[s] += partial[s][k];
  }
  return sums;
}

}  // namespace weft::detail::simd
