// Row-major matrix products on the GPU through cuBLAS, for the op kernels in ops/cuda/*.cpp.
#pragma once

#include "core/OpRegistry.h"

namespace weft::cudaops {

/// C (m x n) = op(A) op(B) + beta C for `batch` matrices `stride*` elements apart, row-major, on
/// the step's stream. A is stored (k x m) when ta, B (n x k) when tb; lda, ldb, ldc are stored
/// row lengths. f32 products use TF32 tensor cores when allowTF32(true) was called.
template <class T>
void gemm(const KernelContext& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc, int64_t batch = 1, int64_t strideA = 0,
          int64_t strideB = 0, int64_t strideC = 0);

/// The same product of bf16 or f16 matrices (`type`), accumulated in f32 on tensor cores and
/// rounded once into C.
void gemmHalf(const KernelContext& ctx, DType type, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a,
              int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc, int64_t batch, int64_t strideA,
              int64_t strideB, int64_t strideC);

/// C = op(A) op(B) + beta C (beta 0 or 1) of f32 matrices with their elements rounded to bf16 or
/// f16 (`low`) on tensor cores (cuBLAS's CUBLAS_COMPUTE_32F_FAST_16BF or _16F), accumulated in
/// f32 into an f32 C.
void gemmRounded(const KernelContext& ctx, DType low, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int64_t batch = 1,
                 int64_t strideA = 0, int64_t strideB = 0, int64_t strideC = 0);

}  // namespace weft::cudaops
