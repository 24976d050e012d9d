// CPU matrix products (see the header).
#include "ops/Blas.h"

#include "ops/OwnSgemm.h"

#include <cblas.h>

#include <algorithm>
#include <type_traits>

namespace weft::blas {

template <class T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T beta,
          T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) c[r * ldc + j] = beta == T(0) ? T(0) : beta * c[r * ldc + j];
    return;
  }
  if constexpr (std::is_same_v<T, float> && detail::kHaveOwnSgemm) {
    detail::ownSgemm().gemm(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // OpenBLAS's own threads would compete with the pool's.
  [[maybe_unused]] static const bool oneThread = (openblas_set_num_threads(1), true);
  const auto opA = ta ? CblasTrans : CblasNoTrans, opB = tb ? CblasTrans : CblasNoTrans;
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, opA, opB, i(m), i(n), i(k), 1.0f, a, i(lda), b, i(ldb), beta, c, i(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, opA, opB, i(m), i(n), i(k), 1.0, a, i(lda), b, i(ldb), beta, c, i(ldc));
  }
}

namespace {

/// How C is cut into blocks for the pool: along rows or columns, `per` at a time.
struct Split {
  bool rows;
  int64_t extent, per, blocks;
};

Split makeSplit(bool rows, int64_t extent, int64_t per) { return {rows, extent, per, (extent + per - 1) / per}; }

/// For BLAS, which may round a block of another shape differently: from the shape alone, about
/// four blocks, in 16s (its register tiles), none below 128 (smaller ones cost BLAS more in
/// packing than the pool gains).
Split shapeSplit(int64_t m, int64_t n) {
  const bool rows = m >= n;
  const int64_t extent = rows ? m : n;
  return makeSplit(rows, extent, std::max<int64_t>(128, (extent / 4 + 15) / 16 * 16));
}

/// For weft's own kernels, whose bits no cut changes: one block per thread, none under 16 rows
/// or 64 columns, columns in whole tiles of `tileCols`. Blocks of rows each pack all of B unless
/// it is packed already; blocks of columns each pack all of A.
Split threadSplit(const KernelContext& ctx, int64_t m, int64_t n, bool bPacked, int64_t tileCols) {
  const int64_t threads = ctx.pool ? ctx.pool->numThreads() : 1;
  const bool rows = bPacked ? m >= 16 * threads : m >= n;
  const int64_t extent = rows ? m : n, unit = rows ? 8 : tileCols, least = rows ? 16 : 64;
  const int64_t blocks = std::clamp<int64_t>(extent / least, 1, threads);
  const int64_t per = ((extent + blocks - 1) / blocks + unit - 1) / unit * unit;
  return makeSplit(rows, extent, per);
}

/// Runs block(begin, length) over the split's blocks on the pool.
template <class F>
void forEachBlock(const KernelContext& ctx, const Split& split, int64_t m, int64_t n, int64_t k, F block) {
  const int64_t cost = std::max<int64_t>(1, m * n * std::max<int64_t>(k, 1) / split.blocks);
  ctx.parallelFor(split.blocks, cost, [&](int64_t lo, int64_t hi) {
    for (int64_t blk = lo; blk < hi; ++blk) {
      const int64_t begin = blk * split.per;
      block(begin, std::min(split.extent, begin + split.per) - begin);
    }
  });
}

/// Runs product(rows, cols, aOffset, bOffset, cOffset) for each block of C (m x n) the split
/// makes: the block's extent, and where its parts of A, B and C begin in the caller's operands.
template <class F>
void forEachSubproduct(const KernelContext& ctx, const Split& split, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                       int64_t lda, int64_t ldb, int64_t ldc, F product) {
  forEachBlock(ctx, split, m, n, k, [&](int64_t begin, int64_t len) {
    if (split.rows) {
      product(len, n, ta ? begin : begin * lda, int64_t{0}, begin * ldc);
    } else {
      product(m, len, int64_t{0}, tb ? begin * ldb : begin, begin);
    }
  });
}

constexpr bool ownKernel(bool isFloat) { return isFloat && detail::kHaveOwnSgemm; }

/// The bf16 kernel; throws where there is none.
const detail::Bf16Kernel& bf16Kernel() {
  const detail::Bf16Kernel* kernel = detail::ownBf16Gemm();
  WEFT_CHECK(kernel != nullptr,
             "blas: this CPU or build has no bf16 matrix product (it needs AMX-BF16, or a build for AVX512_BF16)");
  return *kernel;
}

}  // namespace

