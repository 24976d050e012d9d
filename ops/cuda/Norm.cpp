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

// Inputs x, gamma, beta; outputs y, mean, biased var, invstd; with `relu`, y = max(0, ...).
void train(KernelContext& ctx, bool relu) {
  const launch::NormShape l = layoutOf(ctx.input(0).shape());
  if (l.c == 0) return;
  const Tensor partials = partialsFor(ctx, l);
  dispatchNorm(ctx.input(0).dtype(), [&](auto zt, auto zp) {
    using T = decltype(zt);
    using P = decltype(zp);
    WEFT_CUDA_CHECK(launch::batchNormTrain<T, P>(ctx.in<T>(0), ctx.in<P>(1), ctx.in<P>(2), ctx.out<T>(0),
                                                 ctx.out<P>(1), ctx.out<P>(2), ctx.out<P>(3), relu, l,
                                                 ctx.attrs().getFloat("epsilon"), partials.data<double>(),
                                                 streamOf(ctx)));
  });
}

// Inputs dy, x, gamma, mean, invstd[, the fused ReLU's output][, dmean, dvar]; outputs dx,
// dgamma, dbeta.
void grad(KernelContext& ctx, bool relu) {
  const launch::NormShape l = layoutOf(ctx.input(1).shape());
  if (l.c == 0) return;
  const int stats = relu ? 6 : 5;  // where dmean and dvar are, when given
  const bool statGrads = ctx.numInputs() == stats + 2;
  const Tensor partials = partialsFor(ctx, l);
  dispatchNorm(ctx.input(1).dtype(), [&](auto zt, auto zp) {
    using T = decltype(zt);
    using P = decltype(zp);
    WEFT_CUDA_CHECK(launch::batchNormGrad<T, P>(ctx.in<T>(0), ctx.in<T>(1), relu ? ctx.in<T>(5) : nullptr,
                                                ctx.in<P>(2), ctx.in<P>(3), ctx.in<P>(4),
                                                statGrads ? ctx.in<P>(stats) : nullptr,
                                                statGrads ? ctx.in<P>(stats + 1) : nullptr, ctx.out<T>(0),
                                                ctx.out<P>(1), ctx.out<P>(2), l, partials.data<double>(),
                                                streamOf(ctx)));
  });
}

}  // namespace

void batchNormTrain(KernelContext& ctx) { train(ctx, false); }
void batchNormReluTrain(KernelContext& ctx) { train(ctx, true); }
void batchNormGrad(KernelContext& ctx) { grad(ctx, false); }
void batchNormReluGrad(KernelContext& ctx) { grad(ctx, true); }

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
