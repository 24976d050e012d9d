// Softmax, log-softmax and the softmax cross-entropy losses, all over the last axis. The losses
// are fused ops whose second output keeps the softmax probabilities, so their backward ops
// (SoftmaxXentGrad, SparseSoftmaxXentGrad) need no recomputation.
#include "ops/OpUtil.h"
#include "ops/cuda/Kernels.h"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace weft {
namespace {

using detail::addOp1;

template <class T>
using ArrayMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
using ConstArrayMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// Rough nanoseconds per element of a softmax row (one exp dominates).
constexpr int64_t kCostPerElement = 10;

/// A tensor seen as a matrix of rows over its last axis.
struct Rows {
  int64_t count, width;
};

Rows rowsOf(const Shape& s) {
  Rows r{1, s[s.rank() - 1]};
  for (int i = 0; i < s.rank() - 1; ++i) r.count *= s[i];
  return r;
}

/// All but the last dimension.
Shape batchShape(const Shape& s) {
  return Shape(std::vector<int64_t>(s.dims().begin(), s.dims().end() - 1));
}

// ---- shape functions -----------------------------------------------------------------------

std::vector<TensorType> softmaxInfer(const InferContext& c) {
  detail::requireFloat(c, 0);
  c.check(c.shape(0).rank() >= 1, "logits must have rank >= 1, got a scalar");
  return {c.inputs[0]};
}

// logits (..., C), labels (..., C) -> loss (...), probs (..., C)
std::vector<TensorType> xentInfer(const InferContext& c) {
  softmaxInfer(c);
  detail::requireSameDType(c, 0, 1);
  const Shape& logits = c.shape(0);
  c.check(c.shape(1).compatibleWith(logits), "labels of shape {} do not match logits of shape {}",
          c.shape(1).str(), logits.str());
  c.check(logits[logits.rank() - 1] != 0, "logits have no classes (last dimension 0)");
  return {{c.dtype(0), batchShape(logits)}, c.inputs[0]};
}

// logits (N, C), ids (N) -> loss (N), probs (N, C)
std::vector<TensorType> sparseXentInfer(const InferContext& c) {
  detail::requireFloat(c, 0);
  const Shape &logits = c.shape(0), &ids = c.shape(1);
  c.check(logits.rank() == 2, "logits must be (N, C), got rank {}", logits.rank());
  c.check(c.dtype(1) == i32 || c.dtype(1) == i64, "ids must be i32 or i64, got {}", dtypeName(c.dtype(1)));
  c.check(ids.rank() == 1, "ids must be (N), got rank {}", ids.rank());
  c.check(ids[0] < 0 || logits[0] < 0 || ids[0] == logits[0], "{} ids for {} rows of logits", ids[0], logits[0]);
  c.check(logits[1] != 0, "logits have no classes (C = 0)");
  return {{c.dtype(0), Shape{logits[0]}}, c.inputs[0]};
}

// probs (..., C), labels or ids, dy (...) -> dlogits (..., C)
std::vector<TensorType> xentGradInfer(const InferContext& c) {
  detail::requireFloat(c, 0);
  detail::requireSameDType(c, 0, 2);
  c.check(c.shape(2).compatibleWith(batchShape(c.shape(0))), "gradient of shape {} does not match probs {}",
          c.shape(2).str(), c.shape(0).str());
  return {c.inputs[0]};
}

// ---- kernels -------------------------------------------------------------------------------

/// Calls f(r) for every row r, split across the pool.
template <class F>
void forEachRow(const KernelContext& ctx, Rows rows, F f) {
  if (rows.width == 0) return;
  ctx.parallelFor(rows.count, kCostPerElement * rows.width, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) f(r);
  });
}

// y = exp(x - m) / sum(exp(x - m)) or, for log-softmax, y = x - m - log sum(exp(x - m)),
// with m the row maximum so that no exp overflows. Safe in place: each row reads x before
// writing y.
template <bool kLog>
void softmaxKernel(KernelContext& ctx) {
  const Rows rows = rowsOf(ctx.input(0).shape());
  dispatchFloat(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    const T* px = ctx.input(0).data<T>();
    T* py = ctx.output(0).data<T>();
    forEachRow(ctx, rows, [&](int64_t r) {
      ConstArrayMap<T> x(px + r * rows.width, rows.width);
      ArrayMap<T> y(py + r * rows.width, rows.width);
      const T m = x.maxCoeff();
      if constexpr (kLog) {
        const T logSum = std::log((x - m).exp().sum());
        y = x - (m + logSum);
      } else {
        y = (x - m).exp();
        y /= y.sum();
      }
    });
  });
}

