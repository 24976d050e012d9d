// Device-side helpers of the .cu files: launch geometry, grid-stride loops, block reductions and
// data-error recording.
#pragma once

#include "ops/cuda/Launchers.h"

#include <cuda_runtime.h>

namespace weft::cudaops {

constexpr int kThreads = 256;

/// Blocks for a grid-stride loop over n elements.
inline unsigned blocksFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > (1 << 16) ? (1 << 16) : blocks);
}

/// Threads per block for rows of `width` elements: a power of two from 32 to kThreads.
inline int threadsFor(int64_t width) {
  int threads = 32;
  while (threads < kThreads && threads < width) threads *= 2;
  return threads;
}

/// Blocks for one block per row (grid-stride beyond the limit).
inline unsigned blocksForRows(int64_t rows) {
  return static_cast<unsigned>(rows < 1 ? 1 : rows > (1 << 20) ? (1 << 20) : rows);
}

#define WEFT_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

/// Combines one value per thread of a block (blockDim.x a power of two, at most kThreads) in a
/// fixed order, so results do not vary from run to run, and returns it to every thread.
template <class T, class Combine>
__device__ T blockReduce(T value, Combine combine, T* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (unsigned width = blockDim.x / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) scratch[threadIdx.x] = combine(scratch[threadIdx.x], scratch[threadIdx.x + width]);
    __syncthreads();
  }
  const T result = scratch[0];
  __syncthreads();  // scratch may be reused at once
  return result;
}

/// Records the step's first data error; later ones are dropped.
__device__ inline void raiseError(ErrorSink sink, int32_t kind, int64_t value, int64_t position, int64_t limit) {
  if (atomicCAS(&sink.slot->kind, 0, kind) == 0) {
    sink.slot->step = sink.step;
    sink.slot->value = value;
    sink.slot->position = position;
    sink.slot->limit = limit;
    __threadfence_system();
  }
}

}  // namespace weft::cudaops
