// The CUDA kernels of batch normalisation (ops/Norm.cpp defines the ops; device code in
// ops/cuda/Norm.cu). x may be f32, f64, or 16-bit with f32 statistics and parameters.
#include "core/Half.h"
#include "ops/cuda/Host.h"
#include "ops/cuda/Kernels.h"

namespace weft::cudaops {
namespace {

/// x as (N, C, S): S is the product of the axes after the channel axis.
launch::NormShape layoutOf(const Shape& x) {
  int64_t s = 1;
  for (int i = 2; i < x.rank(); ++i) s *= x[i];
  return {x[0], x[1], s};
}

/// Calls f(T{}, P{}) for x's element type T and the statistics' type P.
template <class F>
void dispatchNorm(DType x, F&& f) {
  switch (x) {
    case DType::F32: f(float{}, float{}); break;
    case DType::F64: f(double{}, double{}); break;
    case DType::BF16: f(BFloat16{}, float{}); break;
    case DType::F16: f(Float16{}, float{}); break;
    default: WEFT_THROW("dtype {} has no CUDA batch normalisation", dtypeName(x));
  }
}

/// The training ops' per-part sums, from the caching allocator, released in stream order.
Tensor partialsFor(const KernelContext& ctx, const launch::NormShape& l) {
  return Tensor(f64, {launch::batchNormPartials(l)}, ctx.device);
}

}  // namespace

// Inputs x, gamma, beta; outputs y, mean, biased var, invstd.
void batchNormTrain(KernelContext& ctx) {
  const launch::NormShape l = layoutOf(ctx.input(0).shape());
  if (l.c == 0) return;
  const Tensor partials = partialsFor(ctx, l);
  dispatchNorm(ctx.input(0).dtype(), [&](auto zt, auto zp) {
    using T = decltype(zt);
    using P = decltype(zp);
    WEFT_CUDA_CHECK(launch::batchNormTrain<T, P>(ctx.in<T>(0), ctx.in<P>(1), ctx.in<P>(2), ctx.out<T>(0),
                                                 ctx.out<P>(1), ctx.out<P>(2), ctx.out<P>(3), l,
                                                 ctx.attrs().getFloat("epsilon"), partials.data<double>(),
                                                 streamOf(ctx)));
  });
}

// Inputs dy, x, gamma, mean, invstd[, dmean, dvar]; outputs dx, dgamma, dbeta.
void batchNormGrad(KernelContext& ctx) {
  const launch::NormShape l = layoutOf(ctx.input(1).shape());
  if (l.c == 0) return;
  const bool statGrads = ctx.numInputs() == 7;
  const Tensor partials = partialsFor(ctx, l);
  dispatchNorm(ctx.input(1).dtype(), [&](auto zt, auto zp) {
    using T = decltype(zt);
    using P = decltype(zp);
    WEFT_CUDA_CHECK(launch::batchNormGrad<T, P>(ctx.in<T>(0), ctx.in<T>(1), ctx.in<P>(2), ctx.in<P>(3), ctx.in<P>(4),
                                                statGrads ? ctx.in<P>(5) : nullptr, statGrads ? ctx.in<P>(6) : nullptr,
                                                ctx.out<T>(0), ctx.out<P>(1), ctx.out<P>(2), l,
                                                partials.data<double>(), streamOf(ctx)));
  });
}

// Inputs x, gamma, beta, mean, var; output y.
void batchNormInference(KernelContext& ctx) {
  const launch::NormShape l = layoutOf(ctx.input(0).shape());
  if (ctx.input(0).numel() == 0) return;
  dispatchNorm(ctx.input(0).dtype(), [&](auto zt, auto zp) {
    using T = decltype(zt);
    using P = decltype(zp);
    WEFT_CUDA_CHECK(launch::batchNormInference<T, P>(ctx.in<T>(0), ctx.in<P>(1), ctx.in<P>(2), ctx.in<P>(3),
                                                     ctx.in<P>(4), ctx.out<T>(0), l, ctx.attrs().getFloat("epsilon"),
                                                     streamOf(ctx)));
  });
}

}  // namespace weft::cudaops
