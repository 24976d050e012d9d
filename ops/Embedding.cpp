// Row gathers and scatters: Gather (embedding lookup, with a sparse gradient for its table),
// ScatterAdd and UnsortedSegmentSum (the dense form of a sparse gradient).
#include "ops/OpUtil.h"
#include "ops/RowIds.h"
#include "ops/cuda/Kernels.h"

#include <cstring>

namespace weft {
namespace {

/// Elements per row of a tensor whose first axis indexes rows.
int64_t rowSize(const Shape& s) {
  int64_t n = 1;
  for (int i = 1; i < s.rank(); ++i) n *= s[i];
  return n;
}

// ---- Gather -------------------------------------------------------------------------------

std::vector<TensorType> gatherInfer(const InferContext& c) {
  c.check(c.shape(0).rank() >= 1, "params must have rank >= 1");
  c.check(isInteger(c.dtype(1)), "ids must be i32 or i64, got {}", dtypeName(c.dtype(1)));
  std::vector<int64_t> out = c.shape(1).dims();
  out.insert(out.end(), c.shape(0).dims().begin() + 1, c.shape(0).dims().end());
  return {{c.dtype(0), Shape(std::move(out))}};
}

// out[i, ...] = params[ids[i], ...]
void gatherKernel(KernelContext& ctx) {
  const Tensor &params = ctx.input(0), &ids = ctx.input(1);
  const std::vector<int64_t> rows = checkedRowIds(ctx, ids, params.shape()[0], "id");
  const size_t rowBytes = static_cast<size_t>(rowSize(params.shape())) * dtypeSize(params.dtype());
  const char* src = static_cast<const char*>(params.raw());
  char* dst = static_cast<char*>(ctx.output(0).raw());
  ctx.parallelFor(static_cast<int64_t>(rows.size()), static_cast<int64_t>(rowBytes / 8 + 1),
                  [&](int64_t lo, int64_t hi) {
                    for (int64_t i = lo; i < hi; ++i)
                      std::memcpy(dst + i * rowBytes, src + rows[static_cast<size_t>(i)] * rowBytes, rowBytes);
                  });
}

// The table's gradient is sparse: the rows of dy, at the ids that were gathered. A table whose
// row count is known only at run time gets the dense form, summed into a tensor shaped like it.
std::vector<Grad> gatherGrad(GradContext& c) {
  const Shape& table = c.x(0).shape();
  std::vector<int64_t> valueShape{-1};
  valueShape.insert(valueShape.end(), table.dims().begin() + 1, table.dims().end());
  Output ids = reshape(c.x(1), {-1}), rows = reshape(c.dy(), valueShape);
  if (table.isFullyDefined()) return {Grad::sparse(ids, rows, table), Grad()};
  return {detail::addOp1(c.graph(), "UnsortedSegmentSum", {rows, ids, c.x(0)}, {{"num_segments", int64_t{-1}}}),
          Grad()};
}

// ---- ScatterAdd and UnsortedSegmentSum ------------------------------------------------------

/// out[ids[i], ...] += rows[i, ...], parallel over column blocks so no two threads share a cell.
template <class T>
void scatterRows(const KernelContext& ctx, const std::vector<int64_t>& ids, const T* rows, T* out, int64_t width) {
  ctx.parallelFor(width, static_cast<int64_t>(ids.size()), [&](int64_t lo, int64_t hi) {
    for (size_t i = 0; i < ids.size(); ++i) {
      const T* src = rows + static_cast<int64_t>(i) * width;
      T* dst = out + ids[i] * width;
      for (int64_t j = lo; j < hi; ++j) dst[j] += src[j];
    }
  });
}

std::vector<TensorType> scatterAddInfer(const InferContext& c) {
  detail::requireSameDType(c, 0, 2);
  c.check(isInteger(c.dtype(1)) && c.shape(1).rank() == 1, "ids must be an integer vector");
  const Shape &x = c.shape(0), &u = c.shape(2);
  c.check(x.rank() >= 1 && u.rank() == x.rank(), "updates of rank {} for x of rank {}", u.rank(), x.rank());
  c.check(u[0] < 0 || c.shape(1)[0] < 0 || u[0] == c.shape(1)[0], "{} updates for {} ids", u[0], c.shape(1)[0]);
  for (int d = 1; d < x.rank(); ++d) {
    c.check(x[d] < 0 || u[d] < 0 || x[d] == u[d], "update rows {} do not match x rows {}", u.str(), x.str());
  }
  return {c.inputs[0]};
}

void scatterAddKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& out = ctx.output(0);
  const std::vector<int64_t> ids = checkedRowIds(ctx, ctx.input(1), x.shape()[0], "id");
  out.copyFrom(x);
  dispatchDType(x.dtype(), [&](auto z) {
    using T = decltype(z);
    scatterRows<T>(ctx, ids, ctx.input(2).data<T>(), out.data<T>(), rowSize(x.shape()));
  });
}

std::vector<TensorType> segmentSumInfer(const InferContext& c) {
  c.check(isInteger(c.dtype(1)), "segment ids must be i32 or i64, got {}", dtypeName(c.dtype(1)));
  const Shape &data = c.shape(0), &ids = c.shape(1);
  c.check(ids.rank() <= data.rank(), "segment ids of rank {} for data of rank {}", ids.rank(), data.rank());
  for (int d = 0; d < ids.rank(); ++d) {
    c.check(ids[d] < 0 || data[d] < 0 || ids[d] == data[d], "segment ids {} are not a prefix of data {}", ids.str(),
            data.str());
  }
  // With a third input, the segment count is that input's first dimension (known at run time).
  const int64_t n = c.numInputs() == 3 ? c.shape(2)[0] : c.attrs().getInt("num_segments");
  c.check(n >= 0 || c.numInputs() == 3, "num_segments must be >= 0, got {}", n);
  std::vector<int64_t> out{n};
  out.insert(out.end(), data.dims().begin() + ids.rank(), data.dims().end());
  return {{c.dtype(0), Shape(std::move(out))}};
}

void segmentSumKernel(KernelContext& ctx) {
  const Tensor &data = ctx.input(0), &idsT = ctx.input(1);
  Tensor& out = ctx.output(0);
  const std::vector<int64_t> ids = checkedRowIds(ctx, idsT, out.shape()[0], "segment id");
  out.fill(0);
  dispatchDType(data.dtype(), [&](auto z) {
    using T = decltype(z);
    scatterRows<T>(ctx, ids, data.data<T>(), out.data<T>(), rowSize(out.shape()));
  });
}

}  // namespace

