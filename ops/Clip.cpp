// Gradient checks: the squared norms of dense and sparse gradients (SquaredNorm,
// SparseSquaredNorm), clipByGlobalNorm, which composes them, and AllFinite, which loss scaling
// uses to skip a step whose gradients overflowed. Sums are taken in double over fixed blocks,
// each in a fixed order (detail::simd::interleavedSums), so a norm does not depend on the thread
// count.
#include "ops/OpUtil.h"
#include "ops/RowIds.h"
#include "ops/Simd.h"
#include "ops/cuda/Kernels.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <numeric>

namespace weft {
namespace {

using detail::addOp1;

// Elements per partial sum: large enough to amortise a task, fixed for reproducibility.
constexpr int64_t kBlock = 4096;

// ---- shape functions -----------------------------------------------------------------------

std::vector<TensorType> squaredNormInfer(const InferContext& c) {
  detail::requireFloat(c, 0);
  return {{c.dtype(0), Shape{}}};
}

// indices (n), values (n, ...) -> scalar
std::vector<TensorType> sparseSquaredNormInfer(const InferContext& c) {
  c.check(c.dtype(0) == i32 || c.dtype(0) == i64, "indices must be i32 or i64, got {}", dtypeName(c.dtype(0)));
  detail::requireFloat(c, 1);
  const Shape &indices = c.shape(0), &values = c.shape(1);
  c.check(indices.rank() == 1, "indices must be (n), got rank {}", indices.rank());
  c.check(values.rank() >= 1, "values must be (n, ...), got a scalar");
  c.check(indices[0] < 0 || values[0] < 0 || indices[0] == values[0], "{} indices for {} rows of values",
          indices[0], values[0]);
  return {{c.dtype(1), Shape{}}};
}

// ---- kernels -------------------------------------------------------------------------------

void squaredNormKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t n = x.numel();
  dispatchFloat(x.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* px = x.data<T>();
    std::vector<double> partial(static_cast<size_t>((n + kBlock - 1) / kBlock));
    ctx.parallelFor(static_cast<int64_t>(partial.size()), kBlock, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b) {
        const T* block = px + b * kBlock;
        partial[static_cast<size_t>(b)] = detail::simd::interleavedSums<1>(
            std::min(kBlock, n - b * kBlock), block, block, [](auto x, auto) { return std::array{x * x}; })[0];
      }
    });
    ctx.output(0).data<T>()[0] = static_cast<T>(std::accumulate(partial.begin(), partial.end(), 0.0));
  });
}

void allFiniteKernel(KernelContext& ctx) {
  std::atomic<bool> finite{true};
  for (const Tensor* x : ctx.inputs) {
    dispatchFloat(x->dtype(), [&](auto z) {
      using T = decltype(z);
      const T* px = x->data<T>();
      ctx.parallelFor(x->numel(), 1, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi && finite.load(std::memory_order_relaxed); ++i) {
          if (!std::isfinite(px[i])) finite = false;
        }
      });
    });
  }
  ctx.output(0).data<float>()[0] = finite ? 1.0f : 0.0f;
}

// out = sum over unique ids u of |sum of the value rows with id u|^2
void sparseSquaredNormKernel(KernelContext& ctx) {
  const Tensor &indices = ctx.input(0), &values = ctx.input(1);
  const int64_t n = indices.numel();
  const int64_t width = n == 0 ? 0 : values.numel() / n;
  dispatchFloat(values.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* pv = values.data<T>();
    double total = 0;
    const RowGroups groups = groupRowsById(rowIds(indices));
    const int64_t costPerGroup = groups.count() == 0 ? 0 : width * n / groups.count();
    std::vector<double> groupNorm(static_cast<size_t>(groups.count()));
    const auto squares = [](auto x, auto) { return std::array{x * x}; };
    ctx.parallelFor(groups.count(), costPerGroup, [&](int64_t lo, int64_t hi) {
      std::vector<double> row(static_cast<size_t>(width));
      for (int64_t g = lo; g < hi; ++g) {
        std::fill(row.begin(), row.end(), 0.0);
        for (int64_t k = groups.begin(g); k < groups.end(g); ++k) {
          const T* src = pv + groups.order[static_cast<size_t>(k)] * width;
          for (int64_t j = 0; j < width; ++j) row[static_cast<size_t>(j)] += static_cast<double>(src[j]);
        }
        groupNorm[static_cast<size_t>(g)] = detail::simd::interleavedSums<1>(width, row.data(), row.data(), squares)[0];
      }
    });
    total = std::accumulate(groupNorm.begin(), groupNorm.end(), 0.0);
    ctx.output(0).data<T>()[0] = static_cast<T>(total);
  });
}

}  // namespace