/// Writes the softmax of row x into p and returns log sum(exp(x - m)) with m = max(x).
template <class T>
T softmaxRow(const ConstArrayMap<T>& x, ArrayMap<T>& p, T& m) {
  m = x.maxCoeff();
  p = (x - m).exp();
  const T s = p.sum();
  p /= s;
  return std::log(s);
}

// loss = -sum(labels * log softmax(x)), log softmax(x) = x - m - log sum(exp(x - m))
void softmaxXentKernel(KernelContext& ctx) {
  const Rows rows = rowsOf(ctx.input(0).shape());
  dispatchFloat(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    const T* px = ctx.input(0).data<T>();
    const T* pl = ctx.input(1).data<T>();
    T* loss = ctx.output(0).data<T>();
    T* pp = ctx.output(1).data<T>();
    forEachRow(ctx, rows, [&](int64_t r) {
      ConstArrayMap<T> x(px + r * rows.width, rows.width), labels(pl + r * rows.width, rows.width);
      ArrayMap<T> p(pp + r * rows.width, rows.width);
      T m;
      const T logSum = softmaxRow(x, p, m);
      loss[r] = -(labels * (x - (m + logSum))).sum();
    });
  });
}

/// Fails on the first id that is neither ignoreIndex nor in [0, classes).
template <class I>
void checkIds(const KernelContext& ctx, const I* ids, int64_t n, int64_t classes, int64_t ignoreIndex) {
  for (int64_t i = 0; i < n; ++i) {
    const auto id = static_cast<int64_t>(ids[i]);
    if (id != ignoreIndex && (id < 0 || id >= classes)) {
      ctx.fail("label id {} at position {} is outside [0, {}) (ignore index {})", id, i, classes, ignoreIndex);
    }
  }
}

// loss = log sum(exp(x - m)) - (x[id] - m); 0 for ignored rows
void sparseSoftmaxXentKernel(KernelContext& ctx) {
  const Rows rows = rowsOf(ctx.input(0).shape());
  const int64_t ignoreIndex = ctx.attrs().getInt("ignore_index");
  dispatchFloat(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    dispatchIndex(ctx.input(1).dtype(), [&](auto zi) {
      using I = decltype(zi);
      const I* ids = ctx.input(1).data<I>();
      checkIds(ctx, ids, rows.count, rows.width, ignoreIndex);
      const T* px = ctx.input(0).data<T>();
      T* loss = ctx.output(0).data<T>();
      T* pp = ctx.output(1).data<T>();
      forEachRow(ctx, rows, [&](int64_t r) {
        ConstArrayMap<T> x(px + r * rows.width, rows.width);
        ArrayMap<T> p(pp + r * rows.width, rows.width);
        T m;
        const T logSum = softmaxRow(x, p, m);
        const auto id = static_cast<int64_t>(ids[r]);
        loss[r] = id == ignoreIndex ? T(0) : logSum - (x[id] - m);
      });
    });
  });
}

// dlogits = dy * (probs * sum(labels) - labels); labels need not sum to 1.
void softmaxXentGradKernel(KernelContext& ctx) {
  const Rows rows = rowsOf(ctx.input(0).shape());
  dispatchFloat(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    const T* pp = ctx.input(0).data<T>();
    const T* pl = ctx.input(1).data<T>();
    const T* dy = ctx.input(2).data<T>();
    T* pd = ctx.output(0).data<T>();
    forEachRow(ctx, rows, [&](int64_t r) {
      ConstArrayMap<T> p(pp + r * rows.width, rows.width), labels(pl + r * rows.width, rows.width);
      ArrayMap<T> d(pd + r * rows.width, rows.width);
      d = dy[r] * (p * labels.sum() - labels);
    });
  });
}

