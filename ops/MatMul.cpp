// Matrix products through ops/Blas.h (weft's own kernels or OpenBLAS; weft's pool runs the blocks
// of the output, so the thread count is the session's). bf16 products run on weft's bf16 kernel
// where the CPU has AVX512_BF16, other 16-bit products in f32 on the CPU; on the GPU all run in
// 16 bits with f32 accumulation.
#include "ops/Blas.h"
#include "ops/OpUtil.h"

#include "ops/cuda/Kernels.h"

#include <atomic>

namespace weft {
namespace {

struct MatDims {
  int64_t batch, m, n, k;
};

MatDims matDims(const Shape& a, const Shape& b, bool ta, bool tb) {
  const int r = a.rank();
  MatDims d{1, ta ? a[r - 1] : a[r - 2], tb ? b[r - 2] : b[r - 1], ta ? a[r - 2] : a[r - 1]};
  for (int i = 0; i < r - 2; ++i) d.batch *= a[i];
  return d;
}

std::vector<TensorType> matmulInfer(const InferContext& c, bool batched) {
  detail::requireSameDType(c, 0, 1);
  detail::requireFloat(c, 0);
  const Shape &a = c.shape(0), &b = c.shape(1);
  if (batched) {
    c.check(a.rank() >= 3 && a.rank() == b.rank(), "needs two tensors of equal rank >= 3");
    for (int i = 0; i < a.rank() - 2; ++i) {
      c.check(a[i] < 0 || b[i] < 0 || a[i] == b[i], "batch dimension {} differs: {} vs {}", i, a[i], b[i]);
    }
  } else {
    c.check(a.rank() == 2 && b.rank() == 2, "needs two matrices");
  }
  const bool ta = c.attrs().get<bool>("transpose_a"), tb = c.attrs().get<bool>("transpose_b");
  const int r = a.rank();
  const int64_t ka = ta ? a[r - 2] : a[r - 1], kb = tb ? b[r - 1] : b[r - 2];
  c.check(ka < 0 || kb < 0 || ka == kb, "inner dimensions differ: {} vs {}", ka, kb);
  std::vector<int64_t> out(a.dims().begin(), a.dims().end() - 2);
  out.push_back(ta ? a[r - 1] : a[r - 2]);
  out.push_back(tb ? b[r - 2] : b[r - 1]);
  return {{c.dtype(0), Shape(std::move(out))}};
}

void matmulKernel(KernelContext& ctx) {
  const Tensor &a = ctx.input(0), &b = ctx.input(1);
  const bool ta = ctx.attrs().get<bool>("transpose_a"), tb = ctx.attrs().get<bool>("transpose_b");
  const MatDims d = matDims(a.shape(), b.shape(), ta, tb);
  dispatchFloat(a.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* pc = ctx.output(0).data<T>();
    for (int64_t i = 0; i < d.batch; ++i) {
      blas::parallelGemm(ctx, ta, tb, d.m, d.n, d.k, pa + i * d.m * d.k, ta ? d.m : d.k, pb + i * d.k * d.n,
                         tb ? d.k : d.n, T(0), pc + i * d.m * d.n, d.n);
    }
  });
}

// Y = op(A) op(B). With G = dY:
//   A B:     dA = G B^T,   dB = A^T G
//   A B^T:   dA = G B,     dB = G^T A
//   A^T B:   dA = B G^T,   dB = A G
//   A^T B^T: dA = B^T G^T, dB = G^T A^T
std::vector<Grad> matmulGrad(GradContext& c, bool batched) {
  const bool ta = c.attrs().get<bool>("transpose_a"), tb = c.attrs().get<bool>("transpose_b");
  auto mm = [batched](Output x, Output y, bool tx, bool ty) {
    return batched ? batchMatmul(x, y, tx, ty) : matmul(x, y, tx, ty);
  };
  Output a = c.x(0), b = c.x(1), g = c.dy();
  if (!ta && !tb) return {mm(g, b, false, true), mm(a, g, true, false)};
  if (!ta && tb) return {mm(g, b, false, false), mm(g, a, true, false)};
  if (ta && !tb) return {mm(b, g, false, true), mm(a, g, false, false)};
  return {mm(b, g, true, true), mm(g, a, true, true)};
}

Output addMatmul(const char* op, Output a, Output b, bool ta, bool tb) {
  return detail::inComputePrecision({a, b}, [&](const std::vector<Output>& x) {
    return detail::addOp1(a.graph(), op, x, {{"transpose_a", ta}, {"transpose_b", tb}});
  });
}

/// A bf16 product on weft's bf16 kernel (dot products of bf16 pairs accumulated in f32): the f32
/// result, rounded once into the bf16 output.
void matmulBf16Kernel(KernelContext& ctx) {
  const Tensor &a = ctx.input(0), &b = ctx.input(1);
  const bool ta = ctx.attrs().get<bool>("transpose_a"), tb = ctx.attrs().get<bool>("transpose_b");
  const MatDims d = matDims(a.shape(), b.shape(), ta, tb);
  Tensor wide(f32, ctx.output(0).shape());
  const BFloat16* pa = a.data<BFloat16>();
  const BFloat16* pb = b.data<BFloat16>();
  float* pc = wide.data<float>();
  for (int64_t i = 0; i < d.batch; ++i) {
    blas::parallelGemmBf16(ctx, ta, tb, d.m, d.n, d.k, pa + i * d.m * d.k, ta ? d.m : d.k, pb + i * d.k * d.n,
                           tb ? d.k : d.n, pc + i * d.m * d.n, d.n);
  }
  detail::castElements(ctx, wide, ctx.output(0));
}

/// bf16 products on the bf16 kernel where the CPU has one; other 16-bit products in f32.
void matmulAnyPrecision(KernelContext& ctx) {
  if (ctx.input(0).dtype() == bf16 && blas::haveBf16Gemm()) return matmulBf16Kernel(ctx);
  detail::runInFloat32(ctx, matmulKernel);
}

std::atomic<bool> tf32{false};

}  // namespace

void allowTF32(bool allow) { tf32 = allow; }
bool tf32Allowed() { return tf32; }

Output matmul(Output a, Output b, bool transposeA, bool transposeB) {
  return addMatmul("MatMul", a, b, transposeA, transposeB);
}
Output batchMatmul(Output a, Output b, bool transposeA, bool transposeB) {
  return addMatmul("BatchMatMul", a, b, transposeA, transposeB);
}

void detail::registerMatMulOps(OpRegistry& r) {
  r.add(OpDef("MatMul")
            .inputs(2)
            .infer([](const InferContext& c) { return matmulInfer(c, false); })
            .cpu(matmulAnyPrecision)
            .cuda(WEFT_CUDA_KERNEL(matmul))
            .grad([](GradContext& c) { return matmulGrad(c, false); }));
  r.add(OpDef("BatchMatMul")
            .inputs(2)
            .infer([](const InferContext& c) { return matmulInfer(c, true); })
            .cpu(matmulAnyPrecision)
            .cuda(WEFT_CUDA_KERNEL(matmul))
            .grad([](GradContext& c) { return matmulGrad(c, true); }));
}

}  // namespace weft
