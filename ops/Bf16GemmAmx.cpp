// weft's AMX bf16 product (see the header). Eight tile registers: a 32 x 32 block of C as 2 x 2
// tiles of f32 sums (tmm0-3), two tiles of A (tmm4-5, 16 rows x 16 pairs of depths each) and two
// of B (tmm6-7, 16 pairs x 16 columns each). A is packed row by row in pairs (a[row][pair]) and B
// in strips of 16 columns (strip[pair][column]); the pairs of a depth block are padded with
// zeros to whole steps of 16, so a tile never reads past what was packed and the padding adds
// exact zeros.
#include "ops/Bf16GemmAmx.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11

#include "ops/Avx512Pairs.h"

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace weft::blas::detail {
namespace {

constexpr int64_t kStripCols = 16;  // a B tile's columns
constexpr int64_t kStepPairs = 16;  // the pairs of depths a tile of A or B holds
constexpr int64_t kTileRows = 16;   // an A tile's rows
constexpr int64_t kBlockCols = 2 * kStripCols, kBlockRowsOfC = 2 * kTileRows;  // C's block: 2 x 2 tiles
constexpr int64_t kDepthAmx = 512;   // the AVX512_BF16 kernel's depth block
constexpr int64_t kBlockRows = 128;  // rows of A packed at once: 128 KB at full depth, in L2
constexpr int64_t kPanelCols = 512;  // columns of B packed at once: 512 KB at full depth

/// The pairs of `depth` depths, padded to whole steps.
int64_t paddedPairs(int64_t depth) { return ((depth + 1) / 2 + kStepPairs - 1) / kStepPairs * kStepPairs; }

/// The calling thread's packing buffers (32-bit words, allocated as floats).
struct AmxPackBuffers {
  PackBuffer a{kBlockRows * kDepthAmx / 2}, b{kPanelCols * kDepthAmx / 2};
};

AmxPackBuffers& amxPackBuffers() {
  thread_local AmxPackBuffers buffers;
  return buffers;
}

/// Tells the compiler that memory changed or is read where it cannot see it: the tile loads and
/// stores are inline assembly that names only their addresses.
inline void memoryBarrier() { __asm__ __volatile__("" ::: "memory"); }

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

/// Where row r's pairs q .. q + 15 of a packed A begin (q a multiple of 16): the tiles of 16 rows
/// follow one another, each as its steps of 16 pairs, each step one tile (1 KB, rows 64 bytes
/// apart), so a tile load reads one contiguous kilobyte.
int64_t packedAt(int64_t r, int64_t q, int64_t pairs) {
  return r / kTileRows * kTileRows * pairs + q * kTileRows + r % kTileRows * kStepPairs;
}

/// Rows [i0, i0 + rows) of op(A) over depths [p0, p0 + depth), as tiles of 16 rows of
/// paddedPairs(depth) pairs (packedAt); the rows up to a multiple of 16 and the pairs past the
/// depth are zero.
template <class Src>
void packA(bool ta, const Src* a, int64_t lda, int64_t i0, int64_t rows, int64_t p0, int64_t depth, uint32_t* out) {
  const int64_t pairs = paddedPairs(depth);
  if (rows % kTileRows != 0) {
    std::memset(out + packedAt(rows, 0, pairs) - rows % kTileRows * kStepPairs, 0,
                static_cast<size_t>(kTileRows * pairs) * sizeof(uint32_t));
  }
  if (!ta) {
    for (int64_t r = 0; r < rows; ++r) {
      const Src* row = a + (i0 + r) * lda + p0;
      for (int64_t q = 0; q < pairs; q += kStepPairs) {
        _mm512_storeu_si512(out + packedAt(r, q, pairs),
                            pairsAlong(row + 2 * q, std::clamp<int64_t>(depth - 2 * q, 0, 32)));
      }
    }
  } else {
    // Row r of op(A) is column i0 + r of A: 16 rows' pairs across A's rows, transposed.
    for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
      const int64_t live = std::min(kTileRows, rows - r0);
      for (int64_t q0 = 0; q0 < pairs; q0 += kStepPairs) {
        __m512 across[16];
        for (int64_t q = 0; q < 16; ++q) {
          const int64_t d = 2 * (q0 + q);
          const Src* low = a + (p0 + d) * lda + i0 + r0;
          across[q] = d < depth
                          ? _mm512_castsi512_ps(pairsAcross(low, d + 1 < depth ? low + lda : nullptr, lanes(live)))
                          : _mm512_setzero_ps();
        }
        transpose16(across);
        for (int64_t i = 0; i < live; ++i) {
          _mm512_storeu_si512(out + packedAt(r0 + i, q0, pairs), _mm512_castps_si512(across[i]));
        }
      }
    }
  }
}

/// Columns [j0, j0 + cols) of op(B) over depths [p0, p0 + depth), as strips of 16 columns of
/// paddedPairs(depth) rows each (strip[q * 16 + j]); the columns past the end and the pairs past
/// the depth are zero.
template <class Src>
void packB(bool tb, const Src* b, int64_t ldb, int64_t j0, int64_t cols, int64_t p0, int64_t depth, uint32_t* out) {
  const int64_t pairs = paddedPairs(depth);
  for (int64_t s = 0; s < cols; s += kStripCols, out += kStripCols * pairs) {
    const int64_t live = std::min(kStripCols, cols - s);
    if (tb) {
      // Column j of the strip is row j0 + s + j of B: pairs along 16 of its rows, transposed.
      for (int64_t q0 = 0; q0 < pairs; q0 += kStepPairs) {
        __m512 along[16];
        const int64_t depths = std::clamp<int64_t>(depth - 2 * q0, 0, 32);
        for (int64_t j = 0; j < 16; ++j) {
          along[j] = j < live ? _mm512_castsi512_ps(pairsAlong(b + (j0 + s + j) * ldb + p0 + 2 * q0, depths))
                              : _mm512_setzero_ps();
        }
        transpose16(along);
        for (int64_t q = 0; q < 16; ++q)
          _mm512_storeu_si512(out + (q0 + q) * kStripCols, _mm512_castps_si512(along[q]));
      }
      continue;
    }
    for (int64_t q = 0; q < pairs; ++q) {
      const int64_t d = 2 * q;
      const Src* low = b + (p0 + d) * ldb + j0 + s;
      _mm512_storeu_si512(out + q * kStripCols, d < depth ? pairsAcross(low, d + 1 < depth ? low + ldb : nullptr,
                                                                         lanes(live))
                                                          : _mm512_setzero_si512());
    }
  }
}

/// C's rows [0, rows) and columns [0, cols) of a block (at most 32 x 32) from its sums (`sums`,
/// rows of 32): C = beta C + sums on the first depth block, C += sums on the later ones.
void storeBlock(const float* sums, int64_t rows, int64_t cols, float* c, int64_t ldc, float beta, bool accumulate) {
  const __mmask16 low = lanes(cols), high = lanes(cols - 16);
  for (int64_t r = 0; r < rows; ++r) {
    storeRow(_mm512_load_ps(sums + r * kBlockCols), _mm512_load_ps(sums + r * kBlockCols + 16), c + r * ldc, low,
             high, beta, accumulate);
  }
}

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")

/// The tiles' shapes, as LDTILECFG reads them: every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, startRow = 0;
  uint8_t reserved[14] = {};
  uint16_t bytesPerRow[16] = {};
  uint8_t rows[16] = {};
};

