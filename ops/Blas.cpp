// CPU matrix products (see the header).
#include "ops/Blas.h"

#include "ops/SgemmAvx512.h"

#include <cblas.h>

#include <algorithm>

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
  if constexpr (std::is_same_v<T, float> && detail::kHaveSgemmAvx512) {
    detail::sgemmAvx512(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
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

template <class T>
void parallelGemm(const KernelContext& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
                  const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const bool splitRows = m >= n;
  const int64_t extent = splitRows ? m : n;
  // About four blocks, in 16s (the BLAS kernels' register tiles), and none below 128: smaller
  // blocks cost BLAS more in packing than the pool gains.
  const int64_t per = std::max<int64_t>(128, (extent / 4 + 15) / 16 * 16);
  const int64_t blocks = (extent + per - 1) / per;
  ctx.parallelFor(blocks, std::max<int64_t>(1, m * n * std::max<int64_t>(k, 1) / blocks), [&](int64_t lo, int64_t hi) {
    for (int64_t blk = lo; blk < hi; ++blk) {
      const int64_t begin = blk * per, len = std::min(extent, begin + per) - begin;
      if (splitRows) {
        gemm(ta, tb, len, n, k, ta ? a + begin : a + begin * lda, lda, b, ldb, beta, c + begin * ldc, ldc);
      } else {
        gemm(ta, tb, m, len, k, a, lda, tb ? b + begin * ldb : b + begin, ldb, beta, c + begin, ldc);
      }
    }
  });
}

template <class T>
PackedOperand<T>::PackedOperand(bool tb, int64_t k, int64_t n, const T* b, int64_t ldb)
    : tb(tb), k(k), n(n), b(b), ldb(ldb) {
  if constexpr (std::is_same_v<T, float> && detail::kHaveSgemmAvx512) {
    packed = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(detail::packedSgemmSize(k, n)));
    detail::packSgemmOperand(tb, k, n, b, ldb, packed.get());
  }
}

template <class T>
void parallelGemm(const KernelContext& ctx, bool ta, int64_t m, const T* a, int64_t lda, const PackedOperand<T>& b,
                  T beta, T* c, int64_t ldc) {
  if (!b.packed || m == 0 || b.n == 0 || b.k == 0) {
    parallelGemm(ctx, ta, b.tb, m, b.n, b.k, a, lda, b.b, b.ldb, beta, c, ldc);
    return;
  }
  if constexpr (std::is_same_v<T, float> && detail::kHaveSgemmAvx512) {
    // Blocks of whole tiles, about four, none under 64 rows or columns; from the shape alone.
    const bool splitRows = m > b.n;
    const int64_t unit = splitRows ? 12 : detail::kSgemmTileCols, extent = splitRows ? m : b.n;
    const int64_t per = std::max<int64_t>(64, (extent / 4 + unit - 1) / unit * unit);
    const int64_t blocks = (extent + per - 1) / per;
    ctx.parallelFor(blocks, m * b.n * b.k / blocks, [&](int64_t lo, int64_t hi) {
      for (int64_t blk = lo; blk < hi; ++blk) {
        const int64_t begin = blk * per, end = std::min(extent, begin + per);
        if (splitRows) {
          detail::sgemmAvx512Packed(ta, end - begin, b.n, b.k, ta ? a + begin : a + begin * lda, lda, b.packed.get(),
                                    0, b.n, beta, c + begin * ldc, ldc);
        } else {
          detail::sgemmAvx512Packed(ta, m, b.n, b.k, a, lda, b.packed.get(), begin, end, beta, c, ldc);
        }
      }
    });
  }
}

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
