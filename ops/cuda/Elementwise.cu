// CUDA kernels of the elementwise ops (ops/Elementwise.cpp defines the ops; ops/cuda/Elementwise.cpp
// launches these).
#include "core/Half.h"
#include "ops/ElementwiseFunctors.h"
#include "ops/cuda/Device.cuh"

namespace weft::cudaops {
namespace {

/// A 16-bit element as the float it holds (other types as they are), and back.
template <class T>
__device__ inline ComputeType<T> up(T x) {
  return static_cast<ComputeType<T>>(x);
}

template <class T>
__device__ inline T down(ComputeType<T> x) {
  return static_cast<T>(x);
}

template <class F, class T, int V>
__global__ void binarySame(const T* a, const T* b, T* out, int64_t n) {
  forPacks<V>(n, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const Pack<T, W> pa = loadPack<W>(a + i), pb = loadPack<W>(b + i);
    Pack<T, W> result;
#pragma unroll
    for (int j = 0; j < W; ++j) result.v[j] = down<T>(F::apply(up(pa.v[j]), up(pb.v[j])));
    storePack(out + i, result);
  });
}

template <class F, class T>
__global__ void binaryBroadcast(const T* a, const T* b, T* out, int64_t n, BroadcastMap ma, BroadcastMap mb) {
  WEFT_GRID_STRIDE(i, n) out[i] = down<T>(F::apply(up(a[ma.offset(i)]), up(b[mb.offset(i)])));
}

// The CUDA math library overloads these for float and double. The op is a template argument:
// a kernel that switched on it at run time carried every case's code and registers, which
// halved the speed of ReLU.
template <launch::Unary op, class T>
__device__ T unaryValue(T x) {
  using launch::Unary;
  switch (op) {
    case Unary::Neg: return -x;
    case Unary::Exp: return ::exp(x);
    case Unary::Log: return ::log(x);
    case Unary::Tanh: return ::tanh(x);
    case Unary::Sigmoid: return T(1) / (T(1) + ::exp(-x));
    case Unary::Relu: return x > T(0) ? x : T(0);
    case Unary::Sqrt: return ::sqrt(x);
    case Unary::Rsqrt: return ::rsqrt(x);
    case Unary::Abs: return ::fabs(x);
    case Unary::Square: return x * x;
    case Unary::Reciprocal: return T(1) / x;
    case Unary::Sign: return T((x > T(0)) - (x < T(0)));
    case Unary::Sin: return ::sin(x);
    case Unary::Cos: return ::cos(x);
  }
  return x;
}

template <launch::Unary op, class T, int V>
__global__ void unaryKernel(const T* x, T* out, int64_t n) {
  forPacks<V>(n, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const Pack<T, W> in = loadPack<W>(x + i);
    Pack<T, W> result;
#pragma unroll
    for (int j = 0; j < W; ++j) result.v[j] = down<T>(unaryValue<op>(up(in.v[j])));
    storePack(out + i, result);
  });
}

template <launch::Unary op, class T>
void launchUnary(const T* x, T* out, int64_t n, cudaStream_t stream) {
  withPackWidth<T>(packWidth<T>({x, out}), [&](auto width) {
    constexpr int V = decltype(width)::value;
    unaryKernel<op, T, V><<<blocksFor((n + V - 1) / V), kThreads, 0, stream>>>(x, out, n);
  });
}

// d/dx relu = [y > 0];  d/dx sigmoid = y (1 - y);  d/dx tanh = 1 - y^2
template <class T>
__device__ T activationGradValue(launch::ActivationGrad op, T g, T v) {
  switch (op) {
    case launch::ActivationGrad::Relu: return v > T(0) ? g : T(0);
    case launch::ActivationGrad::Sigmoid: return g * v * (T(1) - v);
    case launch::ActivationGrad::Tanh: return g * (T(1) - v * v);
  }
  return g;
}

