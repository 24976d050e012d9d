// The CUDA kernels of the optimizer updates (ops/Optimizers.cpp) and of the variable updates
// (ops/State.cpp); device code in ops/cuda/Optimizers.cu. None writes in a step that has already
// recorded a data error.
#include "ops/cuda/Host.h"
#include "ops/cuda/Kernels.h"

#include <algorithm>

namespace weft::cudaops {
namespace {

using rules::Rule;

rules::Hyper hyperOf(const Attrs& a) {
  return {0, a.getFloat("weight_decay", 0), a.getFloat("momentum", 0), a.getFloat("beta1", 0), a.getFloat("beta2", 0),
          a.getFloat("epsilon", 0), 1, 1, a.get<bool>("nesterov", false), a.get<bool>("decoupled", false)};
}

template <Rule R>
void denseOp(KernelContext& ctx) {
  const int slots = rules::slotCount(R);
  const Tensor& var = ctx.input(0);
  const rules::Hyper h = hyperOf(ctx.attrs());
  const int64_t offset = std::max<int64_t>(ctx.attrs().getInt("shard_offset", 0), 0);  // a ZeRO shard's elements
  const int64_t count = ctx.input(slots + 1).numel();
  if (count == 0) return;
  dispatchFloating(var.dtype(), [&](auto z) {
    using T = decltype(z);
    T* s1 = slots > 0 ? static_cast<T*>(ctx.input(1).raw()) : nullptr;
    T* s2 = slots > 1 ? static_cast<T*>(ctx.input(2).raw()) : nullptr;
    const int64_t* step = R == Rule::Adam ? ctx.input(slots + 3).data<int64_t>() : nullptr;
    WEFT_CUDA_CHECK(launch::denseUpdate<R, T>(h, static_cast<T*>(var.raw()) + offset, s1, s2,
                                              ctx.input(slots + 1).data<T>(), ctx.input(slots + 2).data<T>(), step,
                                              count, errorSink(ctx), streamOf(ctx)));
  });
}

// Inputs: the variable, its slots, ids, values, lr[, step].
template <Rule R>
void sparseOp(KernelContext& ctx) {
  const int slots = rules::slotCount(R);
  const Tensor& var = ctx.input(0);
  const Tensor &ids = ctx.input(slots + 1), &values = ctx.input(slots + 2);
  const int64_t rows = var.shape()[0], width = rows ? var.numel() / rows : 0;
  if (ids.numel() == 0 || width == 0) return checkIdsOnly(ctx, ids, rows);
  dispatchIds(ids.dtype(), [&](auto zi) {
    using I = decltype(zi);
    const auto bytes = static_cast<int64_t>(launch::idSortWorkspaceBytes<I>(ids.numel()));
    const Tensor workspace(i64, {(bytes + 7) / 8}, ctx.device);  // freed in stream order
    dispatchFloating(var.dtype(), [&](auto z) {
      using T = decltype(z);
      T* s1 = slots > 0 ? static_cast<T*>(ctx.input(1).raw()) : nullptr;
      T* s2 = slots > 1 ? static_cast<T*>(ctx.input(2).raw()) : nullptr;
      const int64_t* step = R == Rule::Adam ? ctx.input(slots + 4).data<int64_t>() : nullptr;
      WEFT_CUDA_CHECK(launch::sparseUpdate<R, T, I>(
          hyperOf(ctx.attrs()), static_cast<T*>(var.raw()), s1, s2, rows, width, ids.data<I>(), values.data<T>(),
          ids.numel(), ctx.input(slots + 3).data<T>(), step, workspace.raw(), errorSink(ctx), streamOf(ctx)));
    });
  });
}

}  // namespace

void applySGD(KernelContext& ctx) { denseOp<Rule::SGD>(ctx); }
void applyMomentum(KernelContext& ctx) { denseOp<Rule::Momentum>(ctx); }
void applyAdam(KernelContext& ctx) { denseOp<Rule::Adam>(ctx); }
void applyAdagrad(KernelContext& ctx) { denseOp<Rule::Adagrad>(ctx); }
void sparseApplySGD(KernelContext& ctx) { sparseOp<Rule::SGD>(ctx); }
void sparseApplyMomentum(KernelContext& ctx) { sparseOp<Rule::Momentum>(ctx); }
void sparseApplyAdam(KernelContext& ctx) { sparseOp<Rule::Adam>(ctx); }
void sparseApplyAdagrad(KernelContext& ctx) { sparseOp<Rule::Adagrad>(ctx); }

void assign(KernelContext& ctx) {
  const Tensor &var = ctx.input(0), &value = ctx.input(1);
  if (var.raw() == value.raw()) return;
  WEFT_CUDA_CHECK(launch::assignVariable(value.raw(), var.raw(), var.numel(), dtypeSize(var.dtype()), errorSink(ctx),
                                         streamOf(ctx)));
}

void assignAdd(KernelContext& ctx) {
  const Tensor& var = ctx.input(0);
  dispatchAll(var.dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::blendVariable<T>(ctx.input(1).data<T>(), static_cast<T*>(var.raw()), T(1), T(1),
                                             var.numel(), errorSink(ctx), streamOf(ctx)));
  });
}

// var = decay * var + (1 - decay) * value
void assignMovingAverage(KernelContext& ctx) {
  const Tensor& var = ctx.input(0);
  const double decay = ctx.attrs().getFloat("decay");
  dispatchFloating(var.dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::blendVariable<T>(ctx.input(1).data<T>(), static_cast<T*>(var.raw()), static_cast<T>(decay),
                                             static_cast<T>(1 - decay), var.numel(), errorSink(ctx), streamOf(ctx)));
  });
}

}  // namespace weft::cudaops
