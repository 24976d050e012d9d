// weft's own matrix products for CPUs with AVX-512 (internal to ops/Blas.cpp): f32, and bf16 with
// f32 accumulation where the CPU has AVX512_BF16. Debian's
// OpenBLAS is often held to its AVX2 kernels (OPENBLAS_CORETYPE=Haswell, set on machines where
// its newer kernels misbehave), which leaves half of an AVX-512 core's multiply-add width unused;
// this kernel uses all of it whatever the environment says.
#pragma once

#include "ops/SgemmBlocking.h"

#include <cstdint>

namespace weft::blas::detail {

#if defined(__AVX512F__)
inline constexpr bool kHaveSgemmAvx512 = true;
#else
inline constexpr bool kHaveSgemmAvx512 = false;
#endif

/// The f32 kernel: 12 x 32 register tiles. Defined only when kHaveSgemmAvx512.
const SgemmKernel& sgemmAvx512();

/// The register tile's columns, which the bf16 kernel shares: a product with a packed operand is
/// split at multiples of it.
inline constexpr int64_t kSgemmTileCols = 32;

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
inline constexpr bool kHaveBf16GemmAvx512 = true;
#else
inline constexpr bool kHaveBf16GemmAvx512 = false;
#endif

/// The bf16 kernel: the f32 kernel's blocking with pairs of depths, whose AVX512_BF16 dot
/// products multiply each pair exactly and add both products to an f32 accumulator. Defined only
/// when kHaveBf16GemmAvx512.
const Bf16Kernel& bf16Avx512();

}  // namespace weft::blas::detail