/// The calling thread's tiles, configured for the span of one product: tile state belongs to a
/// thread, and released it costs nothing at a context switch.
class Tiles {
 public:
  Tiles() {
    TileConfig config;
    for (int t = 0; t < 8; ++t) {
      config.bytesPerRow[t] = 64;
      config.rows[t] = 16;
    }
    _tile_loadconfig(&config);
  }
  ~Tiles() { _tile_release(); }
  Tiles(const Tiles&) = delete;
  Tiles& operator=(const Tiles&) = delete;
};

/// The sums of a block of C over `pairs` padded pairs into `sums` (32 x 32): A's two row tiles at
/// a (packedAt; the second `16 * pairs` words on), B's two strips at b (`pairs * 16` words
/// apart). A block at C's edge runs only the tiles it has.
template <bool TwoRowTiles, bool TwoStrips>
void multiplyBlock(int64_t pairs, const uint32_t* a, const uint32_t* b, float* sums) {
  memoryBarrier();  // the packed operands are in memory
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const uint32_t* secondRows = a + kTileRows * pairs;
  const uint32_t* secondStrip = b + kStripCols * pairs;
  for (int64_t q = 0; q < pairs; q += kStepPairs) {
    _tile_loadd(4, a + q * kTileRows, 64);
    _tile_loadd(6, b + q * kStripCols, 64);
    if constexpr (TwoStrips) _tile_loadd(7, secondStrip + q * kStripCols, 64);
    if constexpr (TwoRowTiles) _tile_loadd(5, secondRows + q * kTileRows, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (TwoStrips) _tile_dpbf16ps(1, 4, 7);
    if constexpr (TwoRowTiles) _tile_dpbf16ps(2, 5, 6);
    if constexpr (TwoRowTiles && TwoStrips) _tile_dpbf16ps(3, 5, 7);
  }
  constexpr int64_t rowBytes = kBlockCols * sizeof(float);
  _tile_stored(0, sums, rowBytes);
  _tile_stored(1, sums + kStripCols, rowBytes);
  _tile_stored(2, sums + kTileRows * kBlockCols, rowBytes);
  _tile_stored(3, sums + kTileRows * kBlockCols + kStripCols, rowBytes);
  memoryBarrier();  // the sums are in memory
}

using BlockKernel = void (*)(int64_t, const uint32_t*, const uint32_t*, float*);
constexpr BlockKernel kBlockKernels[2][2] = {{&multiplyBlock<false, false>, &multiplyBlock<false, true>},
                                             {&multiplyBlock<true, false>, &multiplyBlock<true, true>}};

/// C[:, 0 .. cols) += op(A) B over depths [p0, p0 + depth) (C = beta C + ... on the first depth
/// block), with B's strips for those columns and depths at `strips`. The two strips of a block
/// of columns stay in L1 while the rows of A pass.
template <class Src>
void multiplyDepthBlock(bool ta, int64_t m, const Src* a, int64_t lda, int64_t p0, int64_t depth,
                        const uint32_t* strips, int64_t cols, float beta, float* c, int64_t ldc) {
  const int64_t pairs = paddedPairs(depth);
  uint32_t* packedA = reinterpret_cast<uint32_t*>(amxPackBuffers().a.get());
  alignas(64) float sums[kBlockRowsOfC * kBlockCols];
  for (int64_t i0 = 0; i0 < m; i0 += kBlockRows) {
    const int64_t rows = std::min(kBlockRows, m - i0);
    packA(ta, a, lda, i0, rows, p0, depth, packedA);
    for (int64_t jt = 0; jt < cols; jt += kBlockCols) {
      const int64_t blockCols = std::min(kBlockCols, cols - jt);
      for (int64_t it = 0; it < rows; it += kBlockRowsOfC) {
        const int64_t blockRows = std::min(kBlockRowsOfC, rows - it);
        kBlockKernels[blockRows > kTileRows][blockCols > kStripCols](pairs, packedA + it * pairs, strips + jt * pairs,
                                                                     sums);
        storeBlock(sums, blockRows, blockCols, c + (i0 + it) * ldc + jt, ldc, beta, p0 > 0);
      }
    }
  }
}

template <class Src>
void amxGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Src* a, int64_t lda, const Src* b, int64_t ldb,
             float beta, float* c, int64_t ldc) {
  const Tiles tiles;
  uint32_t* packedB = reinterpret_cast<uint32_t*>(amxPackBuffers().b.get());
  for (int64_t j0 = 0; j0 < n; j0 += kPanelCols) {
    const int64_t cols = std::min(kPanelCols, n - j0);
    for (int64_t p0 = 0; p0 == 0 || p0 < k; p0 += kDepthAmx) {
      const int64_t depth = std::min(kDepthAmx, k - p0);
      packB(tb, b, ldb, j0, cols, p0, depth, packedB);
      multiplyDepthBlock(ta, m, a, lda, p0, depth, packedB, cols, beta, c + j0, ldc);
    }
  }
}

