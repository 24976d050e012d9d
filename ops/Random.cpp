// Random ops. Draws come from counter-based streams (core/Random.h) keyed by the op's seed, node
// name and the session's random step (runs that drew random numbers before this one), and
// indexed by the element's place in the total batch, so a run's result does not depend on the
// thread count, successive runs draw afresh, a new session replays the same sequence, evaluation
// runs between training steps change nothing, and data-parallel replicas
// (SessionOptions::replica) draw for their part of the batch what one session draws for the whole.
#include "ops/OpUtil.h"
#include "ops/cuda/Kernels.h"

#include "core/Random.h"

namespace weft {
namespace {

using detail::addOp1;

// x -> y, mask: both x's type
std::vector<TensorType> dropoutInfer(const InferContext& c) {
  detail::requireFloat(c, 0);
  const double rate = c.attrs().getFloat("rate");
  c.check(rate >= 0 && rate < 1, "rate must be in [0, 1), got {}", rate);
  return {c.inputs[0], c.inputs[0]};
}

// mask[i] = 1/(1 - rate) where u_step(replica * numel + i) >= rate, else 0;  y = x * mask
// (a replica holds an equal part of the total batch along the first axis, after those before it)
void dropoutKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const double rate = ctx.attrs().getFloat("rate");
  const uint64_t key =
      stepKey(streamKey(static_cast<uint64_t>(ctx.attrs().getInt("seed")), ctx.randomStream()), ctx.step);
  const int64_t n = x.numel();
  const uint64_t base = static_cast<uint64_t>(ctx.replica) * static_cast<uint64_t>(n);
  dispatchFloat(x.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* px = x.data<T>();
    T* py = ctx.output(0).data<T>();
    T* pm = ctx.output(1).data<T>();
    const T keep = static_cast<T>(1.0 / (1.0 - rate));
    ctx.parallelFor(n, 5, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        pm[i] = uniformAt(key, base + static_cast<uint64_t>(i)) >= rate ? keep : T(0);
        py[i] = px[i] * pm[i];
      }
    });
  });
}

}  // namespace

Output dropout(Output x, double rate, uint64_t seed) {
  return addOp1(x.graph(), "Dropout", {x}, {{"rate", rate}, {"seed", static_cast<int64_t>(seed)}});
}

void detail::registerRandomOps(OpRegistry& r) {
  // dx = dy * mask; the mask itself is not differentiable.
  r.add(OpDef("Dropout")
            .inputs(1)
            .infer(dropoutInfer)
            .cpu(dropoutKernel)
            .cuda(WEFT_CUDA_KERNEL(dropout))
            .inplace(0)
            .random()
            .grad([](GradContext& c) -> std::vector<Grad> {
              if (!c.dy().valid()) return {Grad()};
              return {c.dy() * c.y(1)};
            }));
}

}  // namespace weft
