// The cache blocking weft's f32 kernels share (internal to ops/SgemmAvx2.cpp and
// ops/SgemmAvx512.cpp), the classic layout: a panel of B (kDepth x kPanelCols) and a block of A
// (kBlockRows x kDepth) are packed into slivers that the register tile reads in order; the tile
// runs down the depth of one sliver of B, which stays in L1, while the slivers of A stream from
// L2. Every element of C is computed by one chain of multiply-adds per depth block, added to C
// block after block, whatever tile or call it falls in: any cut of C gives the same bits.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>

namespace weft::blas::detail {

/// A packing buffer of at least `floats` floats, aligned to 64 bytes for the kernels' vector
/// loads (aligned_alloc takes whole multiples of the alignment).
class PackBuffer {
 public:
  explicit PackBuffer(int64_t floats) : data_(static_cast<float*>(std::aligned_alloc(64, wholeLines(floats)))) {
    if (data_ == nullptr) throw std::bad_alloc();
  }
  ~PackBuffer() { std::free(data_); }
  PackBuffer(const PackBuffer&) = delete;
  PackBuffer& operator=(const PackBuffer&) = delete;
  float* get() const { return data_; }

 private:
  static size_t wholeLines(int64_t floats) { return (static_cast<size_t>(floats) * sizeof(float) + 63) / 64 * 64; }
  float* data_;
};

/// A kernel's tile functions by height, 1 .. MaxRows (entry 0 is null): tileOfHeight, called
/// with std::integral_constant<int, h>, gives the tile function of height h.
template <int MaxRows, class TileOfHeight>
constexpr auto tilesByHeight(TileOfHeight tileOfHeight) {
  using Tile = decltype(tileOfHeight(std::integral_constant<int, 1>{}));
  return [&]<int... H>(std::integer_sequence<int, H...>) {
    return std::array<Tile, MaxRows + 1>{Tile{nullptr}, tileOfHeight(std::integral_constant<int, H + 1>{})...};
  }(std::make_integer_sequence<int, MaxRows>{});
}

/// A kernel's f32 products, row-major, single-threaded, with the conventions of blas::gemm (m,
/// n and k at least 1); each element of C is computed by the same sequence of operations wherever
/// it lies in C and however C is cut into calls, so products split across threads give the bits
/// of one call.
struct SgemmKernel {
  /// The register tile's columns: products with a packed operand are split at multiples of it.
  int64_t tileCols;
  /// C (m x n) = op(A) op(B) + beta C.
  void (*gemm)(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
               int64_t ldb, float beta, float* c, int64_t ldc);
  /// The floats op(B) (k x n) takes packed whole by packOperand.
  int64_t (*packedSize)(int64_t k, int64_t n);
  /// Lays columns [c0, c1) of op(B) (k x n; B stored n x k when tb) out as the kernel reads them,
  /// in their place in `packed`, for many products; c0 is a multiple of tileCols, so disjoint
  /// ranges can be packed at once.
  void (*packOperand)(bool tb, int64_t k, int64_t n, const float* b, int64_t ldb, int64_t c0, int64_t c1,
                      float* packed);
  /// Columns [c0, c1) of C (m x n) = op(A) B + beta C with B packed by packOperand; c0 is a
  /// multiple of tileCols. Gives the bits gemm gives.
  void (*gemmPacked)(bool ta, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* packed,
                     int64_t c0, int64_t c1, float beta, float* c, int64_t ldc);
};

/// A kernel's bf16 products with f32 accumulation, with the conventions of SgemmKernel: A and B
/// in bfloat16 (their bit patterns), or in f32 rounded to bfloat16 as they are packed (to nearest
/// even, f32 subnormals, below 2^-126, as zero: the product of the rounded operands, with no
/// rounded copy of either); C in f32.
struct Bf16Kernel {
  const char* name;  ///< for reports: "weft AMX-BF16", "weft AVX512_BF16"
  /// Products with a packed operand are split at multiples of these columns.
  int64_t tileCols;
  /// C (m x n) = op(A) op(B) + beta C; k may be 0.
  void (*gemm)(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* b,
               int64_t ldb, float beta, float* c, int64_t ldc);
  /// The same for f32 operands, each element rounded to bf16 as it is packed.
  void (*gemmRounding)(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                       int64_t ldb, float beta, float* c, int64_t ldc);
  /// The 32-bit words (pairs of bf16 values) op(B) (k x n) takes packed whole by packOperand.
  int64_t (*packedSize)(int64_t k, int64_t n);
  /// Columns [c0, c1) of the f32 op(B) (k x n; B stored n x k when tb), rounded to bf16 and laid
  /// out as the kernel reads them, in their place in `packed`; c0 is a multiple of tileCols, so
  /// that disjoint ranges can be packed at once.
  void (*packOperand)(bool tb, int64_t k, int64_t n, const float* b, int64_t ldb, int64_t c0, int64_t c1,
                      uint32_t* packed);
  /// Columns [c0, c1) of C (m x n) = op(A) B + beta C with B packed by packOperand and the f32 A
  /// rounded as it is packed; c0 is a multiple of tileCols. Gives the bits gemmRounding gives.
  void (*gemmPacked)(bool ta, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint32_t* packed,
                     int64_t c0, int64_t c1, float beta, float* c, int64_t ldc);
};

/// The blocked product for a kernel K, which supplies:
///   kTileRows, kTileCols, kDepth, kBlockRows, kPanelCols, kDirectACols: the register tile, the
///     depth block, the rows of a packed block of A, the columns of a packed panel of B, and the
///     widest B for which A is read in place rather than packed; kPackSlack, the floats packA
///     may write past a block;
///   tileHeight(rows, done): the height of the tile `done` rows into a block of `rows`;
///   packA(ta, a, lda, i0, rows, p0, depth, out): rows [i0, i0 + rows) of op(A) over depth
///     [p0, p0 + depth), one depth-major sliver per tile (tileHeight) at out + first row * depth;
///   packB(tb, b, ldb, j0, cols, p0, depth, out): columns [j0, j0 + cols) of op(B) over that
///     depth, slivers of kTileCols columns laid out depth-major, the columns past the end zero;
///   packedTile(height), directTile(height): tile kernels called as (depth, a, lda, sliver of B,
///     c, ldc, live columns, beta, accumulate): C = beta C + A B on the first depth block (C
///     never read when beta is 0), C += A B on the later ones; A packed, or read in place;
template <class K>
struct BlockedSgemm {
  /// The calling thread's packing buffers, allocated on its first product.
  struct Buffers {
    PackBuffer a{K::kBlockRows * K::kDepth + K::kPackSlack}, b{K::kPanelCols * K::kDepth};
  };
  static Buffers& buffers() {
    thread_local Buffers perThread;
    return perThread;
  }

