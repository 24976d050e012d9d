// weft's AVX-512 f32 matrix product (see the header), in the blocking the f32 kernels share
// (ops/SgemmBlocking.h): a register tile of 12 rows x 32 columns (24 of the 32 vector registers
// as accumulators) runs down the depth with two vector loads of B, twelve broadcasts of A and 24
// multiply-adds per step. The B sliver (32 KB at full depth) stays in L1 while the A slivers
// stream from L2. An operand used in many products (an RNN's recurrent weight) can be packed
// once, whole.
#include "ops/SgemmAvx512.h"

#include "ops/SgemmBlocking.h"

#if defined(__AVX512F__)

#include "ops/Avx512Pairs.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <new>
#include <utility>

namespace weft::blas::detail {
namespace {

constexpr int64_t kTileRows = 12;
constexpr int64_t kTileCols = kSgemmTileCols;
constexpr int64_t kDepth = 256;
constexpr int64_t kBlockRows = 120;  // ten tiles of rows
constexpr int64_t kPanelCols = 1024;
constexpr int64_t kDirectACols = 2 * kTileCols;  // B no wider than this: A is read in place

/// The lanes of a sliver's two vectors that hold its first `live` columns.
struct ColumnMasks {
  __mmask16 low, high;
};

ColumnMasks columnMasks(int64_t live) { return {lanes(live), lanes(live - 16)}; }

/// Calls store(q, column) for the first `cols` columns of the block of `rows` rows (row i at
/// src + i * ld) and 16 columns, rows past `rows` read as zero: the block transposed.
template <class Store>
void transposedColumns(const float* src, int64_t ld, int64_t rows, int64_t cols, Store store) {
  __m512 r[16];
  const __mmask16 read = lanes(cols);
  for (int64_t i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_maskz_loadu_ps(read, src + i * ld) : _mm512_setzero_ps();
  transpose16(r);
  for (int64_t q = 0; q < cols; ++q) store(q, r[q]);
}

/// The height of the register tile that starts `done` rows into a block of `rows`: 12 where
/// that leaves no sliver of fewer than 8 behind, otherwise the rest in two halves (16 rows run as
/// 8 + 8, not 12 + 4, whose 4-row tile wastes most of a step's loads).
int64_t tileHeight(int64_t rows, int64_t done) {
  const int64_t left = rows - done;
  if (left <= kTileRows) return left;
  if (left < kTileRows + 8) return (left + 1) / 2;
  return kTileRows;
}

/// Rows [i0, i0 + rows) and depth [p0, p0 + depth) of op(A), as one sliver per register tile
/// (tileHeight), each laid out depth-major (sliver[p * height + r]) at `out + first row * depth`.
/// A stored row-major is transposed 16 depths at a time in registers.
void packA(bool ta, const float* a, int64_t lda, int64_t i0, int64_t rows, int64_t p0, int64_t depth, float* out) {
  for (int64_t s = 0, height; s < rows; s += height) {
    height = tileHeight(rows, s);
    const __mmask16 tileLanes = lanes(height);
    float* sliver = out + s * depth;
    if (ta) {
      for (int64_t p = 0; p < depth; ++p) {
        _mm512_mask_storeu_ps(sliver + p * height, tileLanes,
                              _mm512_maskz_loadu_ps(tileLanes, a + (p0 + p) * lda + i0 + s));
      }
      continue;
    }
    for (int64_t p = 0; p < depth; p += 16) {
      float* dst = sliver + p * height;
      transposedColumns(a + (i0 + s) * lda + p0 + p, lda, height, std::min<int64_t>(16, depth - p),
                        [&](int64_t q, __m512 column) { _mm512_mask_storeu_ps(dst + q * height, tileLanes, column); });
    }
  }
}

/// Columns [j0, j0 + cols) and depth [p0, p0 + depth) of op(B), as slivers of kTileCols columns
/// laid out depth-major (sliver[p * kTileCols + c]); the columns past the end are zero.
void packB(bool tb, const float* b, int64_t ldb, int64_t j0, int64_t cols, int64_t p0, int64_t depth, float* out) {
  for (int64_t s = 0; s < cols; s += kTileCols, out += kTileCols * depth) {
    const int64_t live = std::min(kTileCols, cols - s);
    if (tb) {
      // Column c of the sliver is row j0 + s + c of B: blocks of 16 rows by 16 depths transposed.
      for (int64_t half = 0; half < kTileCols; half += 16) {
        const int64_t rowsLive = std::max<int64_t>(0, std::min<int64_t>(16, live - half));
        const float* src = rowsLive > 0 ? b + (j0 + s + half) * ldb + p0 : b;  // not read when no row is live
        for (int64_t p = 0; p < depth; p += 16) {
          float* dst = out + p * kTileCols + half;
          transposedColumns(src + p, ldb, rowsLive, std::min<int64_t>(16, depth - p),
                            [&](int64_t q, __m512 column) { _mm512_storeu_ps(dst + q * kTileCols, column); });
        }
      }
    } else {
      const ColumnMasks mask = columnMasks(live);
      for (int64_t p = 0; p < depth; ++p) {
        const float* src = b + (p0 + p) * ldb + j0 + s;
        _mm512_storeu_ps(out + p * kTileCols, _mm512_maskz_loadu_ps(mask.low, src));
        _mm512_storeu_ps(out + p * kTileCols + 16, _mm512_maskz_loadu_ps(mask.high, src + 16));
      }
    }
  }
}

/// Stores a tile's accumulators: C = beta C + tile (C = tile when beta is 0, C never read), or
/// C += tile when accumulating the later depth blocks.
template <int Rows>
void storeTile(const __m512 left[Rows], const __m512 right[Rows], float* c, int64_t ldc, __mmask16 low, __mmask16 high,
               float beta, bool accumulate) {
#pragma GCC unroll 12
  for (int r = 0; r < Rows; ++r) storeRow(left[r], right[r], c + r * ldc, low, high, beta, accumulate);
}

/// One register tile: C[Rows x 32] (its first `live` columns, stored through masks) = beta C + A B
/// over a sliver of B on the first depth block, C += A B on the later ones. A is a packed sliver,
/// or with DirectA the rows of A in place (row r at a + r * lda).
template <int Rows, bool DirectA>
void tile(int64_t depth, const float* __restrict a, int64_t lda, const float* __restrict b, float* c, int64_t ldc,
          int64_t live, float beta, bool accumulate) {
  __m512 left[Rows], right[Rows];
#pragma GCC unroll 12
  for (int r = 0; r < Rows; ++r) left[r] = right[r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < depth; ++p, a += DirectA ? 1 : Rows, b += kTileCols) {
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 12
    for (int r = 0; r < Rows; ++r) {
      const __m512 x = _mm512_set1_ps(DirectA ? a[r * lda] : a[r]);
      left[r] = _mm512_fmadd_ps(x, b0, left[r]);
      right[r] = _mm512_fmadd_ps(x, b1, right[r]);
    }
  }
  const ColumnMasks mask = columnMasks(live);
  storeTile<Rows>(left, right, c, ldc, mask.low, mask.high, beta, accumulate);
}

using TileKernel = void (*)(int64_t, const float*, int64_t, const float*, float*, int64_t, int64_t, float, bool);
constexpr auto kPackedTiles = tilesByHeight<kTileRows>([](auto h) { return &tile<decltype(h)::value, false>; });
constexpr auto kDirectTiles = tilesByHeight<kTileRows>([](auto h) { return &tile<decltype(h)::value, true>; });

/// The kernel's blocks and packing, for BlockedSgemm.
struct Avx512 {
  static constexpr int64_t kTileRows = detail::kTileRows, kTileCols = detail::kTileCols, kDepth = detail::kDepth,
                           kBlockRows = detail::kBlockRows, kPanelCols = detail::kPanelCols,
                           kDirectACols = detail::kDirectACols, kPackSlack = 0;
  static int64_t tileHeight(int64_t rows, int64_t done) { return detail::tileHeight(rows, done); }
  static void packA(bool ta, const float* a, int64_t lda, int64_t i0, int64_t rows, int64_t p0, int64_t depth,
                    float* out) {
    detail::packA(ta, a, lda, i0, rows, p0, depth, out);
  }
  static void packB(bool tb, const float* b, int64_t ldb, int64_t j0, int64_t cols, int64_t p0, int64_t depth,
                    float* out) {
    detail::packB(tb, b, ldb, j0, cols, p0, depth, out);
  }
  static TileKernel packedTile(int64_t height) { return kPackedTiles[static_cast<size_t>(height)]; }
  static TileKernel directTile(int64_t height) { return kDirectTiles[static_cast<size_t>(height)]; }
};

using Blocked = BlockedSgemm<Avx512>;

}  // namespace

const SgemmKernel& sgemmAvx512() {
  static constexpr SgemmKernel kernel = blockedSgemmKernel<Avx512>();
  return kernel;
}

// ---- bf16 with f32 accumulation ------------------------------------------------------------
// The same blocking with pairs of depths in place of single ones: a 32-bit lane holds two bf16
// values, depth 2q in its low half and 2q + 1 in its high half, and one dot-product instruction
// adds both products of a pair to each f32 accumulator: twice the multiply-adds of an f32 FMA.
// An odd depth is padded with a zero.

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
namespace {

constexpr int64_t kDepthBf16 = 512;  // a B sliver stays 32 KB: 32 columns x 512 depths x 2 bytes

/// The bf16 packing buffers of the calling thread: A and B slivers of whole pairs.
struct Bf16PackBuffers {
  PackBuffer a{kBlockRows * kDepthBf16 / 2}, b{kPanelCols * kDepthBf16 / 2};  // 32-bit words as floats
};

Bf16PackBuffers& bf16PackBuffers() {
  thread_local Bf16PackBuffers buffers;
  return buffers;
}

/// Rows [i0, i0 + rows) of op(A) over depths [p0, p0 + depth), as one sliver of pairs per register
/// tile (tileHeight), each laid out pair-major (sliver[q * height + r]) at out + first row * pairs;
/// depths past k are zero.
template <class Src>
void packABf16(bool ta, const Src* a, int64_t lda, int64_t k, int64_t i0, int64_t rows, int64_t p0, int64_t depth,
               uint32_t* out) {
  const int64_t pairs = (depth + 1) / 2;
  for (int64_t s = 0, height; s < rows; s += height) {
    height = tileHeight(rows, s);
    const __mmask16 tileLanes = lanes(height);
    uint32_t* sliver = out + s * pairs;
    if (ta) {
      for (int64_t q = 0; q < pairs; ++q) {
        const Src* low = a + (p0 + 2 * q) * lda + i0 + s;
        const __m512i v = pairsAcross(low, p0 + 2 * q + 1 < k ? low + lda : nullptr, tileLanes);
        _mm512_mask_storeu_epi32(sliver + q * height, tileLanes, v);
      }
      continue;
    }
    for (int64_t q0 = 0; q0 < pairs; q0 += 16) {
      transposedPairs(
          a + (i0 + s) * lda + p0 + 2 * q0, lda, height, std::min<int64_t>(32, depth - 2 * q0),
          [&](int64_t q, __m512i v) { _mm512_mask_storeu_epi32(sliver + (q0 + q) * height, tileLanes, v); });
    }
  }
}

/// Columns [j0, j0 + cols) of op(B) over depths [p0, p0 + depth), as slivers of kTileCols
/// columns laid out pair-major (sliver[q * kTileCols + c]); columns past the end and depths past
/// k are zero.
template <class Src>
void packBBf16(bool tb, const Src* b, int64_t ldb, int64_t k, int64_t j0, int64_t cols, int64_t p0, int64_t depth,
               uint32_t* out) {
  const int64_t pairs = (depth + 1) / 2;
  for (int64_t s = 0; s < cols; s += kTileCols, out += kTileCols * pairs) {
    const int64_t live = std::min(kTileCols, cols - s);
    if (tb) {
      // Column c of the sliver is row j0 + s + c of B: pairs along 16 rows at a time, transposed.
      for (int64_t half = 0; half < kTileCols; half += 16) {
        const int64_t rowsLive = std::max<int64_t>(0, std::min<int64_t>(16, live - half));
        const Src* src = rowsLive > 0 ? b + (j0 + s + half) * ldb + p0 : b;  // not read when no row is live
        for (int64_t q0 = 0; q0 < pairs; q0 += 16) {
          uint32_t* dst = out + q0 * kTileCols + half;
          transposedPairs(src + 2 * q0, ldb, rowsLive, std::min<int64_t>(32, depth - 2 * q0),
                          [&](int64_t q, __m512i v) { _mm512_storeu_si512(dst + q * kTileCols, v); });
        }
      }
      continue;
    }
    const ColumnMasks mask = columnMasks(live);
    for (int64_t q = 0; q < pairs; ++q) {
      const Src* low = b + (p0 + 2 * q) * ldb + j0 + s;
      const Src* high = p0 + 2 * q + 1 < k ? low + ldb : nullptr;
      _mm512_storeu_si512(out + q * kTileCols, pairsAcross(low, high, mask.low));
      _mm512_storeu_si512(out + q * kTileCols + 16, pairsAcross(low + 16, high ? high + 16 : nullptr, mask.high));
    }
  }
}

/// One register tile over a depth block: C[Rows x 32] = beta C + A B on the first block, C += A B
/// on the later ones.
template <int Rows>
void tileBf16(int64_t pairs, const uint32_t* __restrict a, const uint32_t* __restrict b, float* c, int64_t ldc,
              __mmask16 low, __mmask16 high, float beta, bool accumulate) {
  __m512 left[Rows], right[Rows];
#pragma GCC unroll 12
  for (int r = 0; r < Rows; ++r) left[r] = right[r] = _mm512_setzero_ps();
  for (int64_t q = 0; q < pairs; ++q, a += Rows, b += kTileCols) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 16);
#pragma GCC unroll 12
    for (int r = 0; r < Rows; ++r) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r]));
      left[r] = _mm512_dpbf16_ps(left[r], x, b0);
      right[r] = _mm512_dpbf16_ps(right[r], x, b1);
    }
  }
  storeTile<Rows>(left, right, c, ldc, low, high, beta, accumulate);
}

