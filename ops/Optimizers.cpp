// Optimizer updates as ops. Each rule has a dense op (whole variable) and a sparse op (rows at
// ids; duplicate ids are summed first, so a sparse update equals the dense update of the summed
// gradient on the rows it touches). Inputs: the variable, its slots, the gradient, the learning
// rate (a scalar of the variable's dtype) and, for Adam, the step count before this update (i64
// scalar). Weight decay adds wd * w to the gradient (L2); Adam's "decoupled" applies it to the
// weights directly (AdamW). A dense update with attribute "shard_offset" updates one worker's
// shard of the variable (ZeRO, dist/Transform.h): its flattened elements from that offset, as
// many as the gradient, a vector like the slots, has.
#include "ops/OpUtil.h"
#include "ops/OptimizerRules.h"
#include "ops/RowIds.h"
#include "ops/cuda/Kernels.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace weft {
namespace {

using rules::Hyper;
using rules::Rule;
using rules::slotCount;

/// Rule R over n elements. The slots a rule does not use are null. Elements are read into locals
/// and the hyperparameters copied, so that the compiler knows nothing aliases and vectorises the
/// double arithmetic (the file is built with -fno-math-errno for sqrt).
template <Rule R, class T>
void applyLoop(Hyper h, T* __restrict w, T* __restrict s1, T* __restrict s2, const T* __restrict g, int64_t n) {
  constexpr int slots = slotCount(R);
  for (int64_t i = 0; i < n; ++i) {
    T wi = w[i], a = slots > 0 ? s1[i] : T(0), b = slots > 1 ? s2[i] : T(0);
    rules::apply<R, T>(h, wi, a, b, g[i]);
    w[i] = wi;
    if constexpr (slots > 0) s1[i] = a;
    if constexpr (slots > 1) s2[i] = b;
  }
}

template <class T>
void applyRule(Rule r, const Hyper& h, T* w, T* s1, T* s2, const T* g, int64_t n) {
  switch (r) {
    case Rule::SGD: applyLoop<Rule::SGD>(h, w, s1, s2, g, n); break;
    case Rule::Momentum: applyLoop<Rule::Momentum>(h, w, s1, s2, g, n); break;
    case Rule::Adam: applyLoop<Rule::Adam>(h, w, s1, s2, g, n); break;
    case Rule::Adagrad: applyLoop<Rule::Adagrad>(h, w, s1, s2, g, n); break;
  }
}

/// A sharded update's first element of the variable (it updates as many as its gradient has);
/// -1 for an update of the whole variable.
int64_t shardOffset(const Attrs& attrs) { return attrs.getInt("shard_offset", -1); }

/// Inputs after the variable and its slots: dense (grad, lr[, step]) or sparse (ids, values, lr[, step]).
Hyper hyper(const KernelContext& ctx, Rule r, int lrInput) {
  const Attrs& a = ctx.attrs();
  Hyper h{ctx.input(lrInput).item(), a.getFloat("weight_decay", 0), a.getFloat("momentum", 0), a.getFloat("beta1", 0),
          a.getFloat("beta2", 0), a.getFloat("epsilon", 0), 1, 1, a.get<bool>("nesterov", false),
          a.get<bool>("decoupled", false)};
  if (r == Rule::Adam) {
    const double t = ctx.input(lrInput + 1).item() + 1;
    h.biasCorrection1 = 1 - std::pow(h.beta1, t);
    h.biasCorrection2 = 1 - std::pow(h.beta2, t);
  }
  return h;
}

/// The whole variable, or under "shard_offset" its elements from there, as many as the
/// gradient has (one worker's shard under ZeRO: dist/Transform.h).
template <Rule rule>
void denseKernel(KernelContext& ctx) {
  const int slots = slotCount(rule);
  const Tensor& var = ctx.input(0);
  const Hyper h = hyper(ctx, rule, slots + 2);
  const int64_t offset = std::max<int64_t>(shardOffset(ctx.attrs()), 0);
  const int64_t count = ctx.input(slots + 1).numel();
  dispatchFloat(var.dtype(), [&](auto z) {
    using T = decltype(z);
    T* w = static_cast<T*>(var.raw()) + offset;
    T* s1 = slots > 0 ? static_cast<T*>(ctx.input(1).raw()) : nullptr;
    T* s2 = slots > 1 ? static_cast<T*>(ctx.input(2).raw()) : nullptr;
    const T* g = ctx.input(slots + 1).data<T>();
    ctx.parallelFor(count, 8, [&](int64_t lo, int64_t hi) {
      applyRule<T>(rule, h, w + lo, s1 ? s1 + lo : nullptr, s2 ? s2 + lo : nullptr, g + lo, hi - lo);
    });
  });
}

template <Rule rule>
void sparseKernel(KernelContext& ctx) {
  const int slots = slotCount(rule);
  const Tensor& var = ctx.input(0);
  const Tensor &idsT = ctx.input(slots + 1), &values = ctx.input(slots + 2);
  const Hyper h = hyper(ctx, rule, slots + 3);
  const int64_t rows = var.shape()[0], width = var.numel() / std::max<int64_t>(rows, 1);
  const std::vector<int64_t> ids = checkedRowIds(ctx, idsT, rows, "row id");
  // Sum duplicate rows so each touched row is updated once.
  const RowGroups groups = groupRowsById(ids);
  const std::vector<int64_t>& order = groups.order;
  dispatchFloat(var.dtype(), [&](auto z) {
    using T = decltype(z);
    T* w = static_cast<T*>(var.raw());
    T* s1 = slots > 0 ? static_cast<T*>(ctx.input(1).raw()) : nullptr;
    T* s2 = slots > 1 ? static_cast<T*>(ctx.input(2).raw()) : nullptr;
    const T* g = values.data<T>();
    ctx.parallelFor(groups.count(), width * 8, [&](int64_t lo, int64_t hi) {
      std::vector<T> sum(static_cast<size_t>(width));
      for (int64_t u = lo; u < hi; ++u) {
        const auto begin = static_cast<size_t>(groups.begin(u)), end = static_cast<size_t>(groups.end(u));
        const T* first = g + order[begin] * width;
        std::copy(first, first + width, sum.begin());
        for (size_t k = begin + 1; k < end; ++k) {
          const T* row = g + order[k] * width;
          for (int64_t j = 0; j < width; ++j) sum[static_cast<size_t>(j)] += row[j];
        }
        const int64_t off = ids[static_cast<size_t>(order[begin])] * width;
        applyRule<T>(rule, h, w + off, s1 ? s1 + off : nullptr, s2 ? s2 + off : nullptr, sum.data(), width);
      }
    });
  });
}

/// Checks a sharded dense update: slots and gradient are vectors of one shard's elements.
void checkShard(const InferContext& c, int slots, int64_t offset) {
  const Shape& g = c.shape(slots + 1);
  c.check(g.rank() == 1 && g.isFullyDefined(), "a sharded update takes its gradient as a vector, got {}", g.str());
  c.check(offset + g[0] <= c.shape(0).numel(), "shard [{}, {}) lies outside the variable of {} elements", offset,
          offset + g[0], c.shape(0).numel());
  for (int i = 1; i <= slots; ++i)
    c.check(c.shape(i) == g, "slot {} has shape {}, the shard of the gradient {}", i, c.shape(i).str(), g.str());
}

/// Checks the variable, its slots, the gradient and the scalars of an update op.
std::vector<TensorType> updateInfer(const InferContext& c, Rule rule, bool sparse) {
  const int slots = slotCount(rule);
  const Node& n = c.node;
  const int64_t offset = shardOffset(c.attrs());
  c.check(offset < 0 || !sparse, "a sparse update cannot be sharded");
  for (int i = 0; i <= slots; ++i) {
    c.check(n.inputs[static_cast<size_t>(i)].node()->op == "Variable", "input {} must be a variable", i);
    detail::requireSameDType(c, 0, i);
    c.check(offset >= 0 || c.shape(i) == c.shape(0), "slot {} has shape {}, the variable {}", i, c.shape(i).str(),
            c.shape(0).str());
  }
  detail::requireFloat(c, 0);
  int next = slots + 1;
  if (offset >= 0) {
    checkShard(c, slots, offset);
    detail::requireSameDType(c, 0, next);
    next += 1;
  } else if (sparse) {
    c.check(isInteger(c.dtype(next)) && c.shape(next).rank() == 1, "row ids must be an integer vector");
    const Shape& v = c.shape(next + 1);
    detail::requireSameDType(c, 0, next + 1);
    c.check(v.rank() == c.shape(0).rank() && c.shape(0).rank() >= 1, "values of shape {} for a variable of shape {}",
            v.str(), c.shape(0).str());
    for (int d = 1; d < v.rank(); ++d)
      c.check(v[d] < 0 || v[d] == c.shape(0)[d], "value rows {} do not match variable {}", v.str(), c.shape(0).str());
    c.check(v[0] < 0 || c.shape(next)[0] < 0 || v[0] == c.shape(next)[0], "{} rows for {} ids", v[0], c.shape(next)[0]);
    next += 2;
  } else {
    detail::requireSameDType(c, 0, next);
    c.check(c.shape(next).compatibleWith(c.shape(0)), "gradient shape {} differs from variable shape {}",
            c.shape(next).str(), c.shape(0).str());
    next += 1;
  }
  detail::requireSameDType(c, 0, next);
  c.check(c.shape(next).rank() == 0, "the learning rate must be a scalar");
  if (rule == Rule::Adam)
    c.check(c.dtype(next + 1) == i64 && c.shape(next + 1).rank() == 0, "the step must be an i64 scalar");
  return {};
}

template <Rule rule>
void registerRule(OpRegistry& r, const std::string& name, Kernel cudaDense, Kernel cudaSparse) {
  const int slots = slotCount(rule);
  std::vector<int> written;
  for (int i = 0; i <= slots; ++i) written.push_back(i);
  const int scalars = rule == Rule::Adam ? 2 : 1;
  r.add(OpDef("Apply" + name)
            .inputs(slots + 2 + scalars)
            .infer([](const InferContext& c) { return updateInfer(c, rule, false); })
            .cpu(denseKernel<rule>)
            .cuda(cudaDense)
            .mutates(written)
            .noGradient());
  r.add(OpDef("SparseApply" + name)
            .inputs(slots + 3 + scalars)
            .infer([](const InferContext& c) { return updateInfer(c, rule, true); })
            .cpu(sparseKernel<rule>)
            .cuda(cudaSparse)
            .mutates(written)
            .noGradient());
}

}  // namespace

void detail::registerOptimizerOps(OpRegistry& r) {
  registerRule<Rule::SGD>(r, "SGD", WEFT_CUDA_KERNEL(applySGD),
                           WEFT_CUDA_KERNEL(sparseApplySGD));
  registerRule<Rule::Momentum>(r, "Momentum", WEFT_CUDA_KERNEL(applyMomentum),
                           WEFT_CUDA_KERNEL(sparseApplyMomentum));
  registerRule<Rule::Adam>(r, "Adam", WEFT_CUDA_KERNEL(applyAdam),
                           WEFT_CUDA_KERNEL(sparseApplyAdam));
  registerRule<Rule::Adagrad>(r, "Adagrad", WEFT_CUDA_KERNEL(applyAdagrad),
                           WEFT_CUDA_KERNEL(sparseApplyAdagrad));
}

}  // namespace weft
