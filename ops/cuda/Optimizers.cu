// CUDA kernels of the dense optimizer updates (ops/Optimizers.cpp defines the ops; the rules are
// shared with the CPU through ops/OptimizerRules.h). The learning rate and the step count stay
// on the device: each thread reads them, so an update never waits for the host.
#include "ops/cuda/Device.cuh"

namespace weft::cudaops {
namespace {

template <rules::Rule R, class T>
__global__ void denseUpdateKernel(rules::Hyper h, T* w, T* s1, T* s2, const T* g, const T* lr, const int64_t* step,
                                  int64_t n) {
  h.lr = static_cast<double>(*lr);
  if constexpr (R == rules::Rule::Adam) {
    const double t = static_cast<double>(*step) + 1;
    h.biasCorrection1 = 1 - ::pow(h.beta1, t);
    h.biasCorrection2 = 1 - ::pow(h.beta2, t);
  }
  T unused{};
  WEFT_GRID_STRIDE(i, n) rules::apply<R, T>(h, w[i], s1 ? s1[i] : unused, s2 ? s2[i] : unused, g[i]);
}

}  // namespace

namespace launch {

template <rules::Rule R, class T>
cudaError_t denseUpdate(const rules::Hyper& h, T* w, T* s1, T* s2, const T* g, const T* lr, const int64_t* step,
                        int64_t n, cudaStream_t stream) {
  denseUpdateKernel<R, T><<<blocksFor(n), kThreads, 0, stream>>>(h, w, s1, s2, g, lr, step, n);
  return cudaGetLastError();
}

#define WEFT_UPDATE(R, T)                                                                                     \
  template cudaError_t denseUpdate<rules::Rule::R, T>(const rules::Hyper&, T*, T*, T*, const T*, const T*,    \
                                                      const int64_t*, int64_t, cudaStream_t);
WEFT_UPDATE(SGD, float)
WEFT_UPDATE(SGD, double)
WEFT_UPDATE(Momentum, float)
WEFT_UPDATE(Momentum, double)
WEFT_UPDATE(Adam, float)
WEFT_UPDATE(Adam, double)
WEFT_UPDATE(Adagrad, float)
WEFT_UPDATE(Adagrad, double)
#undef WEFT_UPDATE

}  // namespace launch
}  // namespace weft::cudaops