Output gather(Output params, Output ids) { return detail::addOp1(params.graph(), "Gather", {params, ids}); }
Output scatterAdd(Output x, Output ids, Output updates) {
  return detail::addOp1(x.graph(), "ScatterAdd", {x, ids, updates});
}
Output unsortedSegmentSum(Output data, Output segmentIds, int64_t numSegments) {
  return detail::addOp1(data.graph(), "UnsortedSegmentSum", {data, segmentIds}, {{"num_segments", numSegments}});
}

void detail::registerEmbeddingOps(OpRegistry& r) {
  r.add(OpDef("Gather").inputs(2).infer(gatherInfer).cpu(gatherKernel).cuda(WEFT_CUDA_KERNEL(gather)).grad(gatherGrad));
  // d/dx = dy;  d/dupdates[i] = dy[ids[i]]
  r.add(OpDef("ScatterAdd")
            .inputs(3)
            .infer(scatterAddInfer)
            .cpu(scatterAddKernel)
            .cuda(WEFT_CUDA_KERNEL(scatterAdd))
            .inplace(0)
            .grad([](GradContext& c) -> std::vector<Grad> {
              return {c.dy(), Grad(), gather(c.dy(), c.x(1))};
            }));
  // d/ddata[i] = dy[ids[i]]
  r.add(OpDef("UnsortedSegmentSum")
            .inputs(2, 3)
            .infer(segmentSumInfer)
            .cpu(segmentSumKernel)
            .cuda(WEFT_CUDA_KERNEL(segmentSum))
            .grad([](GradContext& c) -> std::vector<Grad> {
              std::vector<Grad> grads(c.node->inputs.size());
              grads[0] = gather(c.dy(), c.x(1));
              return grads;
            }));
}

}  // namespace weft
