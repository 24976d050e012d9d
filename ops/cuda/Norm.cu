// CUDA kernels of batch normalisation (ops/Norm.cpp defines the ops and the formulas). x is seen
// as (N, C, S): each channel's M = N * S elements lie in N runs of S. They are split into parts
// of whole vectors (up to 16 bytes, where S and the pointers allow), one block per (channel,
// part), so that even a few channels fill the GPU. A training op runs two kernels: the first sums
// each part in double into a workspace; the second combines a channel's parts in a fixed order
// (every block of the channel the same way, so results never vary between runs), and applies the
// channel's coefficients to its part. 16-bit tensors are read and written in 16 bits with f32
// statistics and parameters; all arithmetic is in double.
#include "ops/NormFormulas.h"
#include "ops/cuda/Device.cuh"

#include <type_traits>

namespace weft::cudaops {
namespace {

using launch::NormShape;

// Enough blocks to fill any current GPU several times over.
constexpr int64_t kTargetBlocks = 2048;
// A part gives each thread at least this many vectors.
constexpr int64_t kVectorsPerThread = 4;

template <class T>
__device__ inline double widen(T x) {
  if constexpr (kIsHalf<T>) return static_cast<double>(static_cast<float>(x));
  else return static_cast<double>(x);
}

/// As the CPU's 16-bit path computes: f32 results (rounded from double) rounded to 16 bits.
template <class T>
__device__ inline T narrow(double x) {
  if constexpr (kIsHalf<T>) return T(static_cast<float>(x));
  else return static_cast<T>(x);
}

/// How channels are cut into parts: block b serves channel b / parts, part b % parts, which
/// covers the channel's vectors [part * chunk, min((part + 1) * chunk, n * runVectors)).
struct Split {
  int64_t n, c, runVectors;  // runVectors = S / V
  int64_t parts, chunk;

  __device__ int64_t channel() const { return blockIdx.x / parts; }
  __device__ int64_t part() const { return blockIdx.x % parts; }
  __device__ int64_t first() const { return part() * chunk; }
};

/// Calls f(offset of a vector's first element) for this thread's vectors of its block's part,
/// striding by the block; consecutive threads read consecutive vectors of a run.
template <int V, class F>
__device__ void forPart(const Split& sp, F f) {
  const int64_t ch = sp.channel(), total = sp.n * sp.runVectors;
  const int64_t end = sp.first() + sp.chunk < total ? sp.first() + sp.chunk : total;
  int64_t k = sp.first() + threadIdx.x;
  if (k >= end) return;
  int64_t n = k / sp.runVectors, s = k % sp.runVectors;
  const int64_t stepRuns = blockDim.x / sp.runVectors, stepVectors = blockDim.x % sp.runVectors;
  for (; k < end; k += blockDim.x) {
    f(((n * sp.c + ch) * sp.runVectors + s) * V);
    s += stepVectors;
    n += stepRuns;
    if (s >= sp.runVectors) {
      s -= sp.runVectors;
      ++n;
    }
  }
}

__device__ inline double add(double a, double b) { return a + b; }

/// Sums a channel's parts, (first sum, second sum) over the channel, into lane 0 of the warp
/// that calls it (the block's first): lane j sums parts j, j + 32, ... and a fixed tree adds the
/// lanes, so every block of the channel gets the same bits, without waiting on one thread's
/// serial loads.
__device__ inline void combineParts(const Split& sp, const double* partials, double& first, double& second) {
  first = 0;
  second = 0;
  for (int64_t p = threadIdx.x; p < sp.parts; p += 32) {
    first += partials[2 * (sp.channel() * sp.parts + p)];
    second += partials[2 * (sp.channel() * sp.parts + p) + 1];
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    first += __shfl_down_sync(0xffffffffu, first, offset);
    second += __shfl_down_sync(0xffffffffu, second, offset);
  }
}

/// Writes the block's two sums to its slot of `partials`.
__device__ inline void storePartial(double first, double second, double* partials) {
  __shared__ double scratch[kThreads];
  first = blockReduce(first, add, scratch);
  second = blockReduce(second, add, scratch);
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = first;
    partials[2 * blockIdx.x + 1] = second;
  }
}

/// out = scale * in + shift over the block's part; with kRelu, max(0, that) (NaN stays NaN, as
/// on the CPU).
template <class T, int V, bool kRelu = false>
__device__ void affinePart(const Split& sp, const T* x, double scale, double shift, T* y) {
  forPart<V>(sp, [&](int64_t off) {
    const Pack<T, V> in = *reinterpret_cast<const Pack<T, V>*>(x + off);
    Pack<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const double v = scale * widen(in.v[j]) + shift;
      out.v[j] = narrow<T>(kRelu && v < 0 ? 0.0 : v);
    }
    *reinterpret_cast<Pack<T, V>*>(y + off) = out;
  });
}