using Bf16TileKernel = void (*)(int64_t, const uint32_t*, const uint32_t*, float*, int64_t, __mmask16, __mmask16, float,
                                bool);
template <int... Rows>
constexpr std::array<Bf16TileKernel, kTileRows + 1> bf16TileKernels(std::integer_sequence<int, 0, Rows...>) {
  return {nullptr, tileBf16<Rows>...};
}
constexpr auto kBf16Tiles = bf16TileKernels(std::make_integer_sequence<int, kTileRows + 1>());

/// C[:, 0 .. cols) += op(A) B over depths [p0, p0 + depth) (C = beta C + ... on the first depth
/// block), with B's slivers of pairs for those columns and depths at `slivers`.
template <class Src>
void multiplyDepthBlockBf16(bool ta, int64_t m, int64_t k, const Src* a, int64_t lda, int64_t p0, int64_t depth,
                            const uint32_t* slivers, int64_t cols, float beta, float* c, int64_t ldc) {
  const int64_t pairs = (depth + 1) / 2;
  uint32_t* packedA = reinterpret_cast<uint32_t*>(bf16PackBuffers().a.get());
  for (int64_t i0 = 0; i0 < m; i0 += kBlockRows) {
    const int64_t rows = std::min(kBlockRows, m - i0);
    packABf16(ta, a, lda, k, i0, rows, p0, depth, packedA);
    for (int64_t jt = 0; jt < cols; jt += kTileCols) {
      const ColumnMasks mask = columnMasks(cols - jt);
      for (int64_t it = 0, height; it < rows; it += height) {
        height = tileHeight(rows, it);
        kBf16Tiles[height](pairs, packedA + it * pairs, slivers + jt * pairs, c + (i0 + it) * ldc + jt, ldc, mask.low,
                           mask.high, beta, p0 > 0);
      }
    }
  }
}

