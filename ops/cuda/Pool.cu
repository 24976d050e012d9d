// CUDA kernels of max and average pooling (ops/Conv.cpp defines the ops; ops/cuda/Pool.cpp
// launches these). Forward: a thread per output. Backward: a thread per input, gathering from
// the outputs whose window holds it in output order, so no atomics and the CPU's sums; the max
// pool's gradient first finds each output's winning element once (a thread per output), so an
// input looks up at most a few indices instead of scanning every window that holds it. Index
// arithmetic is 32-bit where the tensors allow (64-bit divisions cost several times more), and
// 16-bit tensors compute in f32.
#include "ops/cuda/Device.cuh"

namespace weft::cudaops {
namespace {

using launch::PoolShape;

/// PoolShape in the index type I.
template <class I>
struct Geometry {
  I planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
  explicit Geometry(const PoolShape& p)
      : planes(static_cast<I>(p.planes)), h(static_cast<I>(p.h)), w(static_cast<I>(p.w)), oh(static_cast<I>(p.oh)),
        ow(static_cast<I>(p.ow)), kh(static_cast<I>(p.kh)), kw(static_cast<I>(p.kw)), sh(static_cast<I>(p.sh)),
        sw(static_cast<I>(p.sw)), ph(static_cast<I>(p.ph)), pw(static_cast<I>(p.pw)) {}
};

template <class I>
__device__ inline I larger(I a, I b) {
  return a > b ? a : b;
}
template <class I>
__device__ inline I smaller(I a, I b) {
  return a < b ? a : b;
}

/// Clipped window rows [y0, y1) and columns [x0, x1) of output (oy, ox).
template <class I>
struct Window {
  I y0, y1, x0, x1;
  __device__ Window(const Geometry<I>& p, I oy, I ox)
      : y0(larger<I>(0, oy * p.sh - p.ph)), y1(smaller<I>(p.h, oy * p.sh - p.ph + p.kh)),
        x0(larger<I>(0, ox * p.sw - p.pw)), x1(smaller<I>(p.w, ox * p.sw - p.pw + p.kw)) {}
  __device__ I count() const { return larger<I>(0, y1 - y0) * larger<I>(0, x1 - x0); }
};

/// The outputs [lo, hi] along one axis whose window (stride s, padding pad, size k) holds input i.
template <class I>
__device__ inline void outputsHolding(I i, I s, I pad, I k, I outSize, I& lo, I& hi) {
  const I first = i + pad - k + 1;  // o * s >= first
  lo = first <= 0 ? 0 : (first + s - 1) / s;
  hi = smaller<I>(outSize - 1, (i + pad) / s);
}

#define WEFT_GRID_STRIDE_AS(I, i, n)                                                     \
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x))

/// Each output reduces its window: the maximum, or the mean.
template <class T, class I, bool kMax>
__global__ void poolKernel(const T* x, T* y, Geometry<I> p) {
  using C = ComputeType<T>;
  WEFT_GRID_STRIDE_AS(I, k, p.planes * p.oh * p.ow) {
    const I plane = k / (p.oh * p.ow), oy = (k / p.ow) % p.oh, ox = k % p.ow;
    const T* px = x + plane * p.h * p.w;
    const Window<I> win(p, oy, ox);
    C acc = kMax ? C(-INFINITY) : C(0);
    for (I iy = win.y0; iy < win.y1; ++iy) {
      for (I ix = win.x0; ix < win.x1; ++ix) {
        const C v = static_cast<C>(px[iy * p.w + ix]);
        acc = kMax ? (acc < v ? v : acc) : acc + v;
      }
    }
    y[k] = static_cast<T>(win.count() == 0 ? C(0) : kMax ? acc : acc / static_cast<C>(win.count()));
  }
}

/// The sum, in output order, of share(o, window of o) over the outputs o whose window holds input
/// element k (flat over planes, rows, columns).
template <class C, class I, class Share>
__device__ C gatherFromOutputs(const Geometry<I>& p, I k, Share share) {
  const I plane = k / (p.h * p.w), iy = (k / p.w) % p.h, ix = k % p.w;
  I oy0, oy1, ox0, ox1;
  outputsHolding<I>(iy, p.sh, p.ph, p.kh, p.oh, oy0, oy1);
  outputsHolding<I>(ix, p.sw, p.pw, p.kw, p.ow, ox0, ox1);
  C total = 0;
  for (I oy = oy0; oy <= oy1; ++oy) {
    for (I ox = ox0; ox <= ox1; ++ox) total += share((plane * p.oh + oy) * p.ow + ox, oy, ox);
  }
  return total;
}

