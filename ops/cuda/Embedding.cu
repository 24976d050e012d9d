// CUDA kernels of the row gathers and scatters (ops/Embedding.cpp defines the ops;
// ops/cuda/Embedding.cpp launches these).
#include "ops/cuda/SortIds.cuh"

namespace weft::cudaops {
namespace {

template <class Bits, class I>
__global__ void gatherKernel(const Bits* params, int64_t rows, int64_t width, const I* ids, int64_t n, Bits* out,
                             ErrorSink errors) {
  WEFT_GRID_STRIDE(k, n * width) {
    const int64_t i = k / width, j = k % width;
    const auto id = static_cast<int64_t>(ids[i]);
    if (id < 0 || id >= rows) {
      if (j == 0) raiseError(errors, cuda::KernelError::IndexOutOfRange, id, i, rows);
      out[k] = Bits(0);
    } else {
      out[k] = params[id * width + j];
    }
  }
}

template <class Bits, class I>
cudaError_t launchGather(const void* params, int64_t rows, int64_t width, const I* ids, int64_t n, void* out,
                         ErrorSink errors, cudaStream_t stream) {
  gatherKernel<Bits, I><<<blocksFor(n * width), kThreads, 0, stream>>>(static_cast<const Bits*>(params), rows, width,
                                                                        ids, n, static_cast<Bits*>(out), errors);
  return cudaGetLastError();
}

/// Block s sums the rows with id s, in position order; its threads split the columns.
template <class T, class I>
__global__ void segmentSumKernel(const T* data, IdSort<I> sorted, int64_t n, int64_t width, const T* init, T* out,
                                 int64_t segments) {
  for (int64_t s = blockIdx.x; s < segments; s += gridDim.x) {
    const int64_t begin = lowerBound(sorted.sortedIds, n, s), end = lowerBound(sorted.sortedIds, n, s + 1);
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
      T acc = init ? init[s * width + j] : T(0);
      for (int64_t k = begin; k < end; ++k) acc += data[sorted.sortedPositions[k] * width + j];
      out[s * width + j] = acc;
    }
  }
}

}  // namespace

namespace launch {

template <class I>
cudaError_t gatherRows(size_t elementBytes, const void* params, int64_t rows, int64_t width, const I* ids, int64_t n,
                       void* out, ErrorSink errors, cudaStream_t stream) {
  switch (elementBytes) {
    case 2: return launchGather<uint16_t, I>(params, rows, width, ids, n, out, errors, stream);
    case 4: return launchGather<uint32_t, I>(params, rows, width, ids, n, out, errors, stream);
    case 8: return launchGather<uint64_t, I>(params, rows, width, ids, n, out, errors, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <class I>
cudaError_t checkIds(const I* ids, int64_t n, int64_t limit, ErrorSink errors, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  checkIdsKernel<I><<<blocksFor(n), kThreads, 0, stream>>>(ids, n, limit, errors);
  return cudaGetLastError();
}

template <class I>
size_t idSortWorkspaceBytes(int64_t n) {
  return IdSort<I>::workspaceBytes(n);
}

template <class T, class I>
cudaError_t segmentSum(const T* data, const I* ids, int64_t n, int64_t width, const T* init, T* out,
                       int64_t segments, void* workspace, ErrorSink errors, cudaStream_t stream) {
  IdSort<I> sorted(workspace, n);
  if (n > 0) {
    checkIdsKernel<I><<<blocksFor(n), kThreads, 0, stream>>>(ids, n, segments, errors);
    if (const cudaError_t e = sortIds(sorted, ids, n, stream); e != cudaSuccess) return e;
  }
  segmentSumKernel<T, I><<<blocksForRows(segments), threadsFor(width), 0, stream>>>(data, sorted, n, width, init, out,
                                                                                    segments);
  return cudaGetLastError();
}

template cudaError_t checkIds<int32_t>(const int32_t*, int64_t, int64_t, ErrorSink, cudaStream_t);
template cudaError_t checkIds<int64_t>(const int64_t*, int64_t, int64_t, ErrorSink, cudaStream_t);
template size_t idSortWorkspaceBytes<int32_t>(int64_t);
template size_t idSortWorkspaceBytes<int64_t>(int64_t);
template cudaError_t gatherRows<int32_t>(size_t, const void*, int64_t, int64_t, const int32_t*, int64_t, void*,
                                         ErrorSink, cudaStream_t);
template cudaError_t gatherRows<int64_t>(size_t, const void*, int64_t, int64_t, const int64_t*, int64_t, void*,
                                         ErrorSink, cudaStream_t);
#define WEFT_SEGMENT_SUM(T, I)                                                                               \
  template cudaError_t segmentSum<T, I>(const T*, const I*, int64_t, int64_t, const T*, T*, int64_t, void*,     \
                                        ErrorSink, cudaStream_t);
WEFT_SEGMENT_SUM(float, int32_t)
WEFT_SEGMENT_SUM(float, int64_t)
WEFT_SEGMENT_SUM(double, int32_t)
WEFT_SEGMENT_SUM(double, int64_t)
WEFT_SEGMENT_SUM(int32_t, int32_t)
WEFT_SEGMENT_SUM(int32_t, int64_t)
WEFT_SEGMENT_SUM(int64_t, int32_t)
WEFT_SEGMENT_SUM(int64_t, int64_t)
#undef WEFT_SEGMENT_SUM

}  // namespace launch
}  // namespace weft::cudaops
