// weft's AVX2 f32 matrix product (see the header), blocked as the AVX-512 one is
// (ops/SgemmBlocking.h) for 16 vector registers of 8 floats: a register tile of 6 rows x 16
// columns keeps 12 accumulators, two vectors of B and one broadcast of A in registers, and each
// step of the depth does two loads of B, six broadcasts of A and twelve multiply-adds. A sliver of
// B (16 columns x 256 depths, 16 KB) stays in L1 while the tiles of a block of A (96 rows, 96 KB)
// stream from L2. Edge tiles go through a small buffer rather than masked stores, which AMD's
// AVX2 cores run slowly.
#include "ops/SgemmAvx2.h"

#include "ops/SgemmBlocking.h"

#if defined(__AVX2__) && defined(__FMA__)

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <new>
#include <utility>

namespace weft::blas::detail {
namespace {

constexpr int64_t kTileRows = 6;
constexpr int64_t kTileCols = 16;

/// Transposes 8 vectors in registers: on exit r[j] holds lane j of each input, in order.
void transpose8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  __m256 u[8];
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
    r[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
  }
}

/// Calls store(q, column) for q in [0, 8): column q holds element q of each of the first `rows`
/// runs of 8 floats (run i at src + i * ld), zero for the runs past `rows`.
template <class Store>
void transposedColumns(const float* src, int64_t ld, int64_t rows, Store store) {
  __m256 r[8];
  for (int64_t i = 0; i < 8; ++i) r[i] = i < rows ? _mm256_loadu_ps(src + i * ld) : _mm256_setzero_ps();
  transpose8(r);
  for (int q = 0; q < 8; ++q) store(q, r[q]);
}

/// One row of a tile's result written to C (`row`, 16 columns): C = beta C + tile (C never read
/// when beta is 0), or C += tile when accumulating the later depth blocks.
[[gnu::always_inline]] inline void storeRow(float* row, __m256 low, __m256 high, float beta, bool accumulate) {
  if (accumulate) {
    low = _mm256_add_ps(_mm256_loadu_ps(row), low);
    high = _mm256_add_ps(_mm256_loadu_ps(row + 8), high);
  } else if (beta != 0.0f) {
    const __m256 scale = _mm256_set1_ps(beta);
    low = _mm256_fmadd_ps(scale, _mm256_loadu_ps(row), low);
    high = _mm256_fmadd_ps(scale, _mm256_loadu_ps(row + 8), high);
  }
  _mm256_storeu_ps(row, low);
  _mm256_storeu_ps(row + 8, high);
}

/// Stores a tile's accumulators to its first `live` columns of C; a tile narrower than 16 goes
/// through a buffer, with the same arithmetic.
template <int Rows>
[[gnu::always_inline]] inline void storeTile(const __m256 low[Rows], const __m256 high[Rows], float* c, int64_t ldc,
                                             int64_t live, float beta, bool accumulate) {
#pragma GCC unroll 6
  for (int r = 0; r < Rows; ++r) {
    float* row = c + r * ldc;
    if (live == kTileCols) {
      storeRow(row, low[r], high[r], beta, accumulate);
      continue;
    }
    alignas(32) float buffer[kTileCols] = {};
    if (accumulate || beta != 0.0f) std::copy(row, row + live, buffer);
    storeRow(buffer, low[r], high[r], beta, accumulate);
    std::copy(buffer, buffer + live, row);
  }
}

/// One register tile: C[Rows x 16] (its first `live` columns) = beta C + A B over a sliver of B
/// on the first depth block, C += A B on the later ones. A is a packed sliver, or with DirectA
/// the rows of A in place (row r at a + r * lda).
template <int Rows, bool DirectA>
void tile(int64_t depth, const float* __restrict a, int64_t lda, const float* __restrict b, float* c, int64_t ldc,
          int64_t live, float beta, bool accumulate) {
  __m256 low[Rows], high[Rows];
#pragma GCC unroll 6
  for (int r = 0; r < Rows; ++r) low[r] = high[r] = _mm256_setzero_ps();
  for (int64_t p = 0; p < depth; ++p, a += DirectA ? 1 : Rows, b += kTileCols) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
    for (int r = 0; r < Rows; ++r) {
      const __m256 x = _mm256_broadcast_ss(DirectA ? a + r * lda : a + r);
      low[r] = _mm256_fmadd_ps(x, b0, low[r]);
      high[r] = _mm256_fmadd_ps(x, b1, high[r]);
    }
  }
  storeTile<Rows>(low, high, c, ldc, live, beta, accumulate);
}

using TileKernel = void (*)(int64_t, const float*, int64_t, const float*, float*, int64_t, int64_t, float, bool);
constexpr auto kPackedTiles = tilesByHeight<kTileRows>([](auto h) { return &tile<decltype(h)::value, false>; });
constexpr auto kDirectTiles = tilesByHeight<kTileRows>([](auto h) { return &tile<decltype(h)::value, true>; });