/// dy, or 0 where the fused ReLU's output is not positive (no mask: dy).
template <class T>
__device__ inline double maskedGrad(T dy, const T* mask, int64_t at) {
  return mask && !(widen(mask[at]) > 0) ? 0.0 : widen(dy);
}

// Sums about a pivot, a value of the channel itself, keep the variance accurate when
// |mean| >> stddev (as on the CPU).
template <class T, int V>
__global__ void momentsKernel(const T* x, Split sp, int64_t s, double* partials) {
  const double pivot = sp.n * s > 0 ? widen(x[sp.channel() * s]) : 0.0;
  double shifted = 0, squares = 0;
  forPart<V>(sp, [&](int64_t off) {
    const Pack<T, V> in = *reinterpret_cast<const Pack<T, V>*>(x + off);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const double v = widen(in.v[j]) - pivot;
      shifted += v;
      squares += v * v;
    }
  });
  storePartial(shifted, squares, partials);
}

template <class T, class P, int V, bool kRelu>
__global__ void normalizeKernel(const T* x, const P* gamma, const P* beta, T* y, P* outMean, P* outVar, P* outInvstd,
                                Split sp, int64_t s, double eps, const double* partials) {
  __shared__ double coefficients[2];
  double shifted = 0, squares = 0;
  if (threadIdx.x < 32) combineParts(sp, partials, shifted, squares);
  if (threadIdx.x == 0) {
    const int64_t ch = sp.channel();
    const double m = static_cast<double>(sp.n * s);
    const double pivot = m > 0 ? widen(x[ch * s]) : 0.0;
    const double shiftedMean = m > 0 ? shifted / m : 0.0;
    const double mean = pivot + shiftedMean;
    const double var = m > 0 ? ::fmax(0.0, squares / m - shiftedMean * shiftedMean) : 0.0;
    const double invstd = 1.0 / ::sqrt(var + eps);
    const double scale = static_cast<double>(gamma[ch]) * invstd;
    coefficients[0] = scale;
    coefficients[1] = static_cast<double>(beta[ch]) - mean * scale;
    if (sp.part() == 0) {
      outMean[ch] = static_cast<P>(mean);
      outVar[ch] = static_cast<P>(var);
      outInvstd[ch] = static_cast<P>(invstd);
    }
  }
  __syncthreads();
  affinePart<T, V, kRelu>(sp, x, coefficients[0], coefficients[1], y);
}

// Per part: sum(dy) and sum(dy (x - mean)), dy masked by the fused ReLU's output where given.
template <class T, class P, int V>
__global__ void gradSumsKernel(const T* dy, const T* x, const T* mask, const P* meanIn, Split sp, double* partials) {
  const double mean = static_cast<double>(meanIn[sp.channel()]);
  double sumDy = 0, sumDyCentered = 0;
  forPart<V>(sp, [&](int64_t off) {
    const Pack<T, V> g = *reinterpret_cast<const Pack<T, V>*>(dy + off);
    const Pack<T, V> v = *reinterpret_cast<const Pack<T, V>*>(x + off);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const double gj = maskedGrad(g.v[j], mask, off + j);
      sumDy += gj;
      sumDyCentered += gj * (widen(v.v[j]) - mean);
    }
  });
  storePartial(sumDy, sumDyCentered, partials);
}

