// AVX-512 register helpers of weft's x86 product kernels (internal to ops/SgemmAvx512.cpp and
// ops/Bf16GemmAmx.cpp): lane masks, a 16 x 16 transpose in registers, the store of a block of
// sums into C, and the rounding of f32 (or bf16) elements into the pairs of depths that bf16 dot
// products take. Each helper is compiled for the instructions it needs whatever the build
// targets, because the AMX kernel, which runs only on CPUs that have them, is built into every
// x86-64 build; the helpers have internal linkage, so no file's copy stands in for another's.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>

#include <cstdint>

#pragma GCC push_options
#pragma GCC target("avx512f")

namespace weft::blas::detail {
namespace {

/// The lanes of a vector that hold its first `count` elements.
[[maybe_unused]] __mmask16 lanes(int64_t count) {
  return count <= 0 ? __mmask16(0) : count >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << count) - 1);
}

/// Transposes 16 vectors in registers: on exit r[j] holds lane j of each input, in order.
[[maybe_unused]] void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    // Pairs of floats moved as doubles; no lambda here, whose static invoker would not take the
    // target pragma.
    const __m512d t0 = _mm512_castps_pd(t[4 * i]), t1 = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d t2 = _mm512_castps_pd(t[4 * i + 2]), t3 = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
    }
  }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
  }
}

/// Stores a row of a block's sums (32 columns in two vectors, lanes `low` and `high` live) into
/// C: C = beta C + sums (C not read when beta is 0), or C += sums where later depth blocks add to
/// the first.
[[maybe_unused]] void storeRow(__m512 l, __m512 h, float* row, __mmask16 low, __mmask16 high, float beta,
                               bool accumulate) {
  if (accumulate) {
    l = _mm512_add_ps(_mm512_maskz_loadu_ps(low, row), l);
    h = _mm512_add_ps(_mm512_maskz_loadu_ps(high, row + 16), h);
  } else if (beta != 0.0f) {
    const __m512 scale = _mm512_set1_ps(beta);
    l = _mm512_fmadd_ps(scale, _mm512_maskz_loadu_ps(low, row), l);
    h = _mm512_fmadd_ps(scale, _mm512_maskz_loadu_ps(high, row + 16), h);
  }
  _mm512_mask_storeu_ps(row, low, l);
  _mm512_mask_storeu_ps(row + 16, high, h);
}

}  // namespace
}  // namespace weft::blas::detail

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

namespace weft::blas::detail {
namespace {

/// The lanes of a 32-element vector of 16-bit values that hold its first `count` elements.
[[maybe_unused]] __mmask32 lanes32(int64_t count) {
  return count <= 0 ? __mmask32(0) : count >= 32 ? ~__mmask32(0) : static_cast<__mmask32>((1u << count) - 1);
}

/// 16 bf16 values of f32 or bf16 elements in the 32-bit lanes' low halves, lanes outside `live`
/// zero. f32 rounds to nearest even, with f32 subnormals (below 2^-126) taken as zero, as the
/// instruction does.
[[maybe_unused]] __m512i widened(const float* x, __mmask16 live) {
  return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(live, x)));
}
[[maybe_unused]] __m512i widened(const uint16_t* x, __mmask16 live) {
  return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, x));
}

/// Pairs of two runs of 16 elements: lane i holds low[i] in its low half and high[i] (zero where
/// high is null, an odd depth's padding) in its high half.
template <class Src>
__m512i pairsAcross(const Src* low, const Src* high, __mmask16 live) {
  const __m512i l = widened(low, live);
  return high == nullptr ? l : _mm512_or_si512(l, _mm512_slli_epi32(widened(high, live), 16));
}

/// The 16 pairs of the first `count` (at most 32) consecutive elements of x, zero past count.
[[maybe_unused]] __m512i pairsAlong(const float* x, int64_t count) {
  // The second operand fills the low 16 values.
  return (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(lanes(count - 16), x + 16),
                                      _mm512_maskz_loadu_ps(lanes(count), x));
}
[[maybe_unused]] __m512i pairsAlong(const uint16_t* x, int64_t count) {
  return _mm512_maskz_loadu_epi16(lanes32(count), x);
}

/// Calls store(q, pairs) for q < count of the pairs along `rows` rows (row i at x + i * ld, at
/// most 16 rows; the others zero) over 2 count depths: lane i of `pairs` is row i's pair q.
template <class Src, class Store>
void transposedPairs(const Src* x, int64_t ld, int64_t rows, int64_t depths, Store store) {
  __m512 r[16];
  for (int64_t i = 0; i < 16; ++i) {
    r[i] = i < rows ? _mm512_castsi512_ps(pairsAlong(x + i * ld, depths)) : _mm512_setzero_ps();
  }
  transpose16(r);
  for (int64_t q = 0; q < (depths + 1) / 2; ++q) store(q, _mm512_castps_si512(r[q]));
}

}  // namespace
}  // namespace weft::blas::detail

#pragma GCC pop_options

#endif  // __x86_64__ && __GNUC__
