// The CUDA kernels of softmax, log-softmax and the sparse softmax cross-entropy (ops/Softmax.cpp
// defines the ops; the device code is in ops/cuda/Softmax.cu).
#include "ops/cuda/Host.h"
#include "ops/cuda/Kernels.h"

namespace weft::cudaops {
namespace {

Rows rowsOf(const Shape& s) {
  Rows r{1, s[s.rank() - 1]};
  for (int i = 0; i < s.rank() - 1; ++i) r.count *= s[i];
  return r;
}

void softmaxOp(KernelContext& ctx, bool logSoftmax) {
  const Rows rows = rowsOf(ctx.input(0).shape());
  if (rows.count == 0 || rows.width == 0) return;
  dispatchFloating(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(
        launch::softmax<T>(logSoftmax, ctx.input(0).data<T>(), ctx.output(0).data<T>(), rows, streamOf(ctx)));
  });
}

}  // namespace

void softmax(KernelContext& ctx) { softmaxOp(ctx, false); }
void logSoftmax(KernelContext& ctx) { softmaxOp(ctx, true); }

void sparseSoftmaxXent(KernelContext& ctx) {
  const Rows rows = rowsOf(ctx.input(0).shape());
  if (rows.count == 0) return;
  dispatchFloating(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    dispatchIds(ctx.input(1).dtype(), [&](auto zi) {
      using I = decltype(zi);
      WEFT_CUDA_CHECK(launch::sparseXent<T, I>(ctx.input(0).data<T>(), ctx.input(1).data<I>(), ctx.output(0).data<T>(),
                                               ctx.output(1).data<T>(), rows, ctx.attrs().getInt("ignore_index"),
                                               errorSink(ctx), streamOf(ctx)));
    });
  });
}

void sparseSoftmaxXentGrad(KernelContext& ctx) {
  const Rows rows = rowsOf(ctx.input(0).shape());
  if (rows.count * rows.width == 0) return;
  dispatchFloating(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    dispatchIds(ctx.input(1).dtype(), [&](auto zi) {
      using I = decltype(zi);
      WEFT_CUDA_CHECK(launch::sparseXentGrad<T, I>(ctx.input(0).data<T>(), ctx.input(1).data<I>(),
                                                   ctx.input(2).data<T>(), ctx.output(0).data<T>(), rows,
                                                   ctx.attrs().getInt("ignore_index"), errorSink(ctx), streamOf(ctx)));
    });
  });
}

void sampledSoftmaxXent(KernelContext& ctx) {
  const Rows rows = rowsOf(ctx.input(1).shape());
  if (rows.count == 0) return;
  dispatchFloating(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::sampledXent<T>(ctx.input(0).data<T>(), ctx.input(1).data<T>(), ctx.output(0).data<T>(),
                                           ctx.output(1).data<T>(), ctx.output(2).data<T>(), rows, streamOf(ctx)));
  });
}

void sampledSoftmaxXentGrad(KernelContext& ctx) {
  const Rows rows = rowsOf(ctx.input(0).shape());
  if (rows.count == 0) return;
  dispatchFloating(ctx.input(0).dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::sampledXentGrad<T>(ctx.input(0).data<T>(), ctx.input(1).data<T>(), ctx.input(2).data<T>(),
                                               ctx.output(0).data<T>(), ctx.output(1).data<T>(), rows, streamOf(ctx)));
  });
}

void penalizeMatches(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  copyOnDevice(ctx, x, y);
  const Rows rows = rowsOf(x.shape());
  if (rows.count * rows.width == 0) return;
  dispatchFloating(x.dtype(), [&](auto z) {
    using T = decltype(z);
    dispatchIds(ctx.input(1).dtype(), [&](auto zi) {
      using I = decltype(zi);
      WEFT_CUDA_CHECK(launch::penalizeMatches<T, I>(y.data<T>(), ctx.input(1).data<I>(), ctx.input(2).data<I>(), rows,
                                                    static_cast<T>(ctx.attrs().get<double>("penalty")),
                                                    streamOf(ctx)));
    });
  });
}

}  // namespace weft::cudaops
