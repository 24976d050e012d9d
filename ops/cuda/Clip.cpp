// The CUDA kernels of the gradient checks: squared norms behind global-norm clipping and
// AllFinite (ops/Clip.cpp defines the ops; device code in ops/cuda/Clip.cu).
#include "ops/cuda/Host.h"
#include "ops/cuda/Kernels.h"

namespace weft::cudaops {

void squaredNorm(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor partials(f64, {launch::squaredNormPartials(x.numel())}, ctx.device);
  dispatchFloating(x.dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::squaredNorm<T>(x.data<T>(), x.numel(), ctx.output(0).data<T>(), partials.data<double>(),
                                           streamOf(ctx)));
  });
}

void sparseSquaredNorm(KernelContext& ctx) {
  const Tensor &ids = ctx.input(0), &values = ctx.input(1);
  const int64_t n = ids.numel(), width = n ? values.numel() / n : 0;
  const Tensor partials(f64, {std::max<int64_t>(n, 1)}, ctx.device);
  dispatchIds(ids.dtype(), [&](auto zi) {
    using I = decltype(zi);
    const auto bytes = static_cast<int64_t>(launch::idSortWorkspaceBytes<I>(n));
    const Tensor workspace(i64, {std::max<int64_t>((bytes + 7) / 8, 1)}, ctx.device);
    dispatchFloating(values.dtype(), [&](auto z) {
      using T = decltype(z);
      WEFT_CUDA_CHECK(launch::sparseSquaredNorm<T, I>(ids.data<I>(), values.data<T>(), n, width,
                                                      ctx.output(0).data<T>(), partials.data<double>(), workspace.raw(),
                                                      streamOf(ctx)));
    });
  });
}

void allFinite(KernelContext& ctx) {
  float* flag = ctx.output(0).data<float>();
  WEFT_CUDA_CHECK(launch::setFlag(flag, 1.0f, streamOf(ctx)));
  for (const Tensor* x : ctx.inputs) {
    dispatchFloating(x->dtype(), [&](auto z) {
      using T = decltype(z);
      WEFT_CUDA_CHECK(launch::clearUnlessFinite<T>(x->data<T>(), x->numel(), flag, streamOf(ctx)));
    });
  }
}

}  // namespace weft::cudaops
