// CUDA kernel of MatMul and BatchMatMul (ops/MatMul.cpp): one strided-batched cuBLAS GEMM.
#include "ops/Ops.h"
#include "ops/cuda/Kernels.h"

#include "core/cuda/Runtime.h"

#include <cublas_v2.h>

#include <memory>
#include <mutex>
#include <vector>

namespace weft::cudaops {
namespace {

void checkBlas(cublasStatus_t status, const char* call) {
  WEFT_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLAS error {} ({}) in {}", cublasGetStatusName(status),
             cublasGetStatusString(status), call);
}

/// One cuBLAS handle per GPU, created on first use (handles are tied to the device current then).
cublasHandle_t handleFor(int gpu) {
  static std::mutex mutex;
  static std::vector<cublasHandle_t> handles;
  std::lock_guard lock(mutex);
  if (handles.size() <= static_cast<size_t>(gpu)) handles.resize(static_cast<size_t>(gpu) + 1, nullptr);
  cublasHandle_t& h = handles[static_cast<size_t>(gpu)];
  if (!h) {
    cuda::setCurrent(gpu);
    checkBlas(cublasCreate(&h), "cublasCreate");
  }
  return h;
}

cublasStatus_t stridedBatchedGemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                  const float* alpha, const float* a, int lda, int64_t strideA, const float* b, int ldb,
                                  int64_t strideB, const float* beta, float* c, int ldc, int64_t strideC, int batch) {
  return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, a, lda, strideA, b, ldb, strideB, beta, c, ldc, strideC,
                                   batch);
}

cublasStatus_t stridedBatchedGemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                  const double* alpha, const double* a, int lda, int64_t strideA, const double* b,
                                  int ldb, int64_t strideB, const double* beta, double* c, int ldc, int64_t strideC,
                                  int batch) {
  return cublasDgemmStridedBatched(h, ta, tb, m, n, k, alpha, a, lda, strideA, b, ldb, strideB, beta, c, ldc, strideC,
                                   batch);
}

}  // namespace

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets B first, and
// each stored row length becomes a leading dimension.
void matmul(KernelContext& ctx) {
  const Tensor &a = ctx.input(0), &b = ctx.input(1);
  Tensor& c = ctx.output(0);
  const bool ta = ctx.attrs().get<bool>("transpose_a"), tb = ctx.attrs().get<bool>("transpose_b");
  const int r = a.rank();
  const int64_t m = ta ? a.shape()[r - 1] : a.shape()[r - 2];
  const int64_t k = ta ? a.shape()[r - 2] : a.shape()[r - 1];
  const int64_t n = tb ? b.shape()[r - 2] : b.shape()[r - 1];
  int64_t batch = 1;
  for (int i = 0; i < r - 2; ++i) batch *= a.shape()[i];
  if (c.numel() == 0) return;
  const int64_t lda = ta ? m : k, ldb = tb ? k : n;
  constexpr int64_t kIntMax = 2147483647;
  WEFT_CHECK(m <= kIntMax && n <= kIntMax && k <= kIntMax && batch <= kIntMax,
             "a GPU matrix product of {} x {} x {} (batch {}) exceeds cuBLAS's 32-bit dimensions", m, k, n, batch);
  cublasHandle_t h = handleFor(ctx.device.index);
  checkBlas(cublasSetStream(h, static_cast<cudaStream_t>(ctx.stream)), "cublasSetStream");
  const cublasOperation_t opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (k == 0) {
    WEFT_CUDA_CHECK(cudaMemsetAsync(c.raw(), 0, c.bytes(), static_cast<cudaStream_t>(ctx.stream)));
    return;
  }
  if (a.dtype() == f32) {
    checkBlas(cublasSetMathMode(h, tf32Allowed() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
              "cublasSetMathMode");
  }
  WEFT_CHECK(a.dtype() == f32 || a.dtype() == f64, "MatMul on a GPU takes f32 or f64, got {}", dtypeName(a.dtype()));
  auto run = [&](auto z) {
    using T = decltype(z);
    const T one = 1, zero = 0;
    checkBlas(stridedBatchedGemm(h, opB, opA, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &one,
                                 b.data<T>(), static_cast<int>(ldb), k * n, a.data<T>(), static_cast<int>(lda), m * k,
                                 &zero, c.data<T>(), static_cast<int>(n), m * n, static_cast<int>(batch)),
              "cublas<t>gemmStridedBatched");
  };
  if (a.dtype() == f32) run(float{});
  else run(double{});
}

}  // namespace weft::cudaops