template <class T, int V>
__global__ void activationGradKernel(launch::ActivationGrad op, const T* dy, const T* y, T* out, int64_t n) {
  forPacks<V>(n, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const Pack<T, W> g = loadPack<W>(dy + i), v = loadPack<W>(y + i);
    Pack<T, W> result;
#pragma unroll
    for (int j = 0; j < W; ++j) result.v[j] = down<T>(activationGradValue(op, up(g.v[j]), up(v.v[j])));
    storePack(out + i, result);
  });
}

// out = x_0 + x_1 + ... in that order, in T's compute type, rounded once; `accumulate` adds out's
// own value first (addends beyond launch::kMaxAddends).
template <class T, int V>
__global__ void addNKernel(launch::Addends addends, T* out, int64_t n, bool accumulate) {
  forPacks<V>(n, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    ComputeType<T> total[W];
    const Pack<T, W> first = accumulate ? loadPack<W>(out + i) : loadPack<W>(static_cast<const T*>(addends.x[0]) + i);
#pragma unroll
    for (int j = 0; j < W; ++j) total[j] = up(first.v[j]);
    for (int k = accumulate ? 0 : 1; k < addends.count; ++k) {
      const Pack<T, W> next = loadPack<W>(static_cast<const T*>(addends.x[k]) + i);
#pragma unroll
      for (int j = 0; j < W; ++j) total[j] += up(next.v[j]);
    }
    Pack<T, W> result;
#pragma unroll
    for (int j = 0; j < W; ++j) result.v[j] = down<T>(total[j]);
    storePack(out + i, result);
  });
}

template <class C, class T>
__global__ void whereKernel(const C* c, const T* a, const T* b, T* out, int64_t n, BroadcastMap mc, BroadcastMap ma,
                            BroadcastMap mb) {
  WEFT_GRID_STRIDE(i, n) out[i] = c[mc.offset(i)] != C(0) ? a[ma.offset(i)] : b[mb.offset(i)];
}

template <class S, class D>
__global__ void castKernel(const S* x, D* out, int64_t n) {
  WEFT_GRID_STRIDE(i, n) out[i] = convertElement<D>(x[i]);
}

template <class T>
__global__ void fillKernel(T* out, T value, int64_t n) {
  WEFT_GRID_STRIDE(i, n) out[i] = value;
}

template <class T>
__global__ void spreadKernel(const T* x, T* out, int64_t n, BroadcastMap m, ComputeType<T> scale) {
  WEFT_GRID_STRIDE(i, n) out[i] = down<T>(up(x[m.offset(i)]) * scale);
}

template <class T>
__global__ void checkDivisorsKernel(const T* b, int64_t n, ErrorSink errors) {
  WEFT_GRID_STRIDE(i, n) {
    if (b[i] == T(0)) raiseError(errors, cuda::KernelError::IntegerDivisionByZero, 0, i, 0);
  }
}

}  // namespace

