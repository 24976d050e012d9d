// CUDA kernels of the optimizer and variable updates (ops/Optimizers.cpp and ops/State.cpp define
// the ops; the rules are shared with the CPU through ops/OptimizerRules.h). The learning rate and the step count stay
// on the device: each thread reads them, so an update never waits for the host.
#include "ops/cuda/SortIds.cuh"

namespace weft::cudaops {
namespace {

/// The learning rate and (Adam) the bias corrections of this step, read on the device.
template <rules::Rule R, class T>
__device__ void readScalars(rules::Hyper& h, const T* lr, const int64_t* step) {
  h.lr = static_cast<double>(*lr);
  if constexpr (R == rules::Rule::Adam) {
    const double t = static_cast<double>(*step) + 1;
    h.biasCorrection1 = 1 - ::pow(h.beta1, t);
    h.biasCorrection2 = 1 - ::pow(h.beta2, t);
  }
}

template <rules::Rule R, class T>
__global__ void denseUpdateKernel(rules::Hyper h, T* w, T* s1, T* s2, const T* g, const T* lr, const int64_t* step,
                                  int64_t n, ErrorSink errors) {
  if (errors.slot->kind != 0) return;
  readScalars<R>(h, lr, step);
  T unused{};
  WEFT_GRID_STRIDE(i, n) rules::apply<R, T>(h, w[i], s1 ? s1[i] : unused, s2 ? s2[i] : unused, g[i]);
}

/// Position k of the sorted ids that starts a run of equal ids updates that row: its threads
/// split the columns, sum the run's gradient rows in position order and apply the rule once.
template <rules::Rule R, class T, class I>
__global__ void sparseUpdateKernel(rules::Hyper h, T* w, T* s1, T* s2, int64_t rows, int64_t width,
                                   IdSort<I> sorted, const T* values, int64_t n, const T* lr, const int64_t* step,
                                   ErrorSink errors) {
  // A bad id anywhere in the step leaves the variable as it was, as on the CPU.
  if (errors.slot->kind != 0) return;
  readScalars<R>(h, lr, step);
  T unused{};
  for (int64_t k = blockIdx.x; k < n; k += gridDim.x) {
    const auto id = static_cast<int64_t>(sorted.sortedIds[k]);
    if ((k > 0 && static_cast<int64_t>(sorted.sortedIds[k - 1]) == id) || id < 0 || id >= rows) continue;
    int64_t end = k + 1;
    while (end < n && static_cast<int64_t>(sorted.sortedIds[end]) == id) ++end;
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
      T g = values[sorted.sortedPositions[k] * width + j];
      for (int64_t m = k + 1; m < end; ++m) g += values[sorted.sortedPositions[m] * width + j];
      const int64_t at = id * width + j;
      rules::apply<R, T>(h, w[at], s1 ? s1[at] : unused, s2 ? s2[at] : unused, g);
    }
  }
}

template <class U>
__global__ void assignKernel(const U* x, U* out, int64_t n, ErrorSink errors) {
  if (errors.slot->kind != 0) return;
  WEFT_GRID_STRIDE(i, n) out[i] = x[i];
}

template <class T>
__global__ void blendVariableKernel(const T* x, T* out, T a, T b, int64_t n, ErrorSink errors) {
  if (errors.slot->kind != 0) return;
  WEFT_GRID_STRIDE(i, n) out[i] = a * out[i] + b * x[i];
}

template <class U>
cudaError_t assignAs(const void* x, void* out, int64_t n, ErrorSink errors, cudaStream_t stream) {
  assignKernel<U><<<blocksFor(n), kThreads, 0, stream>>>(static_cast<const U*>(x), static_cast<U*>(out), n, errors);
  return cudaGetLastError();
}

}  // namespace

namespace launch {

cudaError_t assignVariable(const void* x, void* out, int64_t n, size_t elementBytes, ErrorSink errors,
                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (elementBytes) {
    case 8: return assignAs<uint64_t>(x, out, n, errors, stream);
    case 4: return assignAs<uint32_t>(x, out, n, errors, stream);
    case 2: return assignAs<uint16_t>(x, out, n, errors, stream);
    default: return assignAs<uint8_t>(x, out, n * static_cast<int64_t>(elementBytes), errors, stream);
  }
}

template <class T>
cudaError_t blendVariable(const T* x, T* out, T a, T b, int64_t n, ErrorSink errors, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  blendVariableKernel<T><<<blocksFor(n), kThreads, 0, stream>>>(x, out, a, b, n, errors);
  return cudaGetLastError();
}

template cudaError_t blendVariable<float>(const float*, float*, float, float, int64_t, ErrorSink, cudaStream_t);
template cudaError_t blendVariable<double>(const double*, double*, double, double, int64_t, ErrorSink, cudaStream_t);
template cudaError_t blendVariable<int32_t>(const int32_t*, int32_t*, int32_t, int32_t, int64_t, ErrorSink,
                                            cudaStream_t);
template cudaError_t blendVariable<int64_t>(const int64_t*, int64_t*, int64_t, int64_t, int64_t, ErrorSink,
                                            cudaStream_t);

template <rules::Rule R, class T, class I>
cudaError_t sparseUpdate(const rules::Hyper& h, T* w, T* s1, T* s2, int64_t rows, int64_t width, const I* ids,
                         const T* values, int64_t n, const T* lr, const int64_t* step, void* workspace,
                         ErrorSink errors, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  IdSort<I> sorted(workspace, n);
  checkIdsKernel<I><<<blocksFor(n), kThreads, 0, stream>>>(ids, n, rows, errors);
  if (const cudaError_t e = sortIds(sorted, ids, n, stream); e != cudaSuccess) return e;
  sparseUpdateKernel<R, T, I><<<blocksForRows(n), threadsFor(width), 0, stream>>>(h, w, s1, s2, rows, width, sorted,
                                                                                  values, n, lr, step, errors);
  return cudaGetLastError();
}


template <rules::Rule R, class T>
cudaError_t denseUpdate(const rules::Hyper& h, T* w, T* s1, T* s2, const T* g, const T* lr, const int64_t* step,
                        int64_t n, ErrorSink errors, cudaStream_t stream) {
  denseUpdateKernel<R, T><<<blocksFor(n), kThreads, 0, stream>>>(h, w, s1, s2, g, lr, step, n, errors);
  return cudaGetLastError();
}

#define WEFT_UPDATE(R, T)                                                                                     \
  template cudaError_t denseUpdate<rules::Rule::R, T>(const rules::Hyper&, T*, T*, T*, const T*, const T*,    \
                                                      const int64_t*, int64_t, ErrorSink, cudaStream_t);      \
  template cudaError_t sparseUpdate<rules::Rule::R, T, int32_t>(const rules::Hyper&, T*, T*, T*, int64_t,     \
                                                                int64_t, const int32_t*, const T*, int64_t,   \
                                                                const T*, const int64_t*, void*, ErrorSink,   \
                                                                cudaStream_t);                                \
  template cudaError_t sparseUpdate<rules::Rule::R, T, int64_t>(const rules::Hyper&, T*, T*, T*, int64_t,     \
                                                                int64_t, const int64_t*, const T*, int64_t,   \
                                                                const T*, const int64_t*, void*, ErrorSink,   \
                                                                cudaStream_t);
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