/// winner[o] = the position in its plane of the first element of output o's window equal to
/// y[o] (its maximum), -1 when none is (a NaN).
template <class T, class I>
__global__ void winnersKernel(const T* x, const T* y, int32_t* winner, Geometry<I> p) {
  using C = ComputeType<T>;
  WEFT_GRID_STRIDE_AS(I, k, p.planes * p.oh * p.ow) {
    const I plane = k / (p.oh * p.ow), oy = (k / p.ow) % p.oh, ox = k % p.ow;
    const T* px = x + plane * p.h * p.w;
    const Window<I> win(p, oy, ox);
    const C best = static_cast<C>(y[k]);
    int32_t found = -1;
    for (I iy = win.y0; iy < win.y1 && found < 0; ++iy) {
      for (I ix = win.x0; ix < win.x1; ++ix) {
        if (static_cast<C>(px[iy * p.w + ix]) == best) {
          found = static_cast<int32_t>(iy * p.w + ix);
          break;
        }
      }
    }
    winner[k] = found;
  }
}

template <class T, class I>
__global__ void maxPoolGradKernel(const int32_t* winner, const T* dy, T* dx, Geometry<I> p) {
  using C = ComputeType<T>;
  WEFT_GRID_STRIDE_AS(I, k, p.planes * p.h * p.w) {
    const int32_t self = static_cast<int32_t>(k % (p.h * p.w));
    dx[k] = static_cast<T>(gatherFromOutputs<C>(p, k, [&](I o, I, I) {
      return winner[o] == self ? static_cast<C>(dy[o]) : C(0);
    }));
  }
}

template <class T, class I>
__global__ void avgPoolGradKernel(const T* dy, T* dx, Geometry<I> p) {
  using C = ComputeType<T>;
  WEFT_GRID_STRIDE_AS(I, k, p.planes * p.h * p.w) {
    dx[k] = static_cast<T>(gatherFromOutputs<C>(p, k, [&](I o, I oy, I ox) {
      return static_cast<C>(dy[o]) / static_cast<C>(Window<I>(p, oy, ox).count());
    }));
  }
}

/// Calls f(Geometry<I>) with 32-bit indices when every flat index of the op fits them.
template <class F>
void withIndexType(const PoolShape& p, F f) {
  const int64_t largest = p.planes * (p.h * p.w > p.oh * p.ow ? p.h * p.w : p.oh * p.ow);
  // The grid-stride loop's last step may overshoot the count by one grid.
  if (largest + (int64_t{1} << 16) * kThreads < INT32_MAX) f(Geometry<int32_t>(p));
  else f(Geometry<int64_t>(p));
}

}  // namespace

namespace launch {

template <class T>
cudaError_t maxPool(const T* x, T* y, const PoolShape& p, cudaStream_t stream) {
  withIndexType(p, [&](auto g) {
    using I = decltype(g.h);
    poolKernel<T, I, true><<<blocksFor(p.planes * p.oh * p.ow), kThreads, 0, stream>>>(x, y, g);
  });
  return cudaGetLastError();
}

template <class T>
cudaError_t maxPoolGrad(const T* x, const T* y, const T* dy, T* dx, const PoolShape& p, int32_t* winners,
                        cudaStream_t stream) {
  withIndexType(p, [&](auto g) {
    using I = decltype(g.h);
    winnersKernel<T, I><<<blocksFor(p.planes * p.oh * p.ow), kThreads, 0, stream>>>(x, y, winners, g);
    maxPoolGradKernel<T, I><<<blocksFor(p.planes * p.h * p.w), kThreads, 0, stream>>>(winners, dy, dx, g);
  });
  return cudaGetLastError();
}

template <class T>
cudaError_t avgPool(const T* x, T* y, const PoolShape& p, cudaStream_t stream) {
  withIndexType(p, [&](auto g) {
    using I = decltype(g.h);
    poolKernel<T, I, false><<<blocksFor(p.planes * p.oh * p.ow), kThreads, 0, stream>>>(x, y, g);
  });
  return cudaGetLastError();
}

template <class T>
cudaError_t avgPoolGrad(const T* dy, T* dx, const PoolShape& p, cudaStream_t stream) {
  withIndexType(p, [&](auto g) {
    using I = decltype(g.h);
    avgPoolGradKernel<T, I><<<blocksFor(p.planes * p.h * p.w), kThreads, 0, stream>>>(dy, dx, g);
  });
  return cudaGetLastError();
}

#define WEFT_POOL(T)                                                                                        \
  template cudaError_t maxPool<T>(const T*, T*, const PoolShape&, cudaStream_t);                            \
  template cudaError_t maxPoolGrad<T>(const T*, const T*, const T*, T*, const PoolShape&, int32_t*,         \
                                      cudaStream_t);                                                        \
  template cudaError_t avgPool<T>(const T*, T*, const PoolShape&, cudaStream_t);                            \
  template cudaError_t avgPoolGrad<T>(const T*, T*, const PoolShape&, cudaStream_t);
WEFT_POOL(float)
WEFT_POOL(double)
WEFT_POOL(BFloat16)
WEFT_POOL(Float16)
#undef WEFT_POOL

}  // namespace launch
}  // namespace weft::cudaops