namespace launch {

template <class F, class T>
cudaError_t binary(const T* a, const T* b, T* out, int64_t n, const BroadcastMap* ma, const BroadcastMap* mb,
                   cudaStream_t stream) {
  if (ma) {
    binaryBroadcast<F, T><<<blocksFor(n), kThreads, 0, stream>>>(a, b, out, n, *ma, *mb);
  } else {
    withPackWidth<T>(packWidth<T>({a, b, out}), [&](auto width) {
      constexpr int V = decltype(width)::value;
      binarySame<F, T, V><<<blocksFor((n + V - 1) / V), kThreads, 0, stream>>>(a, b, out, n);
    });
  }
  return cudaGetLastError();
}

template <class T>
cudaError_t unary(Unary op, const T* x, T* out, int64_t n, cudaStream_t stream) {
  switch (op) {
    case Unary::Neg: launchUnary<Unary::Neg>(x, out, n, stream); break;
    case Unary::Exp: launchUnary<Unary::Exp>(x, out, n, stream); break;
    case Unary::Log: launchUnary<Unary::Log>(x, out, n, stream); break;
    case Unary::Tanh: launchUnary<Unary::Tanh>(x, out, n, stream); break;
    case Unary::Sigmoid: launchUnary<Unary::Sigmoid>(x, out, n, stream); break;
    case Unary::Relu: launchUnary<Unary::Relu>(x, out, n, stream); break;
    case Unary::Sqrt: launchUnary<Unary::Sqrt>(x, out, n, stream); break;
    case Unary::Rsqrt: launchUnary<Unary::Rsqrt>(x, out, n, stream); break;
    case Unary::Abs: launchUnary<Unary::Abs>(x, out, n, stream); break;
    case Unary::Square: launchUnary<Unary::Square>(x, out, n, stream); break;
    case Unary::Reciprocal: launchUnary<Unary::Reciprocal>(x, out, n, stream); break;
    case Unary::Sign: launchUnary<Unary::Sign>(x, out, n, stream); break;
    case Unary::Sin: launchUnary<Unary::Sin>(x, out, n, stream); break;
    case Unary::Cos: launchUnary<Unary::Cos>(x, out, n, stream); break;
  }
  return cudaGetLastError();
}

template <class T>
cudaError_t activationGrad(ActivationGrad op, const T* dy, const T* y, T* out, int64_t n, cudaStream_t stream) {
  withPackWidth<T>(packWidth<T>({dy, y, out}), [&](auto width) {
    constexpr int V = decltype(width)::value;
    activationGradKernel<T, V><<<blocksFor((n + V - 1) / V), kThreads, 0, stream>>>(op, dy, y, out, n);
  });
  return cudaGetLastError();
}

template <class T>
cudaError_t addN(const Addends& addends, T* out, int64_t n, bool accumulate, cudaStream_t stream) {
  bool aligned = packWidth<T>({out}) > 1;
  for (int k = 0; k < addends.count; ++k) aligned = aligned && packWidth<T>({addends.x[k]}) > 1;
  withPackWidth<T>(aligned ? packWidth<T>({}) : 1, [&](auto width) {
    constexpr int V = decltype(width)::value;
    addNKernel<T, V><<<blocksFor((n + V - 1) / V), kThreads, 0, stream>>>(addends, out, n, accumulate);
  });
  return cudaGetLastError();
}

template <class C, class T>
cudaError_t where(const C* c, const T* a, const T* b, T* out, int64_t n, const BroadcastMap& mc,
                  const BroadcastMap& ma, const BroadcastMap& mb, cudaStream_t stream) {
  whereKernel<C, T><<<blocksFor(n), kThreads, 0, stream>>>(c, a, b, out, n, mc, ma, mb);
  return cudaGetLastError();
}

template <class S, class D>
cudaError_t cast(const S* x, D* out, int64_t n, cudaStream_t stream) {
  castKernel<S, D><<<blocksFor(n), kThreads, 0, stream>>>(x, out, n);
  return cudaGetLastError();
}

template <class T>
cudaError_t fill(T* out, T value, int64_t n, cudaStream_t stream) {
  fillKernel<T><<<blocksFor(n), kThreads, 0, stream>>>(out, value, n);
  return cudaGetLastError();
}

template <class T>
cudaError_t spread(const T* x, T* out, int64_t n, const BroadcastMap& m, double scale, cudaStream_t stream) {
  spreadKernel<T><<<blocksFor(n), kThreads, 0, stream>>>(x, out, n, m, static_cast<ComputeType<T>>(scale));
  return cudaGetLastError();
}

template <class T>
cudaError_t checkDivisors(const T* b, int64_t n, ErrorSink errors, cudaStream_t stream) {
  checkDivisorsKernel<T><<<blocksFor(n), kThreads, 0, stream>>>(b, n, errors);
  return cudaGetLastError();
}

// ---- instantiations: every computing dtype ----

#define WEFT_BINARY_OF(F, T) \
  template cudaError_t binary<functors::F, T>(const T*, const T*, T*, int64_t, const BroadcastMap*, \
                                              const BroadcastMap*, cudaStream_t);
#define WEFT_BINARY(F)         \
  WEFT_BINARY_OF(F, float)     \
  WEFT_BINARY_OF(F, double)    \
  WEFT_BINARY_OF(F, int32_t)   \
  WEFT_BINARY_OF(F, int64_t)   \
  WEFT_BINARY_OF(F, BFloat16)  \
  WEFT_BINARY_OF(F, Float16)
WEFT_BINARY(Add)
WEFT_BINARY(Sub)
WEFT_BINARY(Mul)
WEFT_BINARY(Div)
WEFT_BINARY(Max)
WEFT_BINARY(Min)
WEFT_BINARY(Pow)
WEFT_BINARY(Less)
WEFT_BINARY(LessEqual)
WEFT_BINARY(Greater)
WEFT_BINARY(GreaterEqual)
WEFT_BINARY(Equal)
WEFT_BINARY(NotEqual)
#undef WEFT_BINARY
#undef WEFT_BINARY_OF

#define WEFT_FLOATING(T)                                                                                      \
  template cudaError_t unary<T>(Unary, const T*, T*, int64_t, cudaStream_t);                                  \
  template cudaError_t activationGrad<T>(ActivationGrad, const T*, const T*, T*, int64_t, cudaStream_t);      \
  template cudaError_t addN<T>(const Addends&, T*, int64_t, bool, cudaStream_t);
WEFT_FLOATING(float)
WEFT_FLOATING(double)
WEFT_FLOATING(BFloat16)
WEFT_FLOATING(Float16)
#undef WEFT_FLOATING
template cudaError_t spread<BFloat16>(const BFloat16*, BFloat16*, int64_t, const BroadcastMap&, double, cudaStream_t);
template cudaError_t spread<Float16>(const Float16*, Float16*, int64_t, const BroadcastMap&, double, cudaStream_t);
template cudaError_t addN<int32_t>(const Addends&, int32_t*, int64_t, bool, cudaStream_t);
template cudaError_t addN<int64_t>(const Addends&, int64_t*, int64_t, bool, cudaStream_t);

#define WEFT_ANY(T)                                                                                           \
  template cudaError_t fill<T>(T*, T, int64_t, cudaStream_t);                                                 \
  template cudaError_t spread<T>(const T*, T*, int64_t, const BroadcastMap&, double, cudaStream_t);           \
  template cudaError_t checkDivisors<T>(const T*, int64_t, ErrorSink, cudaStream_t);                          \
  template cudaError_t where<float, T>(const float*, const T*, const T*, T*, int64_t, const BroadcastMap&,     \
                                       const BroadcastMap&, const BroadcastMap&, cudaStream_t);               \
  template cudaError_t where<double, T>(const double*, const T*, const T*, T*, int64_t, const BroadcastMap&,  \
                                        const BroadcastMap&, const BroadcastMap&, cudaStream_t);              \
  template cudaError_t where<int32_t, T>(const int32_t*, const T*, const T*, T*, int64_t, const BroadcastMap&, \
                                         const BroadcastMap&, const BroadcastMap&, cudaStream_t);             \
  template cudaError_t where<int64_t, T>(const int64_t*, const T*, const T*, T*, int64_t, const BroadcastMap&, \
                                         const BroadcastMap&, const BroadcastMap&, cudaStream_t);
WEFT_ANY(float)
WEFT_ANY(double)
WEFT_ANY(int32_t)
WEFT_ANY(int64_t)
#undef WEFT_ANY
template cudaError_t fill<uint16_t>(uint16_t*, uint16_t, int64_t, cudaStream_t);  // 16-bit floats, as bits

#define WEFT_CAST_TO(S, D) template cudaError_t cast<S, D>(const S*, D*, int64_t, cudaStream_t);
#define WEFT_CAST(S)            \
  WEFT_CAST_TO(S, float)        \
  WEFT_CAST_TO(S, double)       \
  WEFT_CAST_TO(S, int32_t)      \
  WEFT_CAST_TO(S, int64_t)      \
  WEFT_CAST_TO(S, BFloat16)     \
  WEFT_CAST_TO(S, Float16)
WEFT_CAST(float)
WEFT_CAST(double)
WEFT_CAST(int32_t)
WEFT_CAST(int64_t)
WEFT_CAST(BFloat16)
WEFT_CAST(Float16)
#undef WEFT_CAST
#undef WEFT_CAST_TO

}  // namespace launch
}  // namespace weft::cudaops