template <class T>
void parallelGemm(const KernelContext& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
                  const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const Split split = ownKernel(std::is_same_v<T, float>) ? threadSplit(ctx, m, n, false, detail::ownSgemm().tileCols)
                                                          : shapeSplit(m, n);
  forEachSubproduct(ctx, split, ta, tb, m, n, k, lda, ldb, ldc,
                    [&](int64_t rows, int64_t cols, int64_t atA, int64_t atB, int64_t atC) {
                      gemm(ta, tb, rows, cols, k, a + atA, lda, b + atB, ldb, beta, c + atC, ldc);
                    });
}

template <class T>
PackedOperand<T>::PackedOperand(const KernelContext& ctx, bool tb, int64_t k, int64_t n, const T* b, int64_t ldb,
                                bool roundToBf16)
    : tb(tb), k(k), n(n), b(b), ldb(ldb) {
  WEFT_CHECK(!roundToBf16 || (std::is_same_v<T, float> && haveBf16Gemm()),
             "PackedOperand: rounding to bf16 needs f32 operands and a bf16 matrix product (AMX-BF16 or AVX512_BF16)");
  // Disjoint ranges of whole slivers of `sliverCols`, packed across the pool.
  auto packAcross = [&](int64_t sliverCols, auto packRange) {
    const int64_t slivers = (n + sliverCols - 1) / sliverCols;
    ctx.parallelFor(slivers, k * sliverCols,
                    [&](int64_t lo, int64_t hi) { packRange(lo * sliverCols, std::min(n, hi * sliverCols)); });
  };
  if constexpr (std::is_same_v<T, float>) {
    if (roundToBf16) {
      const detail::Bf16Kernel& kernel = bf16Kernel();
      packedBf16 = std::make_unique_for_overwrite<uint32_t[]>(static_cast<size_t>(kernel.packedSize(k, n)));
      packAcross(kernel.tileCols,
                 [&](int64_t c0, int64_t c1) { kernel.packOperand(tb, k, n, b, ldb, c0, c1, packedBf16.get()); });
      return;
    }
  }
  if constexpr (ownKernel(std::is_same_v<T, float>)) {
    const detail::SgemmKernel& kernel = detail::ownSgemm();
    packed = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(kernel.packedSize(k, n)));
    packAcross(kernel.tileCols,
               [&](int64_t c0, int64_t c1) { kernel.packOperand(tb, k, n, b, ldb, c0, c1, packed.get()); });
  }
}

template <class T>
void parallelGemm(const KernelContext& ctx, bool ta, int64_t m, const T* a, int64_t lda, const PackedOperand<T>& b,
                  T beta, T* c, int64_t ldc) {
  if (m == 0 || b.n == 0) return;
  if (b.k == 0 || (!b.packed && !b.packedBf16)) {
    parallelGemm(ctx, ta, b.tb, m, b.n, b.k, a, lda, b.b, b.ldb, beta, c, ldc);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    const detail::Bf16Kernel* bf16 = b.packedBf16 ? &bf16Kernel() : nullptr;
    // Columns [c0, c1) of rows [i0, i0 + rows) of C.
    auto product = [&](int64_t i0, int64_t rows, int64_t c0, int64_t c1) {
      const float* at = ta ? a + i0 : a + i0 * lda;
      if (bf16) {
        bf16->gemmPacked(ta, rows, b.n, b.k, at, lda, b.packedBf16.get(), c0, c1, beta, c + i0 * ldc, ldc);
      } else if constexpr (ownKernel(true)) {
        detail::ownSgemm().gemmPacked(ta, rows, b.n, b.k, at, lda, b.packed.get(), c0, c1, beta, c + i0 * ldc, ldc);
      }
    };
    const Split split = threadSplit(ctx, m, b.n, true, bf16 ? bf16->tileCols : detail::ownSgemm().tileCols);
    forEachBlock(ctx, split, m, b.n, b.k, [&](int64_t begin, int64_t len) {
      if (split.rows) {
        product(begin, len, 0, b.n);
      } else {
        product(0, m, begin, begin + len);
      }
    });
  }
}

