// The CUDA kernel of Dropout (ops/Random.cpp defines the op; device code in ops/cuda/Random.cu).
#include "core/Random.h"
#include "ops/cuda/Host.h"
#include "ops/cuda/Kernels.h"

namespace weft::cudaops {

void dropout(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t n = x.numel();
  if (n == 0) return;
  const double rate = ctx.attrs().getFloat("rate");
  const uint64_t key =
      stepKey(streamKey(static_cast<uint64_t>(ctx.attrs().getInt("seed")), ctx.randomStream()), ctx.step);
  dispatchFloating(x.dtype(), [&](auto z) {
    using T = decltype(z);
    WEFT_CUDA_CHECK(launch::dropout<T>(x.data<T>(), ctx.output(0).data<T>(), ctx.output(1).data<T>(), n, key,
                                       static_cast<uint64_t>(ctx.replica) * static_cast<uint64_t>(n), rate,
                                       static_cast<T>(1.0 / (1.0 - rate)), streamOf(ctx)));
  });
}

}  // namespace weft::cudaops