// Packed whole, depth block after depth block: a block of full depth holds kDepthAmx / 2 pairs
// of each strip, so block p0 begins p0 / 2 rows of every strip in.
int64_t strips(int64_t n) { return (n + kStripCols - 1) / kStripCols; }
int64_t packedBlockAt(int64_t p0, int64_t n) { return p0 / 2 * strips(n) * kStripCols; }

int64_t amxPackedSize(int64_t k, int64_t n) {
  const int64_t lastBlock = std::max<int64_t>(0, (k - 1) / kDepthAmx * kDepthAmx);
  return packedBlockAt(lastBlock, n) + strips(n) * kStripCols * paddedPairs(k - lastBlock);
}

void amxPackOperand(bool tb, int64_t k, int64_t n, const float* b, int64_t ldb, int64_t c0, int64_t c1,
                    uint32_t* packed) {
  for (int64_t p0 = 0; p0 < k; p0 += kDepthAmx) {
    const int64_t depth = std::min(kDepthAmx, k - p0);
    packB(tb, b, ldb, c0, c1 - c0, p0, depth, packed + packedBlockAt(p0, n) + c0 * paddedPairs(depth));
  }
}

void amxGemmPacked(bool ta, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint32_t* packed,
                   int64_t c0, int64_t c1, float beta, float* c, int64_t ldc) {
  const Tiles tiles;
  for (int64_t p0 = 0; p0 < k; p0 += kDepthAmx) {
    const int64_t depth = std::min(kDepthAmx, k - p0);
    multiplyDepthBlock(ta, m, a, lda, p0, depth, packed + packedBlockAt(p0, n) + c0 * paddedPairs(depth), c1 - c0,
                       beta, c + c0, ldc);
  }
}

