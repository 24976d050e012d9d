// CUDA kernels of max and average pooling (ops/Conv.cpp defines the ops; ops/cuda/Pool.cpp
// launches these). Forward: a thread per output. Backward: a thread per input, gathering from
// the outputs whose window holds it in output order, so no atomics and the CPU's sums.
#include "ops/cuda/Device.cuh"

namespace weft::cudaops {
namespace {

using launch::PoolShape;

__device__ inline int64_t larger(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ inline int64_t smaller(int64_t a, int64_t b) { return a < b ? a : b; }

/// Clipped window rows [y0, y1) and columns [x0, x1) of output (oy, ox).
struct Window {
  int64_t y0, y1, x0, x1;
  __device__ Window(const PoolShape& p, int64_t oy, int64_t ox)
      : y0(larger(0, oy * p.sh - p.ph)), y1(smaller(p.h, oy * p.sh - p.ph + p.kh)),
        x0(larger(0, ox * p.sw - p.pw)), x1(smaller(p.w, ox * p.sw - p.pw + p.kw)) {}
  __device__ int64_t count() const { return larger(0, y1 - y0) * larger(0, x1 - x0); }
};

/// The outputs [lo, hi] along one axis whose window (stride s, padding pad, size k) holds input i.
__device__ inline void outputsHolding(int64_t i, int64_t s, int64_t pad, int64_t k, int64_t outSize, int64_t& lo,
                                      int64_t& hi) {
  const int64_t first = i + pad - k + 1;  // o * s >= first
  lo = first <= 0 ? 0 : (first + s - 1) / s;
  hi = smaller(outSize - 1, (i + pad) / s);
}

/// Each output reduces its window: the maximum, or the mean.
template <class T, bool kMax>
__global__ void poolKernel(const T* x, T* y, PoolShape p) {
  WEFT_GRID_STRIDE(k, p.planes * p.oh * p.ow) {
    const int64_t plane = k / (p.oh * p.ow), oy = (k / p.ow) % p.oh, ox = k % p.ow;
    const T* px = x + plane * p.h * p.w;
    const Window win(p, oy, ox);
    T acc = kMax ? T(-INFINITY) : T(0);
    for (int64_t iy = win.y0; iy < win.y1; ++iy) {
      for (int64_t ix = win.x0; ix < win.x1; ++ix) {
        const T v = px[iy * p.w + ix];
        acc = kMax ? (acc < v ? v : acc) : acc + v;
      }
    }
    y[k] = win.count() == 0 ? T(0) : kMax ? acc : acc / static_cast<T>(win.count());
  }
}

/// The sum, in output order, of share(o, window of o) over the outputs o whose window holds input
/// element k (flat over planes, rows, columns).
template <class T, class Share>
__device__ T gatherFromOutputs(const PoolShape& p, int64_t k, Share share) {
  const int64_t plane = k / (p.h * p.w), iy = (k / p.w) % p.h, ix = k % p.w;
  int64_t oy0, oy1, ox0, ox1;
  outputsHolding(iy, p.sh, p.ph, p.kh, p.oh, oy0, oy1);
  outputsHolding(ix, p.sw, p.pw, p.kw, p.ow, ox0, ox1);
  T total = 0;
  for (int64_t oy = oy0; oy <= oy1; ++oy) {
    for (int64_t ox = ox0; ox <= ox1; ++ox) total += share((plane * p.oh + oy) * p.ow + ox, Window(p, oy, ox));
  }
  return total;
}

template <class T>
__global__ void maxPoolGradKernel(const T* x, const T* y, const T* dy, T* dx, PoolShape p) {
  WEFT_GRID_STRIDE(k, p.planes * p.h * p.w) {
    const T* px = x + k / (p.h * p.w) * p.h * p.w;
    const int64_t self = k % (p.h * p.w);
    dx[k] = gatherFromOutputs<T>(p, k, [&](int64_t o, const Window& win) {
      for (int64_t wy = win.y0; wy < win.y1; ++wy) {  // the window's first element equal to its maximum
        for (int64_t wx = win.x0; wx < win.x1; ++wx) {
          if (px[wy * p.w + wx] == y[o]) return wy * p.w + wx == self ? dy[o] : T(0);
        }
      }
      return T(0);
    });
  }
}

template <class T>
__global__ void avgPoolGradKernel(const T* dy, T* dx, PoolShape p) {
  WEFT_GRID_STRIDE(k, p.planes * p.h * p.w) {
    dx[k] = gatherFromOutputs<T>(p, k, [&](int64_t o, const Window& win) { return dy[o] / static_cast<T>(win.count()); });
  }
}

}  // namespace

namespace launch {

template <class T>
cudaError_t maxPool(const T* x, T* y, const PoolShape& p, cudaStream_t stream) {
  poolKernel<T, true><<<blocksFor(p.planes * p.oh * p.ow), kThreads, 0, stream>>>(x, y, p);
  return cudaGetLastError();
}

template <class T>
cudaError_t maxPoolGrad(const T* x, const T* y, const T* dy, T* dx, const PoolShape& p, cudaStream_t stream) {
  maxPoolGradKernel<T><<<blocksFor(p.planes * p.h * p.w), kThreads, 0, stream>>>(x, y, dy, dx, p);
  return cudaGetLastError();
}

template <class T>
cudaError_t avgPool(const T* x, T* y, const PoolShape& p, cudaStream_t stream) {
  poolKernel<T, false><<<blocksFor(p.planes * p.oh * p.ow), kThreads, 0, stream>>>(x, y, p);
  return cudaGetLastError();
}

template <class T>
cudaError_t avgPoolGrad(const T* dy, T* dx, const PoolShape& p, cudaStream_t stream) {
  avgPoolGradKernel<T><<<blocksFor(p.planes * p.h * p.w), kThreads, 0, stream>>>(dy, dx, p);
  return cudaGetLastError();
}

#define WEFT_POOL(T)                                                                                        \
  template cudaError_t maxPool<T>(const T*, T*, const PoolShape&, cudaStream_t);                            \
  template cudaError_t maxPoolGrad<T>(const T*, const T*, const T*, T*, const PoolShape&, cudaStream_t);    \
  template cudaError_t avgPool<T>(const T*, T*, const PoolShape&, cudaStream_t);                            \
  template cudaError_t avgPoolGrad<T>(const T*, T*, const PoolShape&, cudaStream_t);
WEFT_POOL(float)
WEFT_POOL(double)
#undef WEFT_POOL

}  // namespace launch
}  // namespace weft::cudaops