// dlogits = dy * (probs - onehot(id)); 0 for ignored rows
void sparseSoftmaxXentGradKernel(KernelContext& ctx) {
  const Rows rows = rowsOf(ctx.input(0).shape());
  const int64_t ignoreIndex = ctx.attrs().getInt("ignore_index");
  dispatchFloat(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    dispatchIndex(ctx.input(1).dtype(), [&](auto zi) {
      using I = decltype(zi);
      const I* ids = ctx.input(1).data<I>();
      checkIds(ctx, ids, rows.count, rows.width, ignoreIndex);
      const T* pp = ctx.input(0).data<T>();
      const T* dy = ctx.input(2).data<T>();
      T* pd = ctx.output(0).data<T>();
      forEachRow(ctx, rows, [&](int64_t r) {
        ArrayMap<T> d(pd + r * rows.width, rows.width);
        const auto id = static_cast<int64_t>(ids[r]);
        if (id == ignoreIndex) {
          d.setZero();
          return;
        }
        d = dy[r] * ConstArrayMap<T>(pp + r * rows.width, rows.width);
        d[id] -= dy[r];
      });
    });
  });
}

// ---- gradients -----------------------------------------------------------------------------

// dx = y * (dy - sum(dy * y, last))
std::vector<Grad> softmaxGrad(GradContext& c) {
  Output y = c.y();
  return {y * (c.dy() - sum(c.dy() * y, {-1}, true))};
}

// y = x - logsumexp(x): dx = dy - softmax(x) * sum(dy, last), softmax(x) = exp(y)
std::vector<Grad> logSoftmaxGrad(GradContext& c) {
  return {c.dy() - exp(c.y()) * sum(c.dy(), {-1}, true)};
}

// Only the loss (output 0) is differentiable; the probabilities are an internal by-product.
// dlabels = -dy * log softmax(logits)
std::vector<Grad> softmaxXentGrad(GradContext& c) {
  if (!c.dy().valid()) return {Grad(), Grad()};
  Output dLogits = addOp1(c.graph(), "SoftmaxXentGrad", {c.y(1), c.x(1), c.dy()});
  Output dLabels = -(expandDims(c.dy(), c.dy().rank()) * logSoftmax(c.x(0)));
  return {dLogits, dLabels};
}

std::vector<Grad> sparseSoftmaxXentGrad(GradContext& c) {
  if (!c.dy().valid()) return {Grad(), Grad()};
  return {addOp1(c.graph(), "SparseSoftmaxXentGrad", {c.y(1), c.x(1), c.dy()},
                 {{"ignore_index", c.attrs().getInt("ignore_index")}}),
          Grad()};
}

// ---- matches penalized ---------------------------------------------------------------------

// logits (N, C), rowIds (N), columnIds (C) -> logits
std::vector<TensorType> penalizeMatchesInfer(const InferContext& c) {
  detail::requireFloat(c, 0);
  c.check(c.dtype(1) == i32 || c.dtype(1) == i64, "ids must be i32 or i64, got {}", dtypeName(c.dtype(1)));
  detail::requireSameDType(c, 1, 2);
  const Shape &x = c.shape(0), &rows = c.shape(1), &cols = c.shape(2);
  c.check(x.rank() == 2 && rows.rank() == 1 && cols.rank() == 1,
          "needs logits (N, C), row ids (N) and column ids (C), got shapes {}, {} and {}", x.str(), rows.str(),
          cols.str());
  c.check(rows.compatibleWith(Shape{x[0]}) && cols.compatibleWith(Shape{x[1]}),
          "row ids {} and column ids {} do not match logits {}", rows.str(), cols.str(), x.str());
  return {c.inputs[0]};
}

/// Copies the logits unless in place, then visits only the matches: the column ids sorted with
/// their columns, each row's id looked up among them.
void penalizeMatchesKernel(KernelContext& ctx) {
  detail::copyElements(ctx, ctx.input(0), ctx.output(0));
  const Rows rows = rowsOf(ctx.input(0).shape());
  const double penalty = ctx.attrs().get<double>("penalty");
  dispatchFloat(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    T* y = ctx.out<T>(0);
    dispatchIndex(ctx.input(1).dtype(), [&](auto zi) {
      using I = decltype(zi);
      const I *rowIds = ctx.in<I>(1), *columnIds = ctx.in<I>(2);
      std::vector<std::pair<I, int64_t>> columns;
      for (int64_t j = 0; j < rows.width; ++j) columns.emplace_back(columnIds[j], j);
      std::sort(columns.begin(), columns.end());
      for (int64_t r = 0; r < rows.count; ++r) {
        auto match = std::lower_bound(columns.begin(), columns.end(), std::pair<I, int64_t>{rowIds[r], 0});
        for (; match != columns.end() && match->first == rowIds[r]; ++match) {
          y[r * rows.width + match->second] -= static_cast<T>(penalty);
        }
      }
    });
  });
}

