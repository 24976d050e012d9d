// weft's own f32 matrix product for CPUs with AVX2 and FMA but no AVX-512 (internal to
// ops/Blas.cpp, through ops/OwnSgemm.h): every AMD CPU before Zen 4, Intel's client CPUs, most
// cloud instances, and the portable x86-64-v3 build. OpenBLAS's AVX2 kernels reach about four
// fifths of the multiply-add roof on large products and much less on the small and skinny ones
// of the models' backward passes; and since they may round a block of C differently from the
// whole, the pool can only cut C by shape (few blocks, none small). This kernel computes every
// element of C alike wherever it lies, so C is cut one block per thread.
#pragma once

#include "ops/SgemmBlocking.h"

#include <cstdint>

namespace weft::blas::detail {

#if defined(__AVX2__) && defined(__FMA__)
inline constexpr bool kHaveSgemmAvx2 = true;
#else
inline constexpr bool kHaveSgemmAvx2 = false;
#endif

/// The kernel: 6 x 16 register tiles. Defined only when kHaveSgemmAvx2.
const SgemmKernel& sgemmAvx2();

}  // namespace weft::blas::detail
