// CUDA kernels of softmax, log-softmax and the sparse softmax cross-entropy (ops/Softmax.cpp
// defines the ops; ops/cuda/Softmax.cpp launches these). One block per row of the last axis: the
// row maximum and the sum of exponentials are block reductions. Each element is read before it
// is written, so the kernels are safe in place.
#include "ops/cuda/Device.cuh"

namespace weft::cudaops {
namespace {

/// m = max(x) and s = sum(exp(x - m)) over one row, returned to every thread.
template <class T>
__device__ void rowStats(const T* x, int64_t width, T* scratch, T& m, T& s) {
  T local = -INFINITY;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) local = ::fmax(local, x[j]);
  m = blockReduce(local, [](T a, T b) { return ::fmax(a, b); }, scratch);
  T sum = 0;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) sum += ::exp(x[j] - m);
  s = blockReduce(sum, [](T a, T b) { return a + b; }, scratch);
}

template <class T, bool kLog>
__global__ void softmaxRows(const T* x, T* y, Rows rows) {
  __shared__ T scratch[kThreads];
  for (int64_t r = blockIdx.x; r < rows.count; r += gridDim.x) {
    const T* xr = x + r * rows.width;
    T* yr = y + r * rows.width;
    T m, s;
    rowStats(xr, rows.width, scratch, m, s);
    const T logSum = ::log(s);
    for (int64_t j = threadIdx.x; j < rows.width; j += blockDim.x) {
      yr[j] = kLog ? xr[j] - (m + logSum) : ::exp(xr[j] - m) / s;
    }
  }
}

// loss = log sum(exp(x - m)) - (x[id] - m), probs = softmax(x); ignored rows lose 0.
template <class T, class I>
__global__ void sparseXentRows(const T* x, const I* ids, T* loss, T* probs, Rows rows, int64_t ignoreIndex,
                               ErrorSink errors) {
  __shared__ T scratch[kThreads];
  for (int64_t r = blockIdx.x; r < rows.count; r += gridDim.x) {
    const T* xr = x + r * rows.width;
    T* pr = probs + r * rows.width;
    T m, s;
    rowStats(xr, rows.width, scratch, m, s);
    const auto id = static_cast<int64_t>(ids[r]);
    const bool ignored = id == ignoreIndex, valid = id >= 0 && id < rows.width;
    for (int64_t j = threadIdx.x; j < rows.width; j += blockDim.x) pr[j] = ::exp(xr[j] - m) / s;
    if (threadIdx.x == 0) {
      if (!ignored && !valid) raiseError(errors, cuda::KernelError::IndexOutOfRange, id, r, rows.width);
      loss[r] = ignored || !valid ? T(0) : ::log(s) - (xr[id] - m);
    }
  }
}

// dlogits = dy * (probs - onehot(id)); 0 for ignored rows.
template <class T, class I>
__global__ void sparseXentGradKernel(const T* probs, const I* ids, const T* dy, T* out, Rows rows,
                                     int64_t ignoreIndex, ErrorSink errors) {
  WEFT_GRID_STRIDE(i, rows.count * rows.width) {
    const int64_t r = i / rows.width, j = i % rows.width;
    const auto id = static_cast<int64_t>(ids[r]);
    if (id == ignoreIndex) {
      out[i] = T(0);
    } else if (id < 0 || id >= rows.width) {
      if (j == 0) raiseError(errors, cuda::KernelError::IndexOutOfRange, id, r, rows.width);
      out[i] = T(0);
    } else {
      out[i] = dy[r] * (probs[i] - (j == id ? T(1) : T(0)));
    }
  }
}

// Over the row [t, s] with m its maximum and Z = exp(t - m) + sum(exp(s - m)): loss = log Z - (t - m),
// probs = exp(s - m) / Z, trueProb = exp(t - m) / Z.
template <class T>
__global__ void sampledXentRows(const T* trueLogits, const T* sampled, T* loss, T* probs, T* trueProbs, Rows rows) {
  __shared__ T scratch[kThreads];
  for (int64_t r = blockIdx.x; r < rows.count; r += gridDim.x) {
    const T* sr = sampled + r * rows.width;
    T* pr = probs + r * rows.width;
    const T t = trueLogits[r];
    T local = t;
    for (int64_t j = threadIdx.x; j < rows.width; j += blockDim.x) local = ::fmax(local, sr[j]);
    const T m = blockReduce(local, [](T a, T b) { return ::fmax(a, b); }, scratch);
    T sum = 0;
    for (int64_t j = threadIdx.x; j < rows.width; j += blockDim.x) sum += ::exp(sr[j] - m);
    const T total = blockReduce(sum, [](T a, T b) { return a + b; }, scratch) + ::exp(t - m);
    for (int64_t j = threadIdx.x; j < rows.width; j += blockDim.x) pr[j] = ::exp(sr[j] - m) / total;
    if (threadIdx.x == 0) {
      loss[r] = ::log(total) - (t - m);
      trueProbs[r] = ::exp(t - m) / total;
    }
  }
}