void penalizeMatchesCpu(KernelContext& ctx) { detail::runInFloat32(ctx, penalizeMatchesKernel); }

// ---- the sampled softmax's cross-entropy ---------------------------------------------------

// trueLogits (N), sampledLogits (N, S) -> loss (N), probs (N, S), trueProbs (N)
std::vector<TensorType> sampledXentInfer(const InferContext& c) {
  detail::requireFloat(c, 0);
  detail::requireSameDType(c, 0, 1);
  const Shape &trueLogits = c.shape(0), &sampled = c.shape(1);
  c.check(trueLogits.rank() == 1 && sampled.rank() == 2,
          "needs true logits (N) and sampled logits (N, S), got {} and {}", trueLogits.str(), sampled.str());
  c.check(trueLogits.compatibleWith(Shape{sampled[0]}), "{} true logits for {} rows of sampled logits", trueLogits[0],
          sampled[0]);
  return {c.inputs[0], c.inputs[1], c.inputs[0]};
}

// Over the row [t, s_1 .. s_S] with m its maximum and Z = exp(t - m) + sum_j exp(s_j - m):
// loss = log Z - (t - m), probs_j = exp(s_j - m) / Z, trueProb = exp(t - m) / Z.
void sampledXentKernel(KernelContext& ctx) {
  const Rows rows = rowsOf(ctx.input(1).shape());
  dispatchFloat(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    const T *trueLogits = ctx.in<T>(0), *ps = ctx.in<T>(1);
    T *loss = ctx.out<T>(0), *pp = ctx.out<T>(1), *trueProbs = ctx.out<T>(2);
    ctx.parallelFor(rows.count, kCostPerElement * (rows.width + 1), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        ConstArrayMap<T> s(ps + r * rows.width, rows.width);
        ArrayMap<T> p(pp + r * rows.width, rows.width);
        const T t = trueLogits[r], m = rows.width == 0 ? t : std::max(t, s.maxCoeff());
        p = (s - m).exp();
        const T trueExp = std::exp(t - m), total = trueExp + p.sum();
        p /= total;
        loss[r] = std::log(total) - (t - m);
        trueProbs[r] = trueExp / total;
      }
    });
  });
}

// dSampled = dy probs (in place over probs), dTrue = dy (trueProb - 1)
void sampledXentGradKernel(KernelContext& ctx) {
  const Rows rows = rowsOf(ctx.input(0).shape());
  dispatchFloat(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    const T *pp = ctx.in<T>(0), *trueProbs = ctx.in<T>(1), *dy = ctx.in<T>(2);
    T *dSampled = ctx.out<T>(0), *dTrue = ctx.out<T>(1);
    ctx.parallelFor(rows.count, rows.width + 1, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        ArrayMap<T>(dSampled + r * rows.width, rows.width) = dy[r] * ConstArrayMap<T>(pp + r * rows.width, rows.width);
        dTrue[r] = dy[r] * (trueProbs[r] - T(1));
      }
    });
  });
}

// Only the loss is differentiable; the probabilities are by-products kept for the backward op.
std::vector<Grad> sampledXentGrad(GradContext& c) {
  if (!c.dy().valid()) return {Grad(), Grad()};
  Node* n = detail::addOp(c.graph(), "SampledSoftmaxXentGrad", {c.y(1), c.y(2), c.dy()});
  return {n->output(1), n->output(0)};
}

}  // namespace

// ---- builders ------------------------------------------------------------------------------