// dx = a dy + b (x - mean) + c (ops/NormFormulas.h), dgamma = sum(dy xhat), dbeta = sum(dy).
template <class T, class P, int V>
__global__ void gradApplyKernel(const T* dy, const T* x, const T* mask, const P* gamma, const P* meanIn,
                                const P* invstdIn, const P* dmean, const P* dvar, T* dx, P* dgamma, P* dbeta, Split sp,
                                int64_t s, const double* partials) {
  __shared__ double coefficients[4];
  const int64_t ch = sp.channel();
  double sumDy = 0, sumDyCentered = 0;
  if (threadIdx.x < 32) combineParts(sp, partials, sumDy, sumDyCentered);
  if (threadIdx.x == 0) {
    const double invstd = static_cast<double>(invstdIn[ch]);
    const double sumDyXhat = sumDyCentered * invstd;
    double a, b, c;
    norm::gradCoefficients(static_cast<double>(gamma[ch]), invstd, static_cast<double>(sp.n * s), sumDy, sumDyXhat,
                           dmean ? static_cast<double>(dmean[ch]) : 0.0, dvar ? static_cast<double>(dvar[ch]) : 0.0,
                           a, b, c);
    coefficients[0] = a;
    coefficients[1] = b;
    coefficients[2] = c;
    coefficients[3] = static_cast<double>(meanIn[ch]);
    if (sp.part() == 0) {
      dgamma[ch] = static_cast<P>(sumDyXhat);
      dbeta[ch] = static_cast<P>(sumDy);
    }
  }
  __syncthreads();
  const double a = coefficients[0], b = coefficients[1], c = coefficients[2], mean = coefficients[3];
  forPart<V>(sp, [&](int64_t off) {
    const Pack<T, V> g = *reinterpret_cast<const Pack<T, V>*>(dy + off);
    const Pack<T, V> v = *reinterpret_cast<const Pack<T, V>*>(x + off);
    Pack<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j)
      out.v[j] = narrow<T>(a * maskedGrad(g.v[j], mask, off + j) + b * (widen(v.v[j]) - mean) + c);
    *reinterpret_cast<Pack<T, V>*>(dx + off) = out;
  });
}

template <class T, class P, int V>
__global__ void inferenceKernel(const T* x, const P* gamma, const P* beta, const P* mean, const P* var, T* y, Split sp,
                                double eps) {
  const int64_t ch = sp.channel();
  const double scale = static_cast<double>(gamma[ch]) / ::sqrt(static_cast<double>(var[ch]) + eps);
  const double shift = static_cast<double>(beta[ch]) - static_cast<double>(mean[ch]) * scale;
  affinePart<T, V>(sp, x, scale, shift, y);
}

/// The parts of each channel for vectors of V elements.
Split splitFor(const NormShape& shape, int v) {
  Split sp{shape.n, shape.c, shape.s / v, 1, 0};
  const int64_t total = sp.n * sp.runVectors;
  const int64_t wanted = (kTargetBlocks + shape.c - 1) / shape.c;
  const int64_t fill = total / (kThreads * kVectorsPerThread);  // parts that keep every thread busy
  const int64_t parts = wanted < fill ? wanted : fill;
  sp.parts = parts > 1 ? parts : 1;
  sp.chunk = (total + sp.parts - 1) / sp.parts;
  if (sp.chunk > 0) sp.parts = (total + sp.chunk - 1) / sp.chunk;  // no empty parts
  return sp;
}

/// The widest vector (at most 16 bytes) that divides S and that every pointer is aligned to.
template <class T>
int vectorWidth(int64_t s, std::initializer_list<const void*> pointers) {
  for (int v = static_cast<int>(16 / sizeof(T)); v > 1; v /= 2) {
    bool fits = s % v == 0;
    for (const void* p : pointers) fits = fits && reinterpret_cast<uintptr_t>(p) % (v * sizeof(T)) == 0;
    if (fits) return v;
  }
  return 1;
}

/// Calls f(std::integral_constant<int, V>{}) for the vector width v (1, 2, 4 or 8).
template <class T, class F>
void withWidth(int v, F f) {
  switch (v) {
    case 8: if constexpr (sizeof(T) <= 2) { f(std::integral_constant<int, 8>{}); return; } break;
    case 4: if constexpr (sizeof(T) <= 4) { f(std::integral_constant<int, 4>{}); return; } break;
    case 2: f(std::integral_constant<int, 2>{}); return;
    default: break;
  }
  f(std::integral_constant<int, 1>{});
}

