// Device-side helpers of the .cu files: launch geometry, grid-stride loops, vector accesses,
// block reductions and data-error recording.
#pragma once

#include "core/Half.h"
#include "ops/cuda/Launchers.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

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

/// The type kernels compute in for elements of type T: float for the 16-bit types.
template <class T>
using ComputeType = std::conditional_t<kIsHalf<T>, float, T>;

/// V elements loaded and stored as one access.
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <int V, class T>
__device__ inline Pack<T, V> loadPack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}

template <int V, class T>
__device__ inline void storePack(T* p, const Pack<T, V>& value) {
  *reinterpret_cast<Pack<T, V>*>(p) = value;
}

/// Elements per 16-byte access of T whose every pointer is 16-byte aligned, else 1.
template <class T>
inline int packWidth(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return 1;
  return static_cast<int>(16 / sizeof(T));
}

/// Calls f(std::integral_constant<int, V>{}) with V = width when width is 16 / sizeof(T), else 1.
template <class T, class F>
void withPackWidth(int width, F f) {
  constexpr int kWide = static_cast<int>(16 / sizeof(T));
  if (width == kWide) f(std::integral_constant<int, kWide>{});
  else f(std::integral_constant<int, 1>{});
}

/// Grid-stride over elements [0, n) in packs of V: f(i, std::integral_constant<int, W>) for the
/// pack of W elements at i, W = V but for the last n % V elements, which come one by one.
template <int V, class F>
__device__ void forPacks(int64_t n, F f) {
  const int64_t packs = n / V;
  WEFT_GRID_STRIDE(i, packs) f(i * V, std::integral_constant<int, V>{});
  if constexpr (V > 1) {
    const int64_t tail = packs * V + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (tail < n) f(tail, std::integral_constant<int, 1>{});
  }
}

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