/// The kernel's blocks and packing, for BlockedSgemm.
struct Avx2 {
  static constexpr int64_t kTileRows = detail::kTileRows, kTileCols = detail::kTileCols;
  static constexpr int64_t kDepth = 256;
  static constexpr int64_t kBlockRows = 96;  // sixteen tiles of rows
  static constexpr int64_t kPanelCols = 1024;
  static constexpr int64_t kDirectACols = 2 * kTileCols;  // B no wider than this: A is read in place
  static constexpr int64_t kPackSlack = 8;                // see packA

  /// The height of the register tile that starts `done` rows into a block of `rows`: 6 where
  /// that leaves no sliver of fewer than 4 behind, otherwise the rest in two halves (8 rows run
  /// as 4 + 4, not 6 + 2, whose 2-row tile spends most of a step on loads).
  static int64_t tileHeight(int64_t rows, int64_t done) {
    const int64_t left = rows - done;
    if (left <= kTileRows) return left;
    if (left < kTileRows + 4) return (left + 1) / 2;
    return kTileRows;
  }

  /// Rows [i0, i0 + rows) and depth [p0, p0 + depth) of op(A), as one sliver per register tile
  /// (tileHeight), each laid out depth-major (sliver[p * height + r]) at `out + first row * depth`.
  /// A stored row-major is transposed 8 depths at a time in registers, each depth's column stored
  /// whole: its lanes past the tile's height land where the next depth goes (or in the buffer's
  /// slack, kPackSlack floats past the block).
  static void packA(bool ta, const float* a, int64_t lda, int64_t i0, int64_t rows, int64_t p0, int64_t depth,
                    float* out) {
    for (int64_t s = 0, height; s < rows; s += height) {
      height = tileHeight(rows, s);
      float* sliver = out + s * depth;
      if (ta) {
        for (int64_t p = 0; p < depth; ++p) {
          const float* src = a + (p0 + p) * lda + i0 + s;
          for (int64_t r = 0; r < height; ++r) sliver[p * height + r] = src[r];
        }
        continue;
      }
      const float* src = a + (i0 + s) * lda + p0;
      int64_t p = 0;
      for (; p + 8 <= depth; p += 8) {
        transposedColumns(src + p, lda, height,
                          [&](int q, __m256 column) { _mm256_storeu_ps(sliver + (p + q) * height, column); });
      }
      for (; p < depth; ++p)
        for (int64_t r = 0; r < height; ++r) sliver[p * height + r] = src[r * lda + p];
    }
  }

  /// Columns [j0, j0 + cols) and depth [p0, p0 + depth) of op(B), as slivers of kTileCols columns
  /// laid out depth-major (sliver[p * kTileCols + c]); the columns past the end are zero. B stored
  /// as n x k is transposed 8 columns by 8 depths at a time in registers.
  static void packB(bool tb, const float* b, int64_t ldb, int64_t j0, int64_t cols, int64_t p0, int64_t depth,
                    float* out) {
    for (int64_t s = 0; s < cols; s += kTileCols, out += kTileCols * depth) {
      const int64_t live = std::min(kTileCols, cols - s);
      if (tb) {
        // Column c of the sliver is row j0 + s + c of B.
        for (int64_t half = 0; half < kTileCols; half += 8) {
          const int64_t rowsLive = std::clamp<int64_t>(live - half, 0, 8);
          const float* src = rowsLive > 0 ? b + (j0 + s + half) * ldb + p0 : b;  // not read when no row is live
          int64_t p = 0;
          for (; p + 8 <= depth; p += 8) {
            transposedColumns(src + p, ldb, rowsLive, [&](int q, __m256 column) {
              _mm256_storeu_ps(out + (p + q) * kTileCols + half, column);
            });
          }
          for (; p < depth; ++p)
            for (int64_t c = 0; c < 8; ++c) out[p * kTileCols + half + c] = c < rowsLive ? src[c * ldb + p] : 0.0f;
        }
      } else if (live == kTileCols) {
        for (int64_t p = 0; p < depth; ++p) {
          const float* src = b + (p0 + p) * ldb + j0 + s;
          _mm256_storeu_ps(out + p * kTileCols, _mm256_loadu_ps(src));
          _mm256_storeu_ps(out + p * kTileCols + 8, _mm256_loadu_ps(src + 8));
        }
      } else {
        for (int64_t p = 0; p < depth; ++p) {
          const float* src = b + (p0 + p) * ldb + j0 + s;
          for (int64_t col = 0; col < kTileCols; ++col) out[p * kTileCols + col] = col < live ? src[col] : 0.0f;
        }
      }
    }
  }

  static TileKernel packedTile(int64_t height) { return kPackedTiles[static_cast<size_t>(height)]; }
  static TileKernel directTile(int64_t height) { return kDirectTiles[static_cast<size_t>(height)]; }
};

}  // namespace

const SgemmKernel& sgemmAvx2() {
  static constexpr SgemmKernel kernel = blockedSgemmKernel<Avx2>();
  return kernel;
}

}  // namespace weft::blas::detail

#endif  // __AVX2__ && __FMA__
