// weft's bf16 matrix product on AMX tiles (internal to ops/Blas.cpp), for CPUs with AMX-BF16
// (Intel Xeons from Sapphire Rapids on). One TDPBF16PS instruction multiplies a 16 x 32 tile of
// A by a 32 x 16 tile of B into 16 x 16 f32 accumulators: 16 times the multiply-adds of an
// AVX512_BF16 dot product. The kernel is built into every x86-64 build and chosen at run time,
// so one binary serves every CPU: it runs where the CPU has AMX-BF16 and AVX512_BF16, the kernel
// (Linux) grants the process the tiles' register state, and WEFT_AMX is not "0".
//
// Its blocking follows the AVX512_BF16 kernel's (ops/SgemmAvx512.h): depth blocks of 512, each
// element of C summed along its depth block from zero and then added to C, block after block;
// every element is computed alike wherever it lies, so any cut of C gives the same bits.
#pragma once

#include "ops/SgemmBlocking.h"

namespace weft::blas::detail {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
inline constexpr bool kAmxBuilt = true;
#else
inline constexpr bool kAmxBuilt = false;
#endif

/// Whether this process can run the AMX kernel: built, the CPU has AMX-TILE, AMX-BF16 and
/// AVX512_BF16, the operating system grants the tile state (asked once), and the environment
/// variable WEFT_AMX is not "0" (which holds a process to the AVX512_BF16 kernel).
bool amxBf16Usable();

/// The AMX kernel's products; only where amxBf16Usable().
const Bf16Kernel& bf16Amx();

}  // namespace weft::blas::detail
