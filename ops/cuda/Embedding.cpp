// The CUDA kernels of the row gathers and scatters (ops/Embedding.cpp defines the ops; device
// code in ops/cuda/Embedding.cu).
#include "ops/cuda/Host.h"
#include "ops/cuda/Kernels.h"

namespace weft::cudaops {
namespace {

int64_t rowSize(const Shape& s) {
  int64_t n = 1;
  for (int i = 1; i < s.rank(); ++i) n *= s[i];
  return n;
}

/// out = (init or 0) + the rows of `data` summed by id into `out`'s rows.
void sumRowsById(const KernelContext& ctx, const Tensor& data, const Tensor& ids, const Tensor* init, Tensor& out) {
  const int64_t n = ids.numel(), width = rowSize(out.shape()), segments = out.shape()[0];
  if (out.numel() == 0) return checkIdsOnly(ctx, ids, segments);
  dispatchIds(ids.dtype(), [&](auto zi) {
    using I = decltype(zi);
    const auto bytes = static_cast<int64_t>(launch::idSortWorkspaceBytes<I>(n));
    const Tensor workspace(i64, {(bytes + 7) / 8}, ctx.device);  // freed in stream order
    dispatchAll(data.dtype(), [&](auto z) {
      using T = decltype(z);
      WEFT_CUDA_CHECK(launch::segmentSum<T, I>(data.data<T>(), ids.data<I>(), n, width,
                                               init ? init->data<T>() : nullptr, out.data<T>(), segments,
                                               workspace.raw(), errorSink(ctx), streamOf(ctx)));
    });
  });
}

}  // namespace

// out[i, ...] = params[ids[i], ...]
void gather(KernelContext& ctx) {
  const Tensor &params = ctx.input(0), &ids = ctx.input(1);
  const int64_t width = rowSize(params.shape());
  if (ids.numel() * width == 0) return checkIdsOnly(ctx, ids, params.shape()[0]);
  dispatchIds(ids.dtype(), [&](auto zi) {
    using I = decltype(zi);
    WEFT_CUDA_CHECK(launch::gatherRows<I>(dtypeSize(params.dtype()), params.raw(), params.shape()[0], width,
                                          ids.data<I>(), ids.numel(), ctx.output(0).raw(), errorSink(ctx),
                                          streamOf(ctx)));
  });
}

void scatterAdd(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  sumRowsById(ctx, ctx.input(2), ctx.input(1), &x, ctx.output(0));
}

void segmentSum(KernelContext& ctx) { sumRowsById(ctx, ctx.input(0), ctx.input(1), nullptr, ctx.output(0)); }

}  // namespace weft::cudaops
