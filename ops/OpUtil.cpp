#include "ops/OpUtil.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <mutex>

namespace weft {

void registerAllOps() {
  static std::once_flag once;
  std::call_once(once, [] {
    OpRegistry& r = OpRegistry::global();
    detail::registerElementwiseOps(r);
    detail::registerMatMulOps(r);
    detail::registerReduceOps(r);
    detail::registerShapeOps(r);
    detail::registerSoftmaxOps(r);
    detail::registerEmbeddingOps(r);
    detail::registerConvOps(r);
    detail::registerNormOps(r);
    detail::registerRandomOps(r);
    detail::registerRnnOps(r);
    detail::registerClipOps(r);
    detail::registerStateOps(r);
    detail::registerOptimizerOps(r);
  });
}

namespace detail {

Node* addOp(Graph& g, const std::string& op, std::vector<Output> inputs, Attrs attrs,
            const std::string& name) {
  registerAllOps();
  return g.addNode(op, std::move(inputs), std::move(attrs), name);
}

bool broadcastShapes(const Shape& a, const Shape& b, Shape& out) {
  const int r = std::max(a.rank(), b.rank());
  std::vector<int64_t> dims(static_cast<size_t>(r));
  for (int i = 0; i < r; ++i) {
    const int ia = a.rank() - r + i, ib = b.rank() - r + i;
    const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    int64_t d;
    if (da == 1) d = db;
    else if (db == 1) d = da;
    else if (da < 0) d = db;
    else if (db < 0) d = da;
    else if (da == db) d = da;
    else return false;
    dims[static_cast<size_t>(i)] = d;
  }
  out = Shape(std::move(dims));
  return true;
}

std::vector<TensorType> sameAsInput(const InferContext& c) { return {c.inputs[0]}; }

Output inComputePrecision(std::vector<Output> inputs, const std::function<Output(const std::vector<Output>&)>& build) {
  const Graph::ComputePrecision p = inputs[0].graph().computePrecision();
  const bool allF32 = std::all_of(inputs.begin(), inputs.end(), [](const Output& x) { return x.dtype() == f32; });
  if (p.dtype == f32 || p.ops != Graph::MixedOps::CastOperands || !allF32) return build(inputs);
  const DType low = p.dtype;
  for (Output& x : inputs) x = cast(x, low);
  return cast(build(inputs), f32);
}

DType productRounding(const std::vector<Output>& inputs) {
  const Graph::ComputePrecision p = inputs[0].graph().computePrecision();
  const bool allF32 = std::all_of(inputs.begin(), inputs.end(), [](const Output& x) { return x.dtype() == f32; });
  return p.ops == Graph::MixedOps::RoundInProducts && allF32 ? p.dtype : f32;
}

DType productRounding(const Attrs& attrs) { return attrs.get<DType>("round_operands_to", f32); }

void checkProductRounding(const InferContext& c) {
  if (!c.attrs().has("round_operands_to")) return;
  const DType low = c.attrs().get<DType>("round_operands_to");
  c.check(low == bf16 || low == f16, "round_operands_to is bf16 or f16, not {}", dtypeName(low));
  c.check(c.dtype(0) == f32, "rounds f32 operands to {}, not {}", dtypeName(low), dtypeName(c.dtype(0)));
}

void copyElements(const KernelContext& ctx, const Tensor& from, Tensor& to) {
  if (from.raw() == to.raw() || to.device().type != DeviceType::CPU || from.device().type != DeviceType::CPU ||
      from.dtype() != to.dtype() || from.numel() != to.numel()) {
    to.copyFrom(from);  // copies across devices, or fails with the mismatch
    return;
  }
  constexpr int64_t kBlock = 64 * 1024;  // bytes
  const auto* src = static_cast<const std::byte*>(from.raw());
  auto* dst = static_cast<std::byte*>(to.raw());
  const int64_t bytes = static_cast<int64_t>(to.bytes());
  // About 16 bytes a nanosecond.
  ctx.parallelFor((bytes + kBlock - 1) / kBlock, kBlock / 16, [&](int64_t lo, int64_t hi) {
    std::memcpy(dst + lo * kBlock, src + lo * kBlock, static_cast<size_t>(std::min(bytes, hi * kBlock) - lo * kBlock));
  });
}

void copyKernel(KernelContext& ctx) { copyElements(ctx, ctx.input(0), ctx.output(0)); }

void castElements(const KernelContext& ctx, const Tensor& from, Tensor& to) {
  WEFT_CHECK(from.numel() == to.numel(), "castElements: {} elements into {}", from.numel(), to.numel());
  dispatchStorage(from.dtype(), [&](auto zs) {
    using S = decltype(zs);
    dispatchStorage(to.dtype(), [&](auto zd) {
      using D = decltype(zd);
      const S* src = static_cast<const S*>(from.raw());
      D* dst = static_cast<D*>(to.raw());
      ctx.parallelFor(from.numel(), 1, [&](int64_t lo, int64_t hi) {
        if constexpr (std::is_same_v<S, float> && std::is_same_v<D, Float16>) {
          floatsToFloat16(src + lo, dst + lo, hi - lo);
        } else if constexpr (std::is_same_v<S, Float16> && std::is_same_v<D, float>) {
          float16ToFloats(src + lo, dst + lo, hi - lo);
        } else {
          for (int64_t i = lo; i < hi; ++i) dst[i] = convertElement<D>(src[i]);
        }
      });
    });
  });
}

void runInFloat32(KernelContext& ctx, Kernel kernel) {
  auto isHalfTensor = [](const Tensor* t) { return isHalfPrecision(t->dtype()); };
  if (std::none_of(ctx.inputs.begin(), ctx.inputs.end(), isHalfTensor) &&
      std::none_of(ctx.outputs.begin(), ctx.outputs.end(), isHalfTensor)) {
    return kernel(ctx);
  }
  KernelContext wide = ctx;
  std::vector<Tensor> inputs(ctx.inputs.size()), outputs(ctx.outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = *ctx.inputs[i];
    if (!isHalfPrecision(x.dtype())) continue;
    inputs[i] = Tensor(f32, x.shape());
    castElements(ctx, x, inputs[i]);
    wide.inputs[i] = &inputs[i];
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!isHalfPrecision(ctx.outputs[i]->dtype())) continue;
    outputs[i] = Tensor(f32, ctx.outputs[i]->shape());
    wide.outputs[i] = &outputs[i];
  }
  kernel(wide);
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (isHalfPrecision(ctx.outputs[i]->dtype())) castElements(ctx, outputs[i], *ctx.outputs[i]);
  }
}

void requireFloat(const InferContext& c, int i) {
  c.check(isFloating(c.dtype(i)), "input {} must be floating point, got {}", i, dtypeName(c.dtype(i)));
}

void requireSameDType(const InferContext& c, int i, int j) {
  c.check(c.dtype(i) == c.dtype(j), "inputs {} and {} must have the same dtype, got {} and {}", i, j,
          dtypeName(c.dtype(i)), dtypeName(c.dtype(j)));
}

std::vector<int> normaliseAxes(const InferContext& c, const std::vector<int64_t>& axes, int rank) {
  std::vector<int> out;
  if (axes.empty()) {
    for (int i = 0; i < rank; ++i) out.push_back(i);
    return out;
  }
  for (int64_t a : axes) {
    c.check(a >= -rank && a < rank, "axis {} is out of range for rank {}", a, rank);
    out.push_back(static_cast<int>(a < 0 ? a + rank : a));
  }
  std::sort(out.begin(), out.end());
  c.check(std::adjacent_find(out.begin(), out.end()) == out.end(), "repeated axis in reduction");
  return out;
}

}  // namespace detail
}  // namespace weft
