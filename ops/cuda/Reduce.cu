// CUDA kernels of the reductions (ops/Reduce.cpp defines the ops; ops/cuda/Reduce.cpp launches
// these).
#include "ops/cuda/Device.cuh"

#include <limits>

namespace weft::cudaops {
namespace {

template <class T>
struct Accumulator {
  using type = T;
};
template <>
struct Accumulator<int32_t> {
  using type = int64_t;
};

/// One block per output; its threads stride over the reduced elements, then combine in shared
/// memory in a fixed order.
template <class T, Reduction kind>
__global__ void reduceKernel(const T* x, T* out, ReducePlan p) {
  using A = typename Accumulator<T>::type;
  __shared__ A scratch[kThreads];
  A init = A(0);
  if constexpr (kind == Reduction::Max) {
    init = std::numeric_limits<T>::has_infinity ? A(-std::numeric_limits<T>::infinity())
                                                : A(std::numeric_limits<T>::lowest());
  }
  // NaN wins a maximum, as on the CPU.
  auto combine = [](A a, A b) {
    if constexpr (kind == Reduction::Max) return (b > a || b != b) ? b : a;
    else return a + b;
  };
  for (int64_t o = blockIdx.x; o < p.outputs; o += gridDim.x) {
    const T* base = x + p.kept.offset(o);
    A acc = init;
    for (int64_t r = threadIdx.x; r < p.count; r += blockDim.x) acc = combine(acc, A(base[p.reduced.offset(r)]));
    A total = blockReduce(acc, combine, scratch);
    if (threadIdx.x == 0) {
      if constexpr (kind == Reduction::Mean) total = p.count ? total / static_cast<A>(p.count) : total;
      out[o] = static_cast<T>(total);
    }
  }
}

template <class T>
__global__ void argmaxKernel(const T* x, int64_t* out, int64_t outer, int64_t n, int64_t inner) {
  WEFT_GRID_STRIDE(i, outer * inner) {
    const int64_t o = i / inner, j = i % inner;
    const T* p = x + o * n * inner + j;
    int64_t best = 0;
    for (int64_t k = 1; k < n; ++k) {
      if (p[k * inner] > p[best * inner]) best = k;
    }
    out[i] = best;
  }
}

}  // namespace

namespace launch {

template <class T>
cudaError_t reduce(Reduction kind, const T* x, T* out, const ReducePlan& plan, cudaStream_t stream) {
  const unsigned blocks = blocksForRows(plan.outputs);
  const int threads = threadsFor(plan.count);
  switch (kind) {
    case Reduction::Sum: reduceKernel<T, Reduction::Sum><<<blocks, threads, 0, stream>>>(x, out, plan); break;
    case Reduction::Mean: reduceKernel<T, Reduction::Mean><<<blocks, threads, 0, stream>>>(x, out, plan); break;
    case Reduction::Max: reduceKernel<T, Reduction::Max><<<blocks, threads, 0, stream>>>(x, out, plan); break;
  }
  return cudaGetLastError();
}

template <class T>
cudaError_t argmax(const T* x, int64_t* out, int64_t outer, int64_t n, int64_t inner, cudaStream_t stream) {
  argmaxKernel<T><<<blocksFor(outer * inner), kThreads, 0, stream>>>(x, out, outer, n, inner);
  return cudaGetLastError();
}

#define WEFT_REDUCE(T)                                                                        \
  template cudaError_t reduce<T>(Reduction, const T*, T*, const ReducePlan&, cudaStream_t); \
  template cudaError_t argmax<T>(const T*, int64_t*, int64_t, int64_t, int64_t, cudaStream_t);
WEFT_REDUCE(float)
WEFT_REDUCE(double)
WEFT_REDUCE(int32_t)
WEFT_REDUCE(int64_t)
#undef WEFT_REDUCE

}  // namespace launch
}  // namespace weft::cudaops