#pragma GCC pop_options

/// AMX-TILE, AMX-BF16 and AVX512_BF16 (with AVX-512 F, BW and VL, which the packing uses), and
/// an operating system that saves the AVX-512 registers.
bool cpuHasAmxBf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c >> 27 & 1)) return false;  // OSXSAVE
  unsigned xcr0 = 0, xcr0High = 0;
  __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0High) : "c"(0));
  if ((xcr0 & 0xE6) != 0xE6) return false;  // SSE, AVX and the three AVX-512 states
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx = (d >> 22 & 1) && (d >> 24 & 1);
  const bool avx512 = (b >> 16 & 1) && (b >> 30 & 1) && (b >> 31 & 1);
  if (!amx || !avx512 || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return a >> 5 & 1;
}

/// Linux (from 5.16) hands a process the tiles' large register state only when asked.
bool tileStateGranted() {
  constexpr long kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
  constexpr long kTileData = 18;               // XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
}

}  // namespace

bool amxBf16Usable() {
  static const bool usable = [] {
    const char* choice = std::getenv("WEFT_AMX");
    if (choice != nullptr && std::string_view(choice) == "0") return false;
    return cpuHasAmxBf16() && tileStateGranted();
  }();
  return usable;
}

const Bf16Kernel& bf16Amx() {
  static constexpr Bf16Kernel kernel{"weft AMX-BF16", kBlockCols,     &amxGemm<uint16_t>, &amxGemm<float>,
                                     &amxPackedSize,  &amxPackOperand, &amxGemmPacked};
  return kernel;
}

}  // namespace weft::blas::detail

#else

#include "core/Error.h"

namespace weft::blas::detail {

bool amxBf16Usable() { return false; }

const Bf16Kernel& bf16Amx() { WEFT_THROW("blas: this build has no AMX kernel (it needs GCC 11 or later on x86-64)"); }

}  // namespace weft::blas::detail

#endif
