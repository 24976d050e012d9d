// The CUDA kernels of the dense optimizer updates (ops/Optimizers.cpp) and of the variable
// updates (ops/State.cpp); device code in ops/cuda/Optimizers.cu and ops/cuda/Elementwise.cu.
#include "ops/cuda/Host.h"
#include "ops/cuda/Kernels.h"

namespace weft::cudaops {
namespace {

using rules::Rule;

template <Rule R>
void denseOp(KernelContext& ctx) {
  const int slots = rules::slotCount(R);
  const Tensor& var = ctx.input(0);
  const Attrs& a = ctx.attrs();
  const rules::Hyper h{0, a.getFloat("weight_decay", 0), a.getFloat("momentum", 0), a.getFloat("beta1", 0),
                       a.getFloat("beta2", 0), a.getFloat("epsilon", 0), 1, 1, a.get<bool>("nesterov", false),
                       a.get<bool>("decoupled", false)};
  if (var.numel() == 0) return;
  dispatchFloating(var.dtype(), [&](auto z) {
    using T = decltype(z);
    T* s1 = slots > 0 ? static_cast<T*>(ctx.input(1).raw()) : nullptr;
    T* s2 = slots > 1 ? static_cast<T*>(ctx.input(2).raw()) : nullptr;
    const int64_t* step = R == Rule::Adam ? ctx.input(slots + 3).data<int64_t>() : nullptr;
    WEFT_CUDA_CHECK(launch::denseUpdate<R, T>(h, static_cast<T*>(var.raw()), s1, s2, ctx.input(slots + 1).data<T>(),
                                              ctx.input(slots + 2).data<T>(), step, var.numel(), streamOf(ctx)));
  });
}

}  // namespace

void applySGD(KernelContext& ctx) { denseOp<Rule::SGD>(ctx); }
void applyMomentum(KernelContext& ctx) { denseOp<Rule::Momentum>(ctx); }
void applyAdam(KernelContext& ctx) { denseOp<Rule::Adam>(ctx); }
void applyAdagrad(KernelContext& ctx) { denseOp<Rule::Adagrad>(ctx); }

void assign(KernelContext& ctx) {
  Tensor var = ctx.input(0);
  copyOnDevice(ctx, ctx.input(1), var);
}

void assignAdd(KernelContext& ctx) {
  const Tensor& var = ctx.input(0);
  if (var.numel() == 0) return;
  dispatchAll(var.dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::accumulate<T>(ctx.input(1).data<T>(), static_cast<T*>(var.raw()), var.numel(), streamOf(ctx)));
  });
}

// var = decay * var + (1 - decay) * value
void assignMovingAverage(KernelContext& ctx) {
  const Tensor& var = ctx.input(0);
  if (var.numel() == 0) return;
  const double decay = ctx.attrs().getFloat("decay");
  dispatchFloating(var.dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::blend<T>(ctx.input(1).data<T>(), static_cast<T*>(var.raw()), static_cast<T>(decay),
                                     static_cast<T>(1 - decay), var.numel(), streamOf(ctx)));
  });
}

}  // namespace weft::cudaops