// ---- builders ------------------------------------------------------------------------------

Output squaredNorm(Output x) { return addOp1(x.graph(), "SquaredNorm", {x}); }
Output sparseSquaredNorm(Output indices, Output values) {
  return addOp1(values.graph(), "SparseSquaredNorm", {indices, values});
}

Output allFinite(const std::vector<Output>& xs) {
  WEFT_CHECK(!xs.empty(), "allFinite of no tensors");
  return addOp1(xs[0].graph(), "AllFinite", xs);
}

std::pair<std::vector<Grad>, Output> clipByGlobalNorm(const std::vector<Grad>& grads, double clipNorm) {
  WEFT_CHECK(clipNorm > 0, "clipByGlobalNorm: clipNorm must be positive, got {}", clipNorm);
  std::vector<Output> squares;
  for (const Grad& g : grads) {
    if (g.valid()) squares.push_back(g.isSparse() ? sparseSquaredNorm(g.indices, g.values) : squaredNorm(g.dense));
  }
  WEFT_CHECK(!squares.empty(), "clipByGlobalNorm: no valid gradient among {}", grads.size());
  // Mixed-precision gradients add up in the first one's dtype.
  for (Output& s : squares) s = cast(s, squares[0].dtype());
  Output norm = sqrt(addN(squares));
  Output scale = clipNorm / maximum(norm, scalarLike(norm, clipNorm));

  std::vector<Grad> clipped;
  for (const Grad& g : grads) {
    if (!g.valid()) {
      clipped.push_back(g);
    } else if (g.isSparse()) {
      clipped.push_back(Grad::sparse(g.indices, g.values * cast(scale, g.values.dtype()), g.denseShape));
    } else {
      clipped.push_back(g.dense * cast(scale, g.dense.dtype()));
    }
  }
  return {std::move(clipped), norm};
}

// ---- registration --------------------------------------------------------------------------

void detail::registerClipOps(OpRegistry& r) {
  // d/dx sum(x^2) = 2 x
  r.add(OpDef("SquaredNorm")
            .inputs(1)
            .infer(squaredNormInfer)
            .cpu(squaredNormKernel).cuda(WEFT_CUDA_KERNEL(squaredNorm))
            .grad([](GradContext& c) -> std::vector<Grad> { return {c.x(0) * (c.dy() * 2.0)}; }));
  r.add(OpDef("AllFinite")
            .inputs(1, -1)
            .infer([](const InferContext& c) -> std::vector<TensorType> {
              for (int i = 0; i < c.numInputs(); ++i) {
                c.check(c.dtype(i) == f32 || c.dtype(i) == f64, "input {} must be f32 or f64 (gradients), got {}", i,
                        dtypeName(c.dtype(i)));
              }
              return {{f32, Shape{}}};
            })
            .cpu(allFiniteKernel).cuda(WEFT_CUDA_KERNEL(allFinite))
            .noGradient());
  r.add(OpDef("SparseSquaredNorm")
            .inputs(2)
            .infer(sparseSquaredNormInfer)
            .cpu(sparseSquaredNormKernel)
            .cuda(WEFT_CUDA_KERNEL(sparseSquaredNorm))
            .noGradient());
}

}  // namespace weft
