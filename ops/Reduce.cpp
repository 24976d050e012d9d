// Reductions over axes (Sum, Mean, Max), ArgMax, and BroadcastReduced, the adjoint that spreads a
// reduced gradient back over the reduced axes.
#include "ops/OpUtil.h"
#include "ops/cuda/Kernels.h"

#include "ops/Broadcast.h"

#include <limits>

namespace weft {
namespace {

std::vector<int64_t> axesAttr(const Attrs& a) { return a.get<std::vector<int64_t>>("axes"); }

/// x's shape with reduced axes set to 1.
Shape keptShape(const Shape& x, const std::vector<int>& axes) {
  Shape s = x;
  for (int a : axes) s[a] = 1;
  return s;
}

std::vector<int> resolvedAxes(const Shape& x, const std::vector<int64_t>& axes) {
  std::vector<int> out;
  if (axes.empty()) {
    for (int i = 0; i < x.rank(); ++i) out.push_back(i);
  } else {
    for (int64_t a : axes) out.push_back(x.axis(a));
  }
  return out;
}

std::vector<TensorType> reduceInfer(const InferContext& c) {
  const Shape& x = c.shape(0);
  const std::vector<int> axes = detail::normaliseAxes(c, axesAttr(c.attrs()), x.rank());
  const bool keep = c.attrs().get<bool>("keepdims");
  std::vector<int64_t> out;
  for (int i = 0; i < x.rank(); ++i) {
    const bool reduced = std::find(axes.begin(), axes.end(), i) != axes.end();
    if (!reduced) out.push_back(x[i]);
    else if (keep) out.push_back(1);
  }
  if (c.node.op == "Mean") detail::requireFloat(c, 0);
  if (c.node.op == "Max") {
    for (int a : axes) c.check(x[a] != 0, "max over an empty axis {}", a);
  }
  return {{c.dtype(0), Shape(std::move(out))}};
}

enum class Reduction { Sum, Mean, Max };

/// Reduces x over `axes` into out, with three layouts: a contiguous suffix of axes (rows), a
/// contiguous prefix (columns), or the general case (strided walk).
template <class T>
void reduce(const KernelContext& ctx, const Tensor& x, Tensor& out, const std::vector<int>& axes, Reduction kind) {
  const T* px = x.data<T>();
  T* po = out.data<T>();
  const Shape& s = x.shape();
  int64_t reducedCount = 1;
  for (int a : axes) reducedCount *= s[a];
  const T lowest = std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                        : std::numeric_limits<T>::lowest();
  const T init = kind == Reduction::Max ? lowest : T(0);
  // Max propagates NaN (v != v), as numpy and PyTorch do.
  auto combine = [kind](T acc, T v) { return kind == Reduction::Max ? (v > acc || v != v ? v : acc) : acc + v; };
  const int64_t outN = out.numel();

  bool suffix = true, prefix = true;
  for (size_t i = 0; i < axes.size(); ++i) {
    suffix = suffix && axes[i] == s.rank() - static_cast<int>(axes.size()) + static_cast<int>(i);
    prefix = prefix && axes[i] == static_cast<int>(i);
  }
  if (suffix) {
    ctx.parallelFor(outN, reducedCount, [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) {
        T acc = init;
        const T* row = px + o * reducedCount;
        for (int64_t j = 0; j < reducedCount; ++j) acc = combine(acc, row[j]);
        po[o] = acc;
      }
    });
  } else if (prefix) {
    ctx.parallelFor(outN, reducedCount, [&](int64_t lo, int64_t hi) {
      for (int64_t j = lo; j < hi; ++j) po[j] = init;
      for (int64_t r = 0; r < reducedCount; ++r) {
        const T* row = px + r * outN;
        for (int64_t j = lo; j < hi; ++j) po[j] = combine(po[j], row[j]);
      }
    });
  } else {
    std::fill(po, po + outN, init);
    const detail::Broadcaster b(s, keptShape(s, axes));
    const int64_t inner = b.inner(), stride = b.innerStride();
    for (int64_t r = 0; r < b.rows(); ++r) {
      T* o = po + b.rowOffset(r);
      const T* row = px + r * inner;
      for (int64_t j = 0; j < inner; ++j) o[j * stride] = combine(o[j * stride], row[j]);
    }
  }
  if (kind == Reduction::Mean && reducedCount > 0) {
    const T scale = T(1) / static_cast<T>(reducedCount);
    for (int64_t o = 0; o < outN; ++o) po[o] *= scale;
  }
}

template <Reduction kind>
void reduceKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const std::vector<int> axes = resolvedAxes(x.shape(), axesAttr(ctx.attrs()));
  dispatchDType(x.dtype(), [&](auto z) { reduce<decltype(z)>(ctx, x, ctx.output(0), axes, kind); });
}

// out (x's shape) = dy spread over the reduced axes, divided by their count when "mean" is set.
void broadcastReducedKernel(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  Tensor& out = ctx.output(0);
  const std::vector<int> axes = resolvedAxes(out.shape(), axesAttr(ctx.attrs()));
  const Shape kept = keptShape(out.shape(), axes);
  int64_t count = 1;
  for (int a : axes) count *= out.shape()[a];
  const double scale = ctx.attrs().get<bool>("mean") && count > 0 ? 1.0 / static_cast<double>(count) : 1.0;
  dispatchDType(dy.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* pd = dy.data<T>();
    T* po = out.data<T>();
    const detail::Broadcaster b(out.shape(), kept);
    const int64_t inner = b.inner(), stride = b.innerStride();
    const T k = static_cast<T>(scale);
    ctx.parallelFor(b.rows(), inner, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* src = pd + b.rowOffset(r);
        for (int64_t j = 0; j < inner; ++j) po[r * inner + j] = src[j * stride] * k;
      }
    });
  });
}

void argmaxKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int axis = x.shape().axis(ctx.attrs().getInt("axis"));
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= x.shape()[i];
  for (int i = axis + 1; i < x.rank(); ++i) inner *= x.shape()[i];
  const int64_t n = x.shape()[axis];
  int64_t* po = ctx.output(0).data<int64_t>();
  dispatchDType(x.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* px = x.data<T>();
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t j = 0; j < inner; ++j) {
        int64_t best = 0;
        for (int64_t i = 1; i < n; ++i) {
          if (px[(o * n + i) * inner + j] > px[(o * n + best) * inner + j]) best = i;
        }
        po[o * inner + j] = best;
      }
    }
  });
}

Output broadcastReduced(Output dy, Output x, const std::vector<int64_t>& axes, bool meanScale) {
  return detail::addOp1(x.graph(), "BroadcastReduced", {dy, x}, {{"axes", axes}, {"mean", meanScale}});
}

Output addReduce(const char* op, Output x, std::vector<int64_t> axes, bool keepDims) {
  return detail::addOp1(x.graph(), op, {x}, {{"axes", std::move(axes)}, {"keepdims", keepDims}});
}

}  // namespace

Output sum(Output x, std::vector<int64_t> axes, bool keepDims) {
  return addReduce("Sum", x, std::move(axes), keepDims);
}
Output mean(Output x, std::vector<int64_t> axes, bool keepDims) {
  return addReduce("Mean", x, std::move(axes), keepDims);
}
Output max(Output x, std::vector<int64_t> axes, bool keepDims) {
  return addReduce("Max", x, std::move(axes), keepDims);
}
Output argmax(Output x, int64_t axis) { return detail::addOp1(x.graph(), "ArgMax", {x}, {{"axis", axis}}); }

void detail::registerReduceOps(OpRegistry& r) {
  r.add(OpDef("Sum").inputs(1).infer(reduceInfer).cpu(reduceKernel<Reduction::Sum>).cuda(WEFT_CUDA_KERNEL(sum))
            .grad([](GradContext& c) -> std::vector<Grad> {
              return {broadcastReduced(c.dy(), c.x(0), axesAttr(c.attrs()), false)};
            }));
  // Mean and its gradient take 16-bit activations (a global average pool between a network's
  // last activation and its classifier's product), computing in f32.
  r.add(OpDef("Mean")
            .inputs(1)
            .infer(reduceInfer)
            .cpu(detail::inFloat32<reduceKernel<Reduction::Mean>>)
            .cuda(WEFT_CUDA_KERNEL(mean))
            .grad([](GradContext& c) -> std::vector<Grad> {
              return {broadcastReduced(c.dy(), c.x(0), axesAttr(c.attrs()), true)};
            })
            .halfActivations({0}, {0}));
  // The gradient is shared equally among the elements equal to the maximum.
  r.add(OpDef("Max").inputs(1).infer(reduceInfer).cpu(reduceKernel<Reduction::Max>).cuda(WEFT_CUDA_KERNEL(max))
            .grad([](GradContext& c) -> std::vector<Grad> {
              const auto axes = axesAttr(c.attrs());
              Output isMax = equal(c.x(0), broadcastReduced(c.y(), c.x(0), axes, false));
              Output count = sum(isMax, axes, c.attrs().get<bool>("keepdims"));
              return {isMax * broadcastReduced(c.dy() / count, c.x(0), axes, false)};
            }));
  r.add(OpDef("ArgMax")
            .inputs(1)
            .infer([](const InferContext& c) -> std::vector<TensorType> {
              const Shape& x = c.shape(0);
              const int64_t a = c.attrs().getInt("axis");
              c.check(a >= -x.rank() && a < x.rank(), "axis {} is out of range for rank {}", a, x.rank());
              const int axis = static_cast<int>(a < 0 ? a + x.rank() : a);
              c.check(x[axis] != 0, "argmax over an empty axis");
              std::vector<int64_t> out = x.dims();
              out.erase(out.begin() + axis);
              return {{i64, Shape(std::move(out))}};
            })
            .cpu(argmaxKernel).cuda(WEFT_CUDA_KERNEL(argmax))
            .noGradient());
  r.add(OpDef("BroadcastReduced")
            .inputs(2)
            .infer([](const InferContext& c) -> std::vector<TensorType> {
              detail::requireSameDType(c, 0, 1);
              const std::vector<int> axes = detail::normaliseAxes(c, axesAttr(c.attrs()), c.shape(1).rank());
              c.check(c.shape(0).numel() < 0 || c.shape(1).numel() < 0 ||
                          keptShape(c.shape(1), axes).numel() == c.shape(0).numel(),
                      "gradient of shape {} does not match a reduction of {}", c.shape(0).str(), c.shape(1).str());
              return {c.inputs[1]};
            })
            .cpu(detail::inFloat32<broadcastReducedKernel>).cuda(WEFT_CUDA_KERNEL(broadcastReduced))
            .grad([](GradContext& c) -> std::vector<Grad> {
              const auto axes = axesAttr(c.attrs());
              Output g = c.attrs().get<bool>("mean") ? mean(c.dy(), axes, false) : sum(c.dy(), axes, false);
              return {reshape(g, c.x(0).shape().dims()), Grad()};
            })
            .halfActivations({0, 1}, {0}));
}

}  // namespace weft
