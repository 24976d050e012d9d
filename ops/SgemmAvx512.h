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

/// C (m x n, f32) = op(A) op(B) + beta C for A and B in bfloat16 (their bit patterns), with f32
/// accumulation: the AVX512_BF16 dot products multiply pairs of depths exactly and add them in
/// f32. Single-threaded, blas::gemm's layout conventions; every element of C is computed by the
/// same sequence of operations wherever it lies, so any cut of C gives the same bits. Defined
/// only when kHaveBf16GemmAvx512.
void bf16GemmAvx512(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                    const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc);
/// The same for f32 operands, each element rounded to bf16 (to nearest even; f32 subnormals,
/// below 2^-126, count as zero) as it is packed: the product of the rounded operands, with no
/// rounded copy of either.
void bf16GemmAvx512(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                    int64_t ldb, float beta, float* c, int64_t ldc);

/// The 32-bit words (pairs of bf16 values) op(B) (k x n) takes packed whole by packBf16Operand.
int64_t packedBf16Size(int64_t k, int64_t n);

/// Columns [c0, c1) of the f32 op(B) (k x n; B stored n x k when tb), rounded to bf16 and laid
/// out as the bf16 kernel reads them, in their place in `packed` (packedBf16Size words); c0 is a
/// multiple of kSgemmTileCols, so that disjoint ranges can be packed at once.
void packBf16Operand(bool tb, int64_t k, int64_t n, const float* b, int64_t ldb, int64_t c0, int64_t c1,
                     uint32_t* packed);

/// Columns [c0, c1) of C (m x n) = op(A) B + beta C with B packed by packBf16Operand and the f32
/// A rounded as it is packed; c0 is a multiple of kSgemmTileCols. Gives the bits bf16GemmAvx512
/// gives for the f32 operands.
void bf16GemmAvx512Packed(bool ta, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint32_t* packed,
                          int64_t c0, int64_t c1, float beta, float* c, int64_t ldc);

}  // namespace weft::blas::detail