// dSampled = dy probs (in place over probs), dTrue = dy (trueProb - 1): the first rows * width
// indices are dSampled's, the last rows dTrue's.
template <class T>
__global__ void sampledXentGradKernel(const T* probs, const T* trueProbs, const T* dy, T* dSampled, T* dTrue,
                                      Rows rows) {
  const int64_t sampledCount = rows.count * rows.width;
  WEFT_GRID_STRIDE(i, sampledCount + rows.count) {
    if (i < sampledCount) {
      dSampled[i] = dy[i / rows.width] * probs[i];
    } else {
      const int64_t r = i - sampledCount;
      dTrue[r] = dy[r] * (trueProbs[r] - T(1));
    }
  }
}

template <class T, class I>
__global__ void penalizeMatchesKernel(T* y, const I* rowIds, const I* columnIds, Rows rows, T penalty) {
  WEFT_GRID_STRIDE(i, rows.count * rows.width) {
    if (rowIds[i / rows.width] == columnIds[i % rows.width]) y[i] -= penalty;
  }
}

}  // namespace

namespace launch {

template <class T>
cudaError_t softmax(bool logSoftmax, const T* x, T* y, Rows rows, cudaStream_t stream) {
  if (logSoftmax) softmaxRows<T, true><<<blocksForRows(rows.count), threadsFor(rows.width), 0, stream>>>(x, y, rows);
  else softmaxRows<T, false><<<blocksForRows(rows.count), threadsFor(rows.width), 0, stream>>>(x, y, rows);
  return cudaGetLastError();
}

template <class T, class I>
cudaError_t sparseXent(const T* x, const I* ids, T* loss, T* probs, Rows rows, int64_t ignoreIndex, ErrorSink errors,
                       cudaStream_t stream) {
  sparseXentRows<T, I><<<blocksForRows(rows.count), threadsFor(rows.width), 0, stream>>>(x, ids, loss, probs, rows,
                                                                                          ignoreIndex, errors);
  return cudaGetLastError();
}

template <class T, class I>
cudaError_t sparseXentGrad(const T* probs, const I* ids, const T* dy, T* out, Rows rows, int64_t ignoreIndex,
                           ErrorSink errors, cudaStream_t stream) {
  sparseXentGradKernel<T, I><<<blocksFor(rows.count * rows.width), kThreads, 0, stream>>>(probs, ids, dy, out, rows,
                                                                                           ignoreIndex, errors);
  return cudaGetLastError();
}

template <class T>
cudaError_t sampledXent(const T* trueLogits, const T* sampled, T* loss, T* probs, T* trueProbs, Rows rows,
                        cudaStream_t stream) {
  sampledXentRows<T><<<blocksForRows(rows.count), threadsFor(rows.width), 0, stream>>>(trueLogits, sampled, loss,
                                                                                       probs, trueProbs, rows);
  return cudaGetLastError();
}

template <class T>
cudaError_t sampledXentGrad(const T* probs, const T* trueProbs, const T* dy, T* dSampled, T* dTrue, Rows rows,
                            cudaStream_t stream) {
  sampledXentGradKernel<T><<<blocksFor(rows.count * (rows.width + 1)), kThreads, 0, stream>>>(probs, trueProbs, dy,
                                                                                               dSampled, dTrue, rows);
  return cudaGetLastError();
}

template <class T, class I>
cudaError_t penalizeMatches(T* y, const I* rowIds, const I* columnIds, Rows rows, T penalty, cudaStream_t stream) {
  penalizeMatchesKernel<T, I><<<blocksFor(rows.count * rows.width), kThreads, 0, stream>>>(y, rowIds, columnIds, rows,
                                                                                           penalty);
  return cudaGetLastError();
}

#define WEFT_SOFTMAX(T, I)                                                                                     \
  template cudaError_t sparseXent<T, I>(const T*, const I*, T*, T*, Rows, int64_t, ErrorSink, cudaStream_t);   \
  template cudaError_t sparseXentGrad<T, I>(const T*, const I*, const T*, T*, Rows, int64_t, ErrorSink,        \
                                            cudaStream_t);                                                     \
  template cudaError_t penalizeMatches<T, I>(T*, const I*, const I*, Rows, T, cudaStream_t);
WEFT_SOFTMAX(float, int32_t)
WEFT_SOFTMAX(float, int64_t)
WEFT_SOFTMAX(double, int32_t)
WEFT_SOFTMAX(double, int64_t)
#undef WEFT_SOFTMAX
#define WEFT_SAMPLED_XENT(T)                                                                          \
  template cudaError_t softmax<T>(bool, const T*, T*, Rows, cudaStream_t);                            \
  template cudaError_t sampledXent<T>(const T*, const T*, T*, T*, T*, Rows, cudaStream_t);            \
  template cudaError_t sampledXentGrad<T>(const T*, const T*, const T*, T*, T*, Rows, cudaStream_t);
WEFT_SAMPLED_XENT(float)
WEFT_SAMPLED_XENT(double)
#undef WEFT_SAMPLED_XENT

}  // namespace launch
}  // namespace weft::cudaops
