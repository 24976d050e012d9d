// The CUDA kernels of the reductions (ops/Reduce.cpp) and of ReduceToLike (ops/Elementwise.cpp):
// each reduction becomes a plan of kept and reduced axes for ops/cuda/Reduce.cu.
#include "ops/cuda/Host.h"
#include "ops/cuda/Kernels.h"

#include <vector>

namespace weft::cudaops {
namespace {

ReducePlan reducePlan(const Shape& x, const std::vector<bool>& isReduced) {
  WEFT_CHECK(x.rank() <= kMaxRank, "CUDA reductions take tensors of rank up to {}, got shape {}", kMaxRank, x.str());
  std::vector<int64_t> strides(static_cast<size_t>(x.rank()), 1);
  for (int d = x.rank() - 2; d >= 0; --d)
    strides[static_cast<size_t>(d)] = strides[static_cast<size_t>(d) + 1] * x[d + 1];
  ReducePlan p;
  for (int d = 0; d < x.rank(); ++d) {
    const bool reduced = isReduced[static_cast<size_t>(d)];
    BroadcastMap& m = reduced ? p.reduced : p.kept;
    m.dims[m.rank] = x[d];
    m.strides[m.rank] = strides[static_cast<size_t>(d)];
    ++m.rank;
    (reduced ? p.count : p.outputs) *= x[d];
  }
  return p;
}

std::vector<bool> reducedAxes(const Shape& x, const std::vector<int64_t>& axes) {
  std::vector<bool> r(static_cast<size_t>(x.rank()), axes.empty());
  for (int64_t a : axes) r[static_cast<size_t>(x.axis(a))] = true;
  return r;
}

void reduceInto(const KernelContext& ctx, Reduction kind, const Tensor& x, Tensor& out,
                const std::vector<bool>& isReduced) {
  const ReducePlan plan = reducePlan(x.shape(), isReduced);
  if (plan.outputs == 0) return;
  dispatchAll(x.dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::reduce<T>(kind, x.data<T>(), out.data<T>(), plan, streamOf(ctx)));
  });
}

/// x reduced into out over the axes marked; 16-bit values are reduced in f32 and rounded once.
void reduceWidened(const KernelContext& ctx, Reduction kind, const Tensor& x, Tensor& out,
                   const std::vector<bool>& isReduced) {
  if (!isHalfPrecision(x.dtype())) return reduceInto(ctx, kind, x, out, isReduced);
  Tensor wide(f32, x.shape(), ctx.device), result(f32, out.shape(), ctx.device);  // freed in stream order
  castOnDevice(ctx, x, wide);
  reduceInto(ctx, kind, wide, result, isReduced);
  castOnDevice(ctx, result, out);
}

void reduceOp(KernelContext& ctx, Reduction kind) {
  const Tensor& x = ctx.input(0);
  reduceWidened(ctx, kind, x, ctx.output(0), reducedAxes(x.shape(), ctx.attrs().get<std::vector<int64_t>>("axes")));
}

}  // namespace

void sum(KernelContext& ctx) { reduceOp(ctx, Reduction::Sum); }
void mean(KernelContext& ctx) { reduceOp(ctx, Reduction::Mean); }
void max(KernelContext& ctx) { reduceOp(ctx, Reduction::Max); }

void argmax(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int axis = x.shape().axis(ctx.attrs().getInt("axis"));
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= x.shape()[i];
  for (int i = axis + 1; i < x.rank(); ++i) inner *= x.shape()[i];
  if (outer * inner == 0) return;
  dispatchAll(x.dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::argmax<T>(x.data<T>(), ctx.output(0).data<int64_t>(), outer, x.shape()[axis], inner,
                                      streamOf(ctx)));
  });
}

// Sums x over the axes on which `like` (the output's shape) was broadcast to reach x's shape;
// 16-bit values are summed in f32 and rounded once, as on the CPU.
void reduceToLike(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& out = ctx.output(0);
  if (x.numel() == out.numel()) {
    copyOnDevice(ctx, x, out);
    return;
  }
  const Shape &s = x.shape(), &like = out.shape();
  std::vector<bool> isReduced(static_cast<size_t>(s.rank()));
  for (int d = 0; d < s.rank(); ++d) {
    const int likeAxis = like.rank() - (s.rank() - d);
    isReduced[static_cast<size_t>(d)] = likeAxis < 0 || (like[likeAxis] == 1 && s[d] != 1);
  }
  reduceWidened(ctx, Reduction::Sum, x, out, isReduced);
}

// out (x's shape) = dy spread over the reduced axes, divided by their count when "mean" is set.
void broadcastReduced(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  Tensor& out = ctx.output(0);
  if (out.numel() == 0) return;
  const std::vector<bool> isReduced = reducedAxes(out.shape(), ctx.attrs().get<std::vector<int64_t>>("axes"));
  Shape kept = out.shape();
  int64_t count = 1;
  for (int d = 0; d < kept.rank(); ++d) {
    if (isReduced[static_cast<size_t>(d)]) {
      count *= kept[d];
      kept[d] = 1;
    }
  }
  const double scale = ctx.attrs().get<bool>("mean") && count > 0 ? 1.0 / static_cast<double>(count) : 1.0;
  const BroadcastMap m = broadcastMap(out.shape(), kept);
  dispatchAllOrHalf(dy.dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::spread<T>(dy.data<T>(), out.data<T>(), out.numel(), m, scale, streamOf(ctx)));
  });
}

}  // namespace weft::cudaops
