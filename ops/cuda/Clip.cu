// CUDA kernels of the squared norms behind global-norm clipping (ops/Clip.cpp): sums in double,
// in an order fixed by the sizes alone, so results do not vary from run to run.
#include "ops/cuda/SortIds.cuh"

namespace weft::cudaops {
namespace {

constexpr int64_t kMaxPartials = 1024;

/// Block b sums squares of elements b, b + stride, ... into partials[b].
template <class T>
__global__ void squarePartials(const T* x, int64_t n, double* partials) {
  __shared__ double scratch[kThreads];
  double s = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  }
  const double total = blockReduce(s, [](double a, double b) { return a + b; }, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

/// out = the sum of partials[0, count), by one block.
template <class T>
__global__ void sumPartials(const double* partials, int64_t count, T* out) {
  __shared__ double scratch[kThreads];
  double s = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  const double total = blockReduce(s, [](double a, double b) { return a + b; }, scratch);
  if (threadIdx.x == 0) *out = static_cast<T>(total);
}

/// partials[k] = |sum of the rows of the run of equal ids starting at sorted position k|^2, or 0
/// where no run starts at k.
template <class T, class I>
__global__ void groupSquares(IdSort<I> sorted, const T* values, int64_t n, int64_t width, double* partials) {
  __shared__ double scratch[kThreads];
  for (int64_t k = blockIdx.x; k < n; k += gridDim.x) {
    const bool starts = k == 0 || sorted.sortedIds[k - 1] != sorted.sortedIds[k];
    double s = 0;
    if (starts) {
      int64_t end = k + 1;
      while (end < n && sorted.sortedIds[end] == sorted.sortedIds[k]) ++end;
      for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
        double row = 0;
        for (int64_t m = k; m < end; ++m) row += static_cast<double>(values[sorted.sortedPositions[m] * width + j]);
        s += row * row;
      }
    }
    const double total = blockReduce(s, [](double a, double b) { return a + b; }, scratch);
    if (threadIdx.x == 0) partials[k] = total;
  }
}

/// Every thread that meets a NaN or infinity writes the same 0, so the race is harmless.
template <class T>
__global__ void clearUnlessFiniteKernel(const T* x, int64_t n, float* flag) {
  WEFT_GRID_STRIDE(i, n) {
    if (!isfinite(x[i])) *flag = 0.0f;
  }
}

__global__ void setFlagKernel(float* flag, float value) { *flag = value; }

}  // namespace

namespace launch {

template <class T>
cudaError_t clearUnlessFinite(const T* x, int64_t n, float* flag, cudaStream_t stream) {
  if (n > 0) clearUnlessFiniteKernel<T><<<blocksFor(n), kThreads, 0, stream>>>(x, n, flag);
  return cudaGetLastError();
}

cudaError_t setFlag(float* flag, float value, cudaStream_t stream) {
  setFlagKernel<<<1, 1, 0, stream>>>(flag, value);
  return cudaGetLastError();
}

template cudaError_t clearUnlessFinite<float>(const float*, int64_t, float*, cudaStream_t);
template cudaError_t clearUnlessFinite<double>(const double*, int64_t, float*, cudaStream_t);

int64_t squaredNormPartials(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return blocks < 1 ? 1 : blocks > kMaxPartials ? kMaxPartials : blocks;
}

template <class T>
cudaError_t squaredNorm(const T* x, int64_t n, T* out, double* partials, cudaStream_t stream) {
  const int64_t blocks = squaredNormPartials(n);
  squarePartials<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, n, partials);
  sumPartials<T><<<1, kThreads, 0, stream>>>(partials, blocks, out);
  return cudaGetLastError();
}

template <class T, class I>
cudaError_t sparseSquaredNorm(const I* ids, const T* values, int64_t n, int64_t width, T* out, double* partials,
                              void* workspace, cudaStream_t stream) {
  if (n == 0) {
    sumPartials<T><<<1, kThreads, 0, stream>>>(partials, 0, out);
    return cudaGetLastError();
  }
  IdSort<I> sorted(workspace, n);
  if (const cudaError_t e = sortIds(sorted, ids, n, stream); e != cudaSuccess) return e;
  groupSquares<T, I><<<blocksForRows(n), threadsFor(width), 0, stream>>>(sorted, values, n, width, partials);
  sumPartials<T><<<1, kThreads, 0, stream>>>(partials, n, out);
  return cudaGetLastError();
}

template cudaError_t squaredNorm<float>(const float*, int64_t, float*, double*, cudaStream_t);
template cudaError_t squaredNorm<double>(const double*, int64_t, double*, double*, cudaStream_t);
#define WEFT_SPARSE_NORM(T, I) \
  template cudaError_t sparseSquaredNorm<T, I>(const I*, const T*, int64_t, int64_t, T*, double*, void*, cudaStream_t);
WEFT_SPARSE_NORM(float, int32_t)
WEFT_SPARSE_NORM(float, int64_t)
WEFT_SPARSE_NORM(double, int32_t)
WEFT_SPARSE_NORM(double, int64_t)
#undef WEFT_SPARSE_NORM

}  // namespace launch
}  // namespace weft::cudaops
