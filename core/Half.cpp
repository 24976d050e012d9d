#include "core/Half.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace weft {
namespace {

#if defined(__x86_64__)
// x86's F16C instructions convert eight values at a time with the same rounding (to nearest,
// ties to even) as the scalar code; they are used only where the CPU reports them.
bool haveF16C() {
  static const bool have = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return have;
}

__attribute__((target("avx,f16c"))) int64_t toFloat16F16C(const float* src, Float16* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  return i;
}

__attribute__((target("avx,f16c"))) int64_t fromFloat16F16C(const Float16* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  return i;
}
#endif

}  // namespace

void floatsToFloat16(const float* src, Float16* dst, int64_t n) {
  int64_t done = 0;
#if defined(__x86_64__)
  if (haveF16C()) done = toFloat16F16C(src, dst, n);
#endif
  for (int64_t i = done; i < n; ++i) dst[i] = Float16(src[i]);
}

void float16ToFloats(const Float16* src, float* dst, int64_t n) {
  int64_t done = 0;
#if defined(__x86_64__)
  if (haveF16C()) done = fromFloat16F16C(src, dst, n);
#endif
  for (int64_t i = done; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

}  // namespace weft
