// The CUDA kernel of MatMul and BatchMatMul (ops/MatMul.cpp): one strided-batched cuBLAS GEMM
// (f32 accumulation for bf16 and f16, and for f32 operands that it rounds to 16 bits).
#include "ops/cuda/Blas.h"
#include "ops/cuda/Host.h"
#include "ops/cuda/Kernels.h"

namespace weft::cudaops {

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
  if (const DType low = ctx.attrs().get<DType>("round_operands_to", f32); low != f32) {
    return gemmRounded(ctx, low, ta, tb, m, n, k, a.data<float>(), ta ? m : k, b.data<float>(), tb ? k : n, 0.0f,
                       c.data<float>(), n, batch, m * k, k * n, m * n);
  }
  if (isHalfPrecision(a.dtype())) {
    return gemmHalf(ctx, a.dtype(), ta, tb, m, n, k, a.raw(), ta ? m : k, b.raw(), tb ? k : n, c.raw(), n, batch, m * k,
                    k * n, m * n);
  }
  dispatchFloating(a.dtype(), [&](auto z) {
    using T = decltype(z);
    gemm<T>(ctx, ta, tb, m, n, k, a.data<T>(), ta ? m : k, b.data<T>(), tb ? k : n, T(0), c.data<T>(), n, batch, m * k,
            k * n, m * n);
  });
}

}  // namespace weft::cudaops