template <class Src>
void bf16Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Src* a, int64_t lda, const Src* b, int64_t ldb,
              float beta, float* c, int64_t ldc) {
  uint32_t* packedB = reinterpret_cast<uint32_t*>(bf16PackBuffers().b.get());
  for (int64_t j0 = 0; j0 < n; j0 += kPanelCols) {
    const int64_t cols = std::min(kPanelCols, n - j0);
    for (int64_t p0 = 0; p0 == 0 || p0 < k; p0 += kDepthBf16) {
      const int64_t depth = std::min(kDepthBf16, k - p0);
      packBBf16(tb, b, ldb, k, j0, cols, p0, depth, packedB);
      multiplyDepthBlockBf16(ta, m, k, a, lda, p0, depth, packedB, cols, beta, c + j0, ldc);
    }
  }
}

// Packed whole, depth block after depth block, as for f32: a block of full depth holds
// kDepthBf16 / 2 pairs of every column, so block p0 begins p0 / 2 pairs of padded rows in.
int64_t packedBf16Size(int64_t k, int64_t n) { return (k + 1) / 2 * Blocked::paddedCols(n); }

void packBf16Operand(bool tb, int64_t k, int64_t n, const float* b, int64_t ldb, int64_t c0, int64_t c1,
                     uint32_t* packed) {
  for (int64_t p0 = 0; p0 < k; p0 += kDepthBf16) {
    const int64_t depth = std::min(kDepthBf16, k - p0);
    packBBf16(tb, b, ldb, k, c0, c1 - c0, p0, depth, packed + p0 / 2 * Blocked::paddedCols(n) + c0 * ((depth + 1) / 2));
  }
}

void bf16GemmPacked(bool ta, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint32_t* packed,
                    int64_t c0, int64_t c1, float beta, float* c, int64_t ldc) {
  for (int64_t p0 = 0; p0 < k; p0 += kDepthBf16) {
    const int64_t depth = std::min(kDepthBf16, k - p0);
    multiplyDepthBlockBf16(ta, m, k, a, lda, p0, depth,
                           packed + p0 / 2 * Blocked::paddedCols(n) + c0 * ((depth + 1) / 2), c1 - c0, beta, c + c0,
                           ldc);
  }
}
}  // namespace

const Bf16Kernel& bf16Avx512() {
  static constexpr Bf16Kernel kernel{"weft AVX512_BF16", kTileCols,       &bf16Gemm<uint16_t>, &bf16Gemm<float>,
                                     &packedBf16Size,    &packBf16Operand, &bf16GemmPacked};
  return kernel;
}
#endif  // __AVX512BF16__ && __AVX512BW__ && __AVX512VL__

}  // namespace weft::blas::detail

#endif  // __AVX512F__
