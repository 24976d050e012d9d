// CUDA kernels of batch normalisation (ops/Norm.cpp defines the ops and the formulas): x is seen
// as (N, C, S), one block per channel sums in double in a fixed order, then applies its channel.
#include "ops/NormFormulas.h"
#include "ops/cuda/Device.cuh"

namespace weft::cudaops {
namespace {

/// Offset of the k-th element of channel ch, k in [0, N*S).
__device__ inline int64_t at(int64_t k, int64_t ch, int64_t c, int64_t s) { return ((k / s) * c + ch) * s + k % s; }

__device__ inline double add(double a, double b) { return a + b; }

template <class T>
__global__ void trainKernel(const T* x, const T* gamma, const T* beta, T* y, T* outMean, T* outVar, T* outInvstd,
                            int64_t n, int64_t c, int64_t s, double eps) {
  __shared__ double scratch[kThreads];
  const int64_t m = n * s;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    // Sums about a pivot, a value of the channel itself, keep the variance accurate when
    // |mean| >> stddev (as on the CPU).
    const double pivot = m > 0 ? static_cast<double>(x[ch * s]) : 0.0;
    double shifted = 0, squares = 0;
    for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
      const double v = static_cast<double>(x[at(k, ch, c, s)]) - pivot;
      shifted += v;
      squares += v * v;
    }
    shifted = blockReduce(shifted, add, scratch);
    squares = blockReduce(squares, add, scratch);
    const double shiftedMean = m > 0 ? shifted / m : 0.0;
    const double mean = pivot + shiftedMean;
    const double var = m > 0 ? ::fmax(0.0, squares / m - shiftedMean * shiftedMean) : 0.0;
    const double invstd = 1.0 / ::sqrt(var + eps);
    const double scale = static_cast<double>(gamma[ch]) * invstd, shift = static_cast<double>(beta[ch]) - mean * scale;
    if (threadIdx.x == 0) {
      outMean[ch] = static_cast<T>(mean);
      outVar[ch] = static_cast<T>(var);
      outInvstd[ch] = static_cast<T>(invstd);
    }
    for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
      const int64_t i = at(k, ch, c, s);
      y[i] = static_cast<T>(scale * static_cast<double>(x[i]) + shift);
    }
  }
}

template <class T>
__global__ void gradKernel(const T* dy, const T* x, const T* gamma, const T* meanIn, const T* invstdIn, const T* dmean,
                           const T* dvar, T* dx, T* dgamma, T* dbeta, int64_t n, int64_t c, int64_t s) {
  __shared__ double scratch[kThreads];
  const int64_t m = n * s;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    const double mean = static_cast<double>(meanIn[ch]), invstd = static_cast<double>(invstdIn[ch]);
    double sumDy = 0, sumDyCentered = 0;
    for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
      const int64_t i = at(k, ch, c, s);
      const double g = static_cast<double>(dy[i]);
      sumDy += g;
      sumDyCentered += g * (static_cast<double>(x[i]) - mean);
    }
    sumDy = blockReduce(sumDy, add, scratch);
    const double sumDyXhat = blockReduce(sumDyCentered, add, scratch) * invstd;
    double a, b, cc;
    norm::gradCoefficients(static_cast<double>(gamma[ch]), invstd, static_cast<double>(m), sumDy, sumDyXhat,
                           dmean ? static_cast<double>(dmean[ch]) : 0.0, dvar ? static_cast<double>(dvar[ch]) : 0.0, a,
                           b, cc);
    if (threadIdx.x == 0) {
      dgamma[ch] = static_cast<T>(sumDyXhat);
      dbeta[ch] = static_cast<T>(sumDy);
    }
    for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
      const int64_t i = at(k, ch, c, s);
      dx[i] = static_cast<T>(a * static_cast<double>(dy[i]) + b * (static_cast<double>(x[i]) - mean) + cc);
    }
  }
}

template <class T>
__global__ void inferenceKernel(const T* x, const T* gamma, const T* beta, const T* mean, const T* var, T* y,
                                int64_t total, int64_t c, int64_t s, double eps) {
  WEFT_GRID_STRIDE(i, total) {
    const int64_t ch = (i / s) % c;
    const double scale = static_cast<double>(gamma[ch]) / ::sqrt(static_cast<double>(var[ch]) + eps);
    const double shift = static_cast<double>(beta[ch]) - static_cast<double>(mean[ch]) * scale;
    y[i] = static_cast<T>(scale * static_cast<double>(x[i]) + shift);
  }
}

}  // namespace

namespace launch {

template <class T>
cudaError_t batchNormTrain(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* var, T* invstd, int64_t n,
                           int64_t c, int64_t s, double eps, cudaStream_t stream) {
  trainKernel<T><<<blocksForRows(c), threadsFor(n * s), 0, stream>>>(x, gamma, beta, y, mean, var, invstd, n, c, s, eps);
  return cudaGetLastError();
}

template <class T>
cudaError_t batchNormGrad(const T* dy, const T* x, const T* gamma, const T* mean, const T* invstd, const T* dmean,
                          const T* dvar, T* dx, T* dgamma, T* dbeta, int64_t n, int64_t c, int64_t s,
                          cudaStream_t stream) {
  gradKernel<T><<<blocksForRows(c), threadsFor(n * s), 0, stream>>>(dy, x, gamma, mean, invstd, dmean, dvar, dx, dgamma,
                                                                    dbeta, n, c, s);
  return cudaGetLastError();
}

template <class T>
cudaError_t batchNormInference(const T* x, const T* gamma, const T* beta, const T* mean, const T* var, T* y,
                               int64_t n, int64_t c, int64_t s, double eps, cudaStream_t stream) {
  inferenceKernel<T><<<blocksFor(n * c * s), kThreads, 0, stream>>>(x, gamma, beta, mean, var, y, n * c * s, c, s, eps);
  return cudaGetLastError();
}

#define WEFT_NORM(T)                                                                                           \
  template cudaError_t batchNormTrain<T>(const T*, const T*, const T*, T*, T*, T*, T*, int64_t, int64_t,       \
                                         int64_t, double, cudaStream_t);                                       \
  template cudaError_t batchNormGrad<T>(const T*, const T*, const T*, const T*, const T*, const T*, const T*,  \
                                        T*, T*, T*, int64_t, int64_t, int64_t, cudaStream_t);                  \
  template cudaError_t batchNormInference<T>(const T*, const T*, const T*, const T*, const T*, T*, int64_t,    \
                                             int64_t, int64_t, double, cudaStream_t);
WEFT_NORM(float)
WEFT_NORM(double)
#undef WEFT_NORM

}  // namespace launch
}  // namespace weft::cudaops