unsigned blocksOf(const Split& sp) { return static_cast<unsigned>(sp.c * sp.parts); }

}  // namespace

namespace launch {

int64_t batchNormPartials(const NormShape& shape) {
  // The split of the narrowest vector (one element) has the most parts.
  return 2 * shape.c * splitFor(shape, 1).parts;
}

template <class T, class P>
cudaError_t batchNormTrain(const T* x, const P* gamma, const P* beta, T* y, P* mean, P* var, P* invstd, bool relu,
                           const NormShape& shape, double eps, double* partials, cudaStream_t stream) {
  withWidth<T>(vectorWidth<T>(shape.s, {x, y}), [&](auto width) {
    constexpr int V = decltype(width)::value;
    const Split sp = splitFor(shape, V);
    momentsKernel<T, V><<<blocksOf(sp), kThreads, 0, stream>>>(x, sp, shape.s, partials);
    if (relu) {
      normalizeKernel<T, P, V, true><<<blocksOf(sp), kThreads, 0, stream>>>(x, gamma, beta, y, mean, var, invstd, sp,
                                                                             shape.s, eps, partials);
    } else {
      normalizeKernel<T, P, V, false><<<blocksOf(sp), kThreads, 0, stream>>>(x, gamma, beta, y, mean, var, invstd, sp,
                                                                              shape.s, eps, partials);
    }
  });
  return cudaGetLastError();
}

template <class T, class P>
cudaError_t batchNormGrad(const T* dy, const T* x, const T* mask, const P* gamma, const P* mean, const P* invstd,
                          const P* dmean, const P* dvar, T* dx, P* dgamma, P* dbeta, const NormShape& shape,
                          double* partials, cudaStream_t stream) {
  withWidth<T>(vectorWidth<T>(shape.s, {dy, x, dx, mask}), [&](auto width) {
    constexpr int V = decltype(width)::value;
    const Split sp = splitFor(shape, V);
    gradSumsKernel<T, P, V><<<blocksOf(sp), kThreads, 0, stream>>>(dy, x, mask, mean, sp, partials);
    gradApplyKernel<T, P, V><<<blocksOf(sp), kThreads, 0, stream>>>(dy, x, mask, gamma, mean, invstd, dmean, dvar,
                                                                     dx, dgamma, dbeta, sp, shape.s, partials);
  });
  return cudaGetLastError();
}

template <class T, class P>
cudaError_t batchNormInference(const T* x, const P* gamma, const P* beta, const P* mean, const P* var, T* y,
                               const NormShape& shape, double eps, cudaStream_t stream) {
  withWidth<T>(vectorWidth<T>(shape.s, {x, y}), [&](auto width) {
    constexpr int V = decltype(width)::value;
    const Split sp = splitFor(shape, V);
    inferenceKernel<T, P, V><<<blocksOf(sp), kThreads, 0, stream>>>(x, gamma, beta, mean, var, y, sp, eps);
  });
  return cudaGetLastError();
}

#define WEFT_NORM(T, P)                                                                                          \
  template cudaError_t batchNormTrain<T, P>(const T*, const P*, const P*, T*, P*, P*, P*, bool, const NormShape&, \
                                            double, double*, cudaStream_t);                                      \
  template cudaError_t batchNormGrad<T, P>(const T*, const T*, const T*, const P*, const P*, const P*, const P*, \
                                           const P*, T*, P*, P*, const NormShape&, double*, cudaStream_t);       \
  template cudaError_t batchNormInference<T, P>(const T*, const P*, const P*, const P*, const P*, T*,            \
                                                const NormShape&, double, cudaStream_t);
WEFT_NORM(float, float)
WEFT_NORM(double, double)
WEFT_NORM(BFloat16, float)
WEFT_NORM(Float16, float)
#undef WEFT_NORM

}  // namespace launch
}  // namespace weft::cudaops
