// A stable sort of row ids with their positions, for kernels that sum rows by id in a fixed
// order (segment sums, sparse optimizer updates): the same inputs give the same bits every run,
// which atomics would not.
#pragma once

#include "ops/cuda/Device.cuh"

#include <cub/device/device_radix_sort.cuh>

namespace weft::cudaops {

inline size_t alignUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

/// The pieces of a workspace of idSortWorkspaceBytes<I>(n) bytes.
template <class I>
struct IdSort {
  I* sortedIds;
  int64_t* positions;
  int64_t* sortedPositions;
  void* temp;
  size_t tempBytes;

  static size_t cubBytes(int64_t n) {
    size_t bytes = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const I*>(nullptr), static_cast<I*>(nullptr),
                                    static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), n);
    return bytes;
  }
  static size_t workspaceBytes(int64_t n) {
    const auto u = static_cast<size_t>(n);
    return alignUp(u * sizeof(I)) + 2 * alignUp(u * sizeof(int64_t)) + alignUp(cubBytes(n));
  }
  IdSort(void* workspace, int64_t n) {
    const auto u = static_cast<size_t>(n);
    char* p = static_cast<char*>(workspace);
    sortedIds = reinterpret_cast<I*>(p);
    p += alignUp(u * sizeof(I));
    positions = reinterpret_cast<int64_t*>(p);
    p += alignUp(u * sizeof(int64_t));
    sortedPositions = reinterpret_cast<int64_t*>(p);
    p += alignUp(u * sizeof(int64_t));
    temp = p;
    tempBytes = alignUp(cubBytes(n));
  }
};

namespace detail {
__global__ inline void iotaKernel(int64_t* p, int64_t n) {
  WEFT_GRID_STRIDE(i, n) p[i] = i;
}
}  // namespace detail

/// Sorts ids (stably) into s.sortedIds, their positions into s.sortedPositions.
template <class I>
cudaError_t sortIds(IdSort<I>& s, const I* ids, int64_t n, cudaStream_t stream) {
  detail::iotaKernel<<<blocksFor(n), kThreads, 0, stream>>>(s.positions, n);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  return cub::DeviceRadixSort::SortPairs(s.temp, s.tempBytes, ids, s.sortedIds, s.positions, s.sortedPositions, n, 0,
                                         static_cast<int>(sizeof(I) * 8), stream);
}

/// First index in sorted[0, n) whose value is not less than key.
template <class I>
__device__ int64_t lowerBound(const I* sorted, int64_t n, int64_t key) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (static_cast<int64_t>(sorted[mid]) < key) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/// Records the first id (by thread order) outside [0, limit).
template <class I>
__global__ void checkIdsKernel(const I* ids, int64_t n, int64_t limit, ErrorSink errors) {
  WEFT_GRID_STRIDE(i, n) {
    const auto id = static_cast<int64_t>(ids[i]);
    if (id < 0 || id >= limit) raiseError(errors, cuda::KernelError::IndexOutOfRange, id, i, limit);
  }
}

}  // namespace weft::cudaops