bool haveBf16Gemm() { return detail::ownBf16Gemm() != nullptr; }

KernelReport kernelReport() {
#if defined(__AVX512F__)
  constexpr const char* isa = "AVX-512";
#elif defined(__AVX2__)
  constexpr const char* isa = "AVX2";
#elif defined(__AVX__)
  constexpr const char* isa = "AVX";
#elif defined(__aarch64__)
  constexpr const char* isa = "NEON";
#else
  constexpr const char* isa = "SSE";
#endif
  const char* f32 = detail::kHaveSgemmAvx512 ? "weft AVX-512" : detail::kHaveSgemmAvx2 ? "weft AVX2" : "OpenBLAS";
  return {isa, f32, haveBf16Gemm() ? detail::ownBf16Gemm()->name : "none"};
}

template <class T>
void parallelGemmBf16(const KernelContext& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a,
                      int64_t lda, const T* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const detail::Bf16Kernel& kernel = bf16Kernel();
  if (m == 0 || n == 0) return;
  const Split split = threadSplit(ctx, m, n, false, kernel.tileCols);
  forEachSubproduct(ctx, split, ta, tb, m, n, k, lda, ldb, ldc,
                    [&](int64_t rows, int64_t cols, int64_t atA, int64_t atB, int64_t atC) {
                      if constexpr (std::is_same_v<T, BFloat16>) {
                        // The kernel takes bf16 operands as their bit patterns.
                        kernel.gemm(ta, tb, rows, cols, k, reinterpret_cast<const uint16_t*>(a) + atA, lda,
                                    reinterpret_cast<const uint16_t*>(b) + atB, ldb, beta, c + atC, ldc);
                      } else {
                        kernel.gemmRounding(ta, tb, rows, cols, k, a + atA, lda, b + atB, ldb, beta, c + atC, ldc);
                      }
                    });
}

template void parallelGemmBf16<BFloat16>(const KernelContext&, bool, bool, int64_t, int64_t, int64_t, const BFloat16*,
                                         int64_t, const BFloat16*, int64_t, float, float*, int64_t);
template void parallelGemmBf16<float>(const KernelContext&, bool, bool, int64_t, int64_t, int64_t, const float*,
                                      int64_t, const float*, int64_t, float, float*, int64_t);
template class PackedOperand<float>;
template class PackedOperand<double>;
template void parallelGemm<float>(const KernelContext&, bool, int64_t, const float*, int64_t,
                                  const PackedOperand<float>&, float, float*, int64_t);
template void parallelGemm<double>(const KernelContext&, bool, int64_t, const double*, int64_t,
                                   const PackedOperand<double>&, double, double*, int64_t);
template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float,
                          float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, const double*, int64_t, const double*, int64_t,
                           double, double*, int64_t);
template void parallelGemm<float>(const KernelContext&, bool, bool, int64_t, int64_t, int64_t, const float*, int64_t,
                                  const float*, int64_t, float, float*, int64_t);
template void parallelGemm<double>(const KernelContext&, bool, bool, int64_t, int64_t, int64_t, const double*, int64_t,
                                   const double*, int64_t, double, double*, int64_t);

}  // namespace weft::blas
