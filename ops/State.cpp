// Variable updates as ops: Assign, AssignAdd, AssignMovingAverage. They have no outputs; the
// executor runs them after every other reader of the variable in the same step.
#include "ops/OpUtil.h"
#include "ops/cuda/Kernels.h"

namespace weft {
namespace {

std::vector<TensorType> updateInfer(const InferContext& c) {
  c.check(c.node.inputs[0].node()->op == "Variable", "input 0 must be a variable, got {}",
          c.node.inputs[0].node()->describe());
  detail::requireSameDType(c, 0, 1);
  c.check(c.shape(0).compatibleWith(c.shape(1)), "value shape {} does not match variable shape {}",
          c.shape(1).str(), c.shape(0).str());
  return {};
}

void assignKernel(KernelContext& ctx) {
  Tensor var = ctx.input(0);
  var.copyFrom(ctx.input(1));
}

void assignAddKernel(KernelContext& ctx) {
  const Tensor& var = ctx.input(0);
  dispatchDType(var.dtype(), [&](auto z) {
    using T = decltype(z);
    T* v = static_cast<T*>(var.raw());
    const T* d = ctx.input(1).data<T>();
    for (int64_t i = 0, n = var.numel(); i < n; ++i) v[i] += d[i];
  });
}

// var = decay * var + (1 - decay) * value
void movingAverageKernel(KernelContext& ctx) {
  const Tensor& var = ctx.input(0);
  const double decay = ctx.attrs().getFloat("decay");
  dispatchFloat(var.dtype(), [&](auto z) {
    using T = decltype(z);
    T* v = static_cast<T*>(var.raw());
    const T* x = ctx.input(1).data<T>();
    const T a = static_cast<T>(decay), b = static_cast<T>(1 - decay);
    for (int64_t i = 0, n = var.numel(); i < n; ++i) v[i] = a * v[i] + b * x[i];
  });
}

}  // namespace

Node* assign(Output variable, Output value) {
  return detail::addOp(variable.graph(), "Assign", {variable, value});
}
Node* assignAdd(Output variable, Output value) {
  return detail::addOp(variable.graph(), "AssignAdd", {variable, value});
}
Node* assignMovingAverage(Output variable, Output value, double decay) {
  return detail::addOp(variable.graph(), "AssignMovingAverage", {variable, value}, {{"decay", decay}});
}

void detail::registerStateOps(OpRegistry& r) {
  r.add(OpDef("Assign")
            .inputs(2)
            .infer(updateInfer)
            .cpu(assignKernel)
            .cuda(WEFT_CUDA_KERNEL(assign))
            .mutates({0})
            .noGradient());
  r.add(OpDef("AssignAdd")
            .inputs(2)
            .infer(updateInfer)
            .cpu(assignAddKernel)
            .cuda(WEFT_CUDA_KERNEL(assignAdd))
            .mutates({0})
            .noGradient());
  r.add(OpDef("AssignMovingAverage")
            .inputs(2)
            .infer(updateInfer)
            .cpu(movingAverageKernel)
            .cuda(WEFT_CUDA_KERNEL(assignMovingAverage))
            .mutates({0})
            .noGradient());
}

}  // namespace weft