  static int64_t paddedCols(int64_t n) { return (n + K::kTileCols - 1) / K::kTileCols * K::kTileCols; }

  /// C[:, 0 .. cols) += A B over one depth block with A read in place (A row-major, at its first
  /// depth): where B is at most kDirectACols wide, packing A would cost as much as the product.
  static void multiplyDirect(int64_t m, const float* a, int64_t lda, int64_t depth, const float* slivers, int64_t cols,
                             float beta, bool accumulate, float* c, int64_t ldc) {
    for (int64_t jt = 0; jt < cols; jt += K::kTileCols) {
      for (int64_t i = 0, height; i < m; i += height) {
        height = K::tileHeight(m, i);
        K::directTile(height)(depth, a + i * lda, lda, slivers + jt * depth, c + i * ldc + jt, ldc,
                              std::min(K::kTileCols, cols - jt), beta, accumulate);
      }
    }
  }

  /// C[:, 0 .. cols) += op(A) B over depth [p0, p0 + depth) (C = beta C + ... on the first depth
  /// block), with B's slivers for those columns and that depth at `slivers`.
  static void multiplyDepthBlock(bool ta, int64_t m, const float* a, int64_t lda, int64_t p0, int64_t depth,
                                 const float* slivers, int64_t cols, float beta, float* c, int64_t ldc) {
    if (!ta && cols <= K::kDirectACols) {
      multiplyDirect(m, a + p0, lda, depth, slivers, cols, beta, p0 > 0, c, ldc);
      return;
    }
    float* packedA = buffers().a.get();
    for (int64_t i0 = 0; i0 < m; i0 += K::kBlockRows) {
      const int64_t rows = std::min(K::kBlockRows, m - i0);
      K::packA(ta, a, lda, i0, rows, p0, depth, packedA);
      for (int64_t jt = 0; jt < cols; jt += K::kTileCols) {
        for (int64_t it = 0, height; it < rows; it += height) {
          height = K::tileHeight(rows, it);
          K::packedTile(height)(depth, packedA + it * depth, 0, slivers + jt * depth, c + (i0 + it) * ldc + jt, ldc,
                                std::min(K::kTileCols, cols - jt), beta, p0 > 0);
        }
      }
    }
  }

  /// C (m x n) = op(A) op(B) + beta C; m, n and k at least 1.
  static void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float beta, float* c, int64_t ldc) {
    float* packedB = buffers().b.get();
    for (int64_t j0 = 0; j0 < n; j0 += K::kPanelCols) {
      const int64_t cols = std::min(K::kPanelCols, n - j0);
      for (int64_t p0 = 0; p0 < k; p0 += K::kDepth) {
        const int64_t depth = std::min(K::kDepth, k - p0);
        K::packB(tb, b, ldb, j0, cols, p0, depth, packedB);
        multiplyDepthBlock(ta, m, a, lda, p0, depth, packedB, cols, beta, c + j0, ldc);
      }
    }
  }

  // op(B) packed whole: depth block after depth block, each holding the slivers of all n columns.
  static int64_t packedSize(int64_t k, int64_t n) { return k * paddedCols(n); }

  /// Packs columns [c0, c1) of op(B) in their place; c0 is a multiple of kTileCols.
  static void packOperand(bool tb, int64_t k, int64_t n, const float* b, int64_t ldb, int64_t c0, int64_t c1,
                          float* packed) {
    for (int64_t p0 = 0; p0 < k; p0 += K::kDepth) {
      const int64_t depth = std::min(K::kDepth, k - p0);
      K::packB(tb, b, ldb, c0, c1 - c0, p0, depth, packed + p0 * paddedCols(n) + c0 * depth);
    }
  }

  /// Columns [c0, c1) of C = op(A) B + beta C with B packed by packOperand.
  static void gemmPacked(bool ta, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* packed,
                         int64_t c0, int64_t c1, float beta, float* c, int64_t ldc) {
    for (int64_t p0 = 0; p0 < k; p0 += K::kDepth) {
      const int64_t depth = std::min(K::kDepth, k - p0);
      multiplyDepthBlock(ta, m, a, lda, p0, depth, packed + p0 * paddedCols(n) + c0 * depth, c1 - c0, beta, c + c0,
                         ldc);
    }
  }
};

/// BlockedSgemm<K>'s products as a SgemmKernel.
template <class K>
constexpr SgemmKernel blockedSgemmKernel() {
  using B = BlockedSgemm<K>;
  return {K::kTileCols, &B::gemm, &B::packedSize, &B::packOperand, &B::gemmPacked};
}

}  // namespace weft::blas::detail
