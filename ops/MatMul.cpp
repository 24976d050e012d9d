// Matrix products through ops/Blas.h (weft's own kernels or OpenBLAS; weft's pool runs the blocks
// of the output, so the thread count is the session's). bf16 products run on weft's bf16 kernel
// where the CPU has AVX512_BF16, other 16-bit products in f32 on the CPU; on the GPU all run in
// 16 bits with f32 accumulation. A product of f32 values marked "round_operands_to" (bf16 or f16:
// a mixed-precision scope's MixedOps::RoundInProducts) multiplies its operands rounded to that
// type and sums in f32: the CPU's bf16 kernel rounds them as it packs them, so no rounded copy
// is made; elsewhere the operands are rounded into copies first.
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
  detail::checkProductRounding(c);
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

/// The f32 or f64 product of a and b into c, each matrix of a batch in turn.
void gemmEach(const KernelContext& ctx, const Tensor& a, const Tensor& b, Tensor& c, bool ta, bool tb) {
  const MatDims d = matDims(a.shape(), b.shape(), ta, tb);
  dispatchFloat(a.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* pc = c.data<T>();
    for (int64_t i = 0; i < d.batch; ++i) {
      blas::parallelGemm(ctx, ta, tb, d.m, d.n, d.k, pa + i * d.m * d.k, ta ? d.m : d.k, pb + i * d.k * d.n,
                         tb ? d.k : d.n, T(0), pc + i * d.m * d.n, d.n);
    }
  });
}

bool transposeA(const Attrs& attrs) { return attrs.get<bool>("transpose_a"); }
bool transposeB(const Attrs& attrs) { return attrs.get<bool>("transpose_b"); }

void matmulKernel(KernelContext& ctx) {
  gemmEach(ctx, ctx.input(0), ctx.input(1), ctx.output(0), transposeA(ctx.attrs()), transposeB(ctx.attrs()));
}

/// The product op, its f32 operands rounded to `low` (f32: not rounded).
Output addMatmulOp(const char* op, Output a, Output b, bool ta, bool tb, DType low) {
  Attrs attrs{{"transpose_a", ta}, {"transpose_b", tb}};
  if (low != f32) attrs.set("round_operands_to", low);
  return detail::addOp1(a.graph(), op, {a, b}, std::move(attrs));
}

/// The product in the graph's compute precision (Graph::computePrecision).
Output addMatmul(const char* op, Output a, Output b, bool ta, bool tb) {
  if (const DType low = detail::productRounding({a, b}); low != f32) return addMatmulOp(op, a, b, ta, tb, low);
  return detail::inComputePrecision({a, b}, [&](const std::vector<Output>& x) {
    return addMatmulOp(op, x[0], x[1], ta, tb, f32);
  });
}

// Y = op(A) op(B). With G = dY:
//   A B:     dA = G B^T,   dB = A^T G
//   A B^T:   dA = G B,     dB = G^T A
//   A^T B:   dA = B G^T,   dB = A G
//   A^T B^T: dA = B^T G^T, dB = G^T A^T
std::vector<Grad> matmulGrad(GradContext& c, bool batched) {
  const bool ta = transposeA(c.attrs()), tb = transposeB(c.attrs());
  // The gradient's products round their operands as the forward product does.
  const DType low = detail::productRounding(c.attrs());
  auto mm = [batched, low](Output x, Output y, bool tx, bool ty) {
    return addMatmulOp(batched ? "BatchMatMul" : "MatMul", x, y, tx, ty, low);
  };
  Output a = c.x(0), b = c.x(1), g = c.dy();
  if (!ta && !tb) return {mm(g, b, false, true), mm(a, g, true, false)};
  if (!ta && tb) return {mm(g, b, false, false), mm(g, a, true, false)};
  if (ta && !tb) return {mm(b, g, false, true), mm(a, g, false, false)};
  return {mm(b, g, true, true), mm(g, a, true, true)};
}

/// Each matrix of a batch on the bf16 kernel, into f32 c: operands in bf16 (T = BFloat16), or in
/// f32 that the kernel rounds to bf16 (T = float).
template <class T>
void bf16GemmEach(const KernelContext& ctx, const Tensor& a, const Tensor& b, float* c, bool ta, bool tb) {
  const MatDims d = matDims(a.shape(), b.shape(), ta, tb);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  for (int64_t i = 0; i < d.batch; ++i) {
    blas::parallelGemmBf16(ctx, ta, tb, d.m, d.n, d.k, pa + i * d.m * d.k, ta ? d.m : d.k, pb + i * d.k * d.n,
                           tb ? d.k : d.n, 0.0f, c + i * d.m * d.n, d.n);
  }
}

/// A bf16 product on weft's bf16 kernel (dot products of bf16 pairs accumulated in f32): the f32
/// result, rounded once into the bf16 output.
void matmulBf16Kernel(KernelContext& ctx) {
  Tensor wide(f32, ctx.output(0).shape());
  bf16GemmEach<BFloat16>(ctx, ctx.input(0), ctx.input(1), wide.data<float>(), transposeA(ctx.attrs()),
                         transposeB(ctx.attrs()));
  detail::castElements(ctx, wide, ctx.output(0));
}

/// f32 operands rounded to `low`, f32 result: bf16 on the bf16 kernel, which rounds as it packs;
/// otherwise the f32 product of rounded copies.
void matmulRoundedKernel(KernelContext& ctx, DType low) {
  const Tensor &a = ctx.input(0), &b = ctx.input(1);
  const bool ta = transposeA(ctx.attrs()), tb = transposeB(ctx.attrs());
  if (low == bf16 && blas::haveBf16Gemm()) return bf16GemmEach<float>(ctx, a, b, ctx.output(0).data<float>(), ta, tb);
  auto rounded = [&](const Tensor& x) {
    Tensor narrow(low, x.shape()), wide(f32, x.shape());
    detail::castElements(ctx, x, narrow);
    detail::castElements(ctx, narrow, wide);
    return wide;
  };
  gemmEach(ctx, rounded(a), rounded(b), ctx.output(0), ta, tb);
}

/// Products of f32 values rounded as marked; bf16 products on the bf16 kernel where the CPU has
/// one; other 16-bit products in f32.
void matmulCpu(KernelContext& ctx) {
  if (const DType low = detail::productRounding(ctx.attrs()); low != f32) return matmulRoundedKernel(ctx, low);
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
            .cpu(matmulCpu)
            .cuda(WEFT_CUDA_KERNEL(matmul))
            .grad([](GradContext& c) { return matmulGrad(c, false); }));
  r.add(OpDef("BatchMatMul")
            .inputs(2)
            .infer([](const InferContext& c) { return matmulInfer(c, true); })
            .cpu(matmulCpu)
            .cuda(WEFT_CUDA_KERNEL(matmul))
            .grad([](GradContext& c) { return matmulGrad(c, true); }));
}

}  // namespace weft
