#include "ops/cuda/Blas.h"

#include "ops/Ops.h"
#include "ops/cuda/Host.h"

#include <cublas_v2.h>

namespace weft::cudaops {
namespace {

void checkBlas(cublasStatus_t status, const char* call) {
  WEFT_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLAS error {} ({}) in {}", cublasGetStatusName(status),
             cublasGetStatusString(status), call);
}

cublasHandle_t handleFor(int gpu) {
  static HandlePerGpu<cublasHandle_t> handles;
  return handles.get(gpu, [](cublasHandle_t& h) { checkBlas(cublasCreate(&h), "cublasCreate"); });
}

// One product goes through the plain call: cuBLAS's heuristics for a strided batch of one pick
// slower kernels for large TF32 products (0.81x of cublasSgemm at 8192 on an H200).
cublasStatus_t stridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float* alpha, const float* a, int lda, int64_t strideA, const float* b, int ldb,
                              int64_t strideB, const float* beta, float* c, int ldc, int64_t strideC, int batch) {
  if (batch == 1) return cublasSgemm(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, a, lda, strideA, b, ldb, strideB, beta, c, ldc, strideC,
                                   batch);
}

cublasStatus_t stridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const double* alpha, const double* a, int lda, int64_t strideA, const double* b, int ldb,
                              int64_t strideB, const double* beta, double* c, int ldc, int64_t strideC, int batch) {
  if (batch == 1) return cublasDgemm(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  return cublasDgemmStridedBatched(h, ta, tb, m, n, k, alpha, a, lda, strideA, b, ldb, strideB, beta, c, ldc, strideC,
                                   batch);
}

int asInt(int64_t v, const char* what) {
  WEFT_CHECK(v >= 0 && v <= 2147483647, "a GPU matrix product's {} ({}) exceeds cuBLAS's 32-bit sizes", what, v);
  return static_cast<int>(v);
}

}  // namespace

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets B first, and each
// stored row length becomes a leading dimension.
template <class T>
void gemm(const KernelContext& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc, int64_t batch, int64_t strideA, int64_t strideB,
          int64_t strideC) {
  if (m == 0 || n == 0 || batch == 0) return;
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  if (k == 0) {
    if (beta != T(0)) return;  // C = beta C: with beta 1 nothing changes
    WEFT_CHECK(ldc == n && (batch == 1 || strideC == m * n), "an empty GEMM into a strided C");
    WEFT_CUDA_CHECK(cudaMemsetAsync(c, 0, static_cast<size_t>(batch * m * n) * sizeof(T), stream));
    return;
  }
  WEFT_CHECK(beta == T(0) || beta == T(1), "gemm takes beta 0 or 1, got {}", static_cast<double>(beta));
  cublasHandle_t h = handleFor(ctx.device.index);
  checkBlas(cublasSetStream(h, stream), "cublasSetStream");
  if constexpr (std::is_same_v<T, float>) {
    checkBlas(cublasSetMathMode(h, tf32Allowed() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
              "cublasSetMathMode");
  }
  const T one = 1;
  checkBlas(stridedBatched(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, asInt(n, "n"),
                           asInt(m, "m"), asInt(k, "k"), &one, b, asInt(ldb, "ldb"), strideB, a, asInt(lda, "lda"),
                           strideA, &beta, c, asInt(ldc, "ldc"), strideC, asInt(batch, "batch")),
            "cublas<t>gemmStridedBatched");
}

namespace {

/// A cublasGemmStridedBatchedEx product of `element` matrices computed as `compute` says, its
/// split-K partial sums in f32, so C is rounded once.
void gemmEx(const KernelContext& ctx, cudaDataType element, size_t elementBytes, cublasComputeType_t compute, bool ta,
            bool tb, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, const void* b, int64_t ldb,
            float beta, void* c, int64_t ldc, int64_t batch, int64_t strideA, int64_t strideB, int64_t strideC) {
  if (m == 0 || n == 0 || batch == 0) return;
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  WEFT_CHECK(beta == 0.0f || beta == 1.0f, "gemmEx takes beta 0 or 1, got {}", beta);
  if (k == 0) {
    if (beta != 0.0f) return;  // C = beta C: with beta 1 nothing changes
    WEFT_CHECK(ldc == n && (batch == 1 || strideC == m * n), "an empty GEMM into a strided C");
    WEFT_CUDA_CHECK(cudaMemsetAsync(c, 0, static_cast<size_t>(batch * m * n) * elementBytes, stream));  // +0.0
    return;
  }
  cublasHandle_t h = handleFor(ctx.device.index);
  checkBlas(cublasSetStream(h, stream), "cublasSetStream");
  checkBlas(cublasSetMathMode(h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                           CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
            "cublasSetMathMode");
  const float one = 1;
  if (batch == 1) {  // as for gemm: the plain call's heuristics
    checkBlas(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, asInt(n, "n"),
                           asInt(m, "m"), asInt(k, "k"), &one, b, element, asInt(ldb, "ldb"), a, element,
                           asInt(lda, "lda"), &beta, c, element, asInt(ldc, "ldc"), compute, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx");
    return;
  }
  checkBlas(cublasGemmStridedBatchedEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, asInt(n, "n"),
                                       asInt(m, "m"), asInt(k, "k"), &one, b, element, asInt(ldb, "ldb"), strideB, a,
                                       element, asInt(lda, "lda"), strideA, &beta, c, element, asInt(ldc, "ldc"),
                                       strideC, asInt(batch, "batch"), compute, CUBLAS_GEMM_DEFAULT),
            "cublasGemmStridedBatchedEx");
}

}  // namespace

void gemmHalf(const KernelContext& ctx, DType type, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a,
              int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc, int64_t batch, int64_t strideA,
              int64_t strideB, int64_t strideC) {
  WEFT_CHECK(type == bf16 || type == f16, "gemmHalf takes bf16 or f16, got {}", dtypeName(type));
  gemmEx(ctx, type == bf16 ? CUDA_R_16BF : CUDA_R_16F, 2, CUBLAS_COMPUTE_32F, ta, tb, m, n, k, a, lda, b, ldb, 0.0f, c,
         ldc, batch, strideA, strideB, strideC);
}

void gemmRounded(const KernelContext& ctx, DType low, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int64_t batch,
                 int64_t strideA, int64_t strideB, int64_t strideC) {
  WEFT_CHECK(low == bf16 || low == f16, "gemmRounded rounds to bf16 or f16, not {}", dtypeName(low));
  gemmEx(ctx, CUDA_R_32F, 4, low == bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_FAST_16F, ta, tb, m, n, k,
         a, lda, b, ldb, beta, c, ldc, batch, strideA, strideB, strideC);
}

template void gemm<float>(const KernelContext&, bool, bool, int64_t, int64_t, int64_t, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t, int64_t, int64_t, int64_t, int64_t);
template void gemm<double>(const KernelContext&, bool, bool, int64_t, int64_t, int64_t, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t, int64_t, int64_t, int64_t, int64_t);

}  // namespace weft::cudaops
