// CUDA kernel of Dropout (ops/Random.cpp): the counter-based draws of core/Random.h, so the GPU's
// mask is bit for bit the CPU's.
#include "core/Random.h"
#include "ops/cuda/Device.cuh"

namespace weft::cudaops {
namespace {

template <class T>
__global__ void dropoutKernel(const T* x, T* y, T* mask, int64_t n, uint64_t key, uint64_t base, double rate, T keep) {
  WEFT_GRID_STRIDE(i, n) {
    const T m = uniformAt(key, base + static_cast<uint64_t>(i)) >= rate ? keep : T(0);
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

}  // namespace

template <class T>
cudaError_t launch::dropout(const T* x, T* y, T* mask, int64_t n, uint64_t key, uint64_t base, double rate, T keep,
                            cudaStream_t stream) {
  dropoutKernel<T><<<blocksFor(n), kThreads, 0, stream>>>(x, y, mask, n, key, base, rate, keep);
  return cudaGetLastError();
}

template cudaError_t launch::dropout<float>(const float*, float*, float*, int64_t, uint64_t, uint64_t, double, float,
                                            cudaStream_t);
template cudaError_t launch::dropout<double>(const double*, double*, double*, int64_t, uint64_t, uint64_t, double,
                                             double, cudaStream_t);

}  // namespace weft::cudaops
