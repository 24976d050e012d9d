// weft's own f32 matrix product for the build's target (internal to ops/Blas.cpp): the AVX-512
// kernel where the target has AVX-512, otherwise the AVX2 one where it has AVX2 and FMA,
// otherwise none (OpenBLAS multiplies); and the bf16 kernel. Each computes every element of C by
// the same sequence of operations wherever it lies, so any cut of C gives the bits of one call.
#pragma once

#include "core/Error.h"
#include "ops/Bf16GemmAmx.h"
#include "ops/SgemmAvx2.h"
#include "ops/SgemmAvx512.h"

namespace weft::blas::detail {

inline constexpr bool kHaveOwnSgemm = kHaveSgemmAvx512 || kHaveSgemmAvx2;

/// The kernel chosen; only where kHaveOwnSgemm (the kernels a build has no code for are named
/// only in discarded branches, which need no definition).
inline const SgemmKernel& ownSgemm() {
  if constexpr (kHaveSgemmAvx512) {
    return sgemmAvx512();
  } else if constexpr (kHaveSgemmAvx2) {
    return sgemmAvx2();
  } else {
    WEFT_THROW("blas: this build has no f32 kernel of weft's own (it needs AVX2 and FMA, or AVX-512)");
  }
}

/// The bf16 kernel this process runs, chosen once: AMX where the CPU and the operating system
/// allow it (a run-time choice, ops/Bf16GemmAmx.h), else the AVX512_BF16 kernel where the build
/// targets it, else none (null).
inline const Bf16Kernel* ownBf16Gemm() {
  static const Bf16Kernel* const chosen = []() -> const Bf16Kernel* {
    if (amxBf16Usable()) return &bf16Amx();
    if constexpr (kHaveBf16GemmAvx512) return &bf16Avx512();
    return nullptr;
  }();
  return chosen;
}

}  // namespace weft::blas::detail
