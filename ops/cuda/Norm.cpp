// The CUDA kernels of batch normalisation (ops/Norm.cpp defines the ops; device code in
// ops/cuda/Norm.cu).
#include "ops/cuda/Host.h"
#include "ops/cuda/Kernels.h"

namespace weft::cudaops {
namespace {

/// x as (N, C, S): S is the product of the axes after the channel axis.
struct Layout {
  int64_t n, c, s;
};

Layout layoutOf(const Shape& x) {
  int64_t s = 1;
  for (int i = 2; i < x.rank(); ++i) s *= x[i];
  return {x[0], x[1], s};
}

}  // namespace

// Inputs x, gamma, beta; outputs y, mean, biased var, invstd.
void batchNormTrain(KernelContext& ctx) {
  const Layout l = layoutOf(ctx.input(0).shape());
  if (l.c == 0) return;
  dispatchFloating(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::batchNormTrain<T>(ctx.in<T>(0), ctx.in<T>(1), ctx.in<T>(2), ctx.out<T>(0), ctx.out<T>(1),
                                              ctx.out<T>(2), ctx.out<T>(3), l.n, l.c, l.s,
                                              ctx.attrs().getFloat("epsilon"), streamOf(ctx)));
  });
}

// Inputs dy, x, gamma, mean, invstd[, dmean, dvar]; outputs dx, dgamma, dbeta.
void batchNormGrad(KernelContext& ctx) {
  const Layout l = layoutOf(ctx.input(1).shape());
  if (l.c == 0) return;
  const bool statGrads = ctx.numInputs() == 7;
  dispatchFloating(ctx.input(1).dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::batchNormGrad<T>(ctx.in<T>(0), ctx.in<T>(1), ctx.in<T>(2), ctx.in<T>(3), ctx.in<T>(4),
                                             statGrads ? ctx.in<T>(5) : nullptr, statGrads ? ctx.in<T>(6) : nullptr,
                                             ctx.out<T>(0), ctx.out<T>(1), ctx.out<T>(2), l.n, l.c, l.s,
                                             streamOf(ctx)));
  });
}

// Inputs x, gamma, beta, mean, var; output y.
void batchNormInference(KernelContext& ctx) {
  const Layout l = layoutOf(ctx.input(0).shape());
  if (ctx.input(0).numel() == 0) return;
  dispatchFloating(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::batchNormInference<T>(ctx.in<T>(0), ctx.in<T>(1), ctx.in<T>(2), ctx.in<T>(3),
                                                  ctx.in<T>(4), ctx.out<T>(0), l.n, l.c, l.s,
                                                  ctx.attrs().getFloat("epsilon"), streamOf(ctx)));
  });
}

}  // namespace weft::cudaops
