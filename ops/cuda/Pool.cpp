// The CUDA kernels of max and average pooling (ops/Conv.cpp defines the ops; device code in
// ops/cuda/Pool.cu).
#include "ops/cuda/Host.h"
#include "ops/cuda/Kernels.h"

#include <algorithm>
#include <cstdint>

namespace weft::cudaops {
namespace {

using launch::PoolShape;

/// The pooling of x (N, C, H, W) into an output of (OH, OW).
PoolShape poolShape(const KernelContext& ctx, const Shape& x, const Shape& y) {
  const auto& k = ctx.attrs().get<std::vector<int64_t>>("kernel");
  const auto& s = ctx.attrs().get<std::vector<int64_t>>("strides");
  const auto& p = ctx.attrs().get<std::vector<int64_t>>("padding");
  return {x[0] * x[1], x[2], x[3], y[2], y[3], k[0], k[1], s[0], s[1], p[0], p[1]};
}

void poolForward(KernelContext& ctx, bool max) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  if (y.numel() == 0) return;
  const PoolShape p = poolShape(ctx, x.shape(), y.shape());
  dispatchFloatingOrHalf(x.dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(max ? launch::maxPool<T>(x.data<T>(), y.data<T>(), p, streamOf(ctx))
                        : launch::avgPool<T>(x.data<T>(), y.data<T>(), p, streamOf(ctx)));
  });
}

}  // namespace

void maxPool(KernelContext& ctx) { poolForward(ctx, true); }

// Inputs x, y, dy; output dx.
void maxPoolGrad(KernelContext& ctx) {
  const Tensor &x = ctx.input(0), &y = ctx.input(1), &dy = ctx.input(2);
  Tensor& dx = ctx.output(0);
  if (dx.numel() == 0) return;
  const PoolShape p = poolShape(ctx, x.shape(), y.shape());
  WEFT_CHECK(p.h * p.w <= INT32_MAX, "{}: planes of {} elements exceed the kernel's 32-bit positions",
             ctx.node->describe(), p.h * p.w);
  const Tensor winners(i32, {std::max<int64_t>(y.numel(), 1)}, ctx.device);  // freed in stream order
  dispatchFloatingOrHalf(x.dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::maxPoolGrad<T>(x.data<T>(), y.data<T>(), dy.data<T>(), dx.data<T>(), p,
                                           winners.data<int32_t>(), streamOf(ctx)));
  });
}

void avgPool(KernelContext& ctx) { poolForward(ctx, false); }

// Inputs dy, x; output dx.
void avgPoolGrad(KernelContext& ctx) {
  const Tensor &dy = ctx.input(0), &x = ctx.input(1);
  Tensor& dx = ctx.output(0);
  if (dx.numel() == 0) return;
  const PoolShape p = poolShape(ctx, x.shape(), dy.shape());
  dispatchFloatingOrHalf(x.dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::avgPoolGrad<T>(dy.data<T>(), dx.data<T>(), p, streamOf(ctx)));
  });
}

}  // namespace weft::cudaops