Output softmax(Output logits) { return addOp1(logits.graph(), "Softmax", {logits}); }
Output logSoftmax(Output logits) { return addOp1(logits.graph(), "LogSoftmax", {logits}); }
Output softmaxCrossEntropy(Output logits, Output labels) {
  return addOp1(logits.graph(), "SoftmaxCrossEntropy", {logits, labels});
}
Output sparseSoftmaxCrossEntropy(Output logits, Output ids, int64_t ignoreIndex) {
  return addOp1(logits.graph(), "SparseSoftmaxCrossEntropy", {logits, ids}, {{"ignore_index", ignoreIndex}});
}
Output sampledSoftmaxCrossEntropy(Output trueLogits, Output sampledLogits) {
  return detail::addOp(trueLogits.graph(), "SampledSoftmaxCrossEntropy", {trueLogits, sampledLogits})->output(0);
}
Output penalizeMatches(Output logits, Output rowIds, Output columnIds, double penalty) {
  return addOp1(logits.graph(), "PenalizeMatches", {logits, rowIds, columnIds}, {{"penalty", penalty}});
}

// ---- registration --------------------------------------------------------------------------

void detail::registerSoftmaxOps(OpRegistry& r) {
  r.add(OpDef("Softmax")
            .inputs(1)
            .infer(softmaxInfer)
            .cpu(softmaxKernel<false>)
            .cuda(WEFT_CUDA_KERNEL(softmax))
            .inplace(0)
            .grad(softmaxGrad));
  r.add(OpDef("LogSoftmax")
            .inputs(1)
            .infer(softmaxInfer)
            .cpu(softmaxKernel<true>)
            .cuda(WEFT_CUDA_KERNEL(logSoftmax))
            .inplace(0)
            .grad(logSoftmaxGrad));
  r.add(OpDef("SoftmaxCrossEntropy").inputs(2).infer(xentInfer).cpu(softmaxXentKernel).grad(softmaxXentGrad));
  r.add(OpDef("SparseSoftmaxCrossEntropy")
            .inputs(2)
            .infer(sparseXentInfer)
            .cpu(sparseSoftmaxXentKernel).cuda(WEFT_CUDA_KERNEL(sparseSoftmaxXent))
            .grad(sparseSoftmaxXentGrad));
  r.add(OpDef("SampledSoftmaxCrossEntropy")
            .inputs(2)
            .infer(sampledXentInfer)
            .cpu(sampledXentKernel).cuda(WEFT_CUDA_KERNEL(sampledSoftmaxXent))
            .grad(sampledXentGrad));
  r.add(OpDef("SampledSoftmaxXentGrad")
            .inputs(3)
            .infer([](const InferContext& c) -> std::vector<TensorType> {
              detail::requireFloat(c, 0);
              detail::requireSameDType(c, 0, 1);
              detail::requireSameDType(c, 0, 2);
              c.check(c.shape(1).compatibleWith(batchShape(c.shape(0))) && c.shape(2).compatibleWith(c.shape(1)),
                      "probabilities {}, {} and gradient {} do not match", c.shape(0).str(), c.shape(1).str(),
                      c.shape(2).str());
              return {c.inputs[0], c.inputs[1]};
            })
            .cpu(sampledXentGradKernel).cuda(WEFT_CUDA_KERNEL(sampledSoftmaxXentGrad))
            .inplace(0)
            .noGradient());
  r.add(OpDef("PenalizeMatches")
            .inputs(3)
            .infer(penalizeMatchesInfer)
            .cpu(penalizeMatchesCpu).cuda(WEFT_CUDA_KERNEL(penalizeMatches))
            .inplace(0)
            .grad([](GradContext& c) -> std::vector<Grad> { return {c.dy(), Grad(), Grad()}; }));
  r.add(OpDef("SoftmaxXentGrad")
            .inputs(3)
            .infer([](const InferContext& c) {
              detail::requireSameDType(c, 0, 1);
              c.check(c.shape(1).compatibleWith(c.shape(0)), "labels of shape {} do not match probs {}",
                      c.shape(1).str(), c.shape(0).str());
              return xentGradInfer(c);
            })
            .cpu(softmaxXentGradKernel)
            .inplace(0)
            .noGradient());
  r.add(OpDef("SparseSoftmaxXentGrad")
            .inputs(3)
            .infer([](const InferContext& c) {
              c.check(c.dtype(1) == i32 || c.dtype(1) == i64, "ids must be i32 or i64, got {}",
                      dtypeName(c.dtype(1)));
              return xentGradInfer(c);
            })
            .cpu(sparseSoftmaxXentGradKernel).cuda(WEFT_CUDA_KERNEL(sparseSoftmaxXentGrad))
            .inplace(0)
            .noGradient());
}

}  // namespace weft
