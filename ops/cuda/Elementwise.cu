// CUDA kernels of the elementwise ops (ops/Elementwise.cpp defines the ops; ops/cuda/Elementwise.cpp
// launches these).
#include "core/Half.h"
#include "ops/ElementwiseFunctors.h"
#include "ops/cuda/Device.cuh"

namespace weft::cudaops {
namespace {

template <class F, class T>
__global__ void binarySame(const T* a, const T* b, T* out, int64_t n) {
  WEFT_GRID_STRIDE(i, n) out[i] = F::apply(a[i], b[i]);
}

template <class F, class T>
__global__ void binaryBroadcast(const T* a, const T* b, T* out, int64_t n, BroadcastMap ma, BroadcastMap mb) {
  WEFT_GRID_STRIDE(i, n) out[i] = F::apply(a[ma.offset(i)], b[mb.offset(i)]);
}

// The CUDA math library overloads these for float and double.
template <class T>
__device__ T unaryValue(launch::Unary op, T x) {
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

template <class T>
__global__ void unaryKernel(launch::Unary op, const T* x, T* out, int64_t n) {
  WEFT_GRID_STRIDE(i, n) out[i] = unaryValue(op, x[i]);
}

// d/dx relu = [y > 0];  d/dx sigmoid = y (1 - y);  d/dx tanh = 1 - y^2
template <class T>
__global__ void activationGradKernel(launch::ActivationGrad op, const T* dy, const T* y, T* out, int64_t n) {
  WEFT_GRID_STRIDE(i, n) {
    const T g = dy[i], v = y[i];
    switch (op) {
      case launch::ActivationGrad::Relu: out[i] = v > T(0) ? g : T(0); break;
      case launch::ActivationGrad::Sigmoid: out[i] = g * v * (T(1) - v); break;
      case launch::ActivationGrad::Tanh: out[i] = g * (T(1) - v * v); break;
    }
  }
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
__global__ void accumulateKernel(const T* x, T* out, int64_t n) {
  WEFT_GRID_STRIDE(i, n) out[i] += x[i];
}

template <class T>
__global__ void fillKernel(T* out, T value, int64_t n) {
  WEFT_GRID_STRIDE(i, n) out[i] = value;
}

template <class T>
__global__ void spreadKernel(const T* x, T* out, int64_t n, BroadcastMap m, T scale) {
  WEFT_GRID_STRIDE(i, n) out[i] = x[m.offset(i)] * scale;
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
  if (ma) binaryBroadcast<F, T><<<blocksFor(n), kThreads, 0, stream>>>(a, b, out, n, *ma, *mb);
  else binarySame<F, T><<<blocksFor(n), kThreads, 0, stream>>>(a, b, out, n);
  return cudaGetLastError();
}

template <class T>
cudaError_t unary(Unary op, const T* x, T* out, int64_t n, cudaStream_t stream) {
  unaryKernel<T><<<blocksFor(n), kThreads, 0, stream>>>(op, x, out, n);
  return cudaGetLastError();
}

template <class T>
cudaError_t activationGrad(ActivationGrad op, const T* dy, const T* y, T* out, int64_t n, cudaStream_t stream) {
  activationGradKernel<T><<<blocksFor(n), kThreads, 0, stream>>>(op, dy, y, out, n);
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
cudaError_t accumulate(const T* x, T* out, int64_t n, cudaStream_t stream) {
  accumulateKernel<T><<<blocksFor(n), kThreads, 0, stream>>>(x, out, n);
  return cudaGetLastError();
}

template <class T>
cudaError_t fill(T* out, T value, int64_t n, cudaStream_t stream) {
  fillKernel<T><<<blocksFor(n), kThreads, 0, stream>>>(out, value, n);
  return cudaGetLastError();
}

template <class T>
cudaError_t spread(const T* x, T* out, int64_t n, const BroadcastMap& m, T scale, cudaStream_t stream) {
  spreadKernel<T><<<blocksFor(n), kThreads, 0, stream>>>(x, out, n, m, scale);
  return cudaGetLastError();
}

template <class T>
cudaError_t checkDivisors(const T* b, int64_t n, ErrorSink errors, cudaStream_t stream) {
  checkDivisorsKernel<T><<<blocksFor(n), kThreads, 0, stream>>>(b, n, errors);
  return cudaGetLastError();
}

// ---- instantiations: every computing dtype ----

#define WEFT_BINARY(F)                                                                                          \
  template cudaError_t binary<functors::F, float>(const float*, const float*, float*, int64_t, const BroadcastMap*, \
                                                  const BroadcastMap*, cudaStream_t);                           \
  template cudaError_t binary<functors::F, double>(const double*, const double*, double*, int64_t,              \
                                                   const BroadcastMap*, const BroadcastMap*, cudaStream_t);     \
  template cudaError_t binary<functors::F, int32_t>(const int32_t*, const int32_t*, int32_t*, int64_t,          \
                                                    const BroadcastMap*, const BroadcastMap*, cudaStream_t);    \
  template cudaError_t binary<functors::F, int64_t>(const int64_t*, const int64_t*, int64_t*, int64_t,          \
                                                    const BroadcastMap*, const BroadcastMap*, cudaStream_t);
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

#define WEFT_FLOATING(T)                                                                                      \
  template cudaError_t unary<T>(Unary, const T*, T*, int64_t, cudaStream_t);                                  \
  template cudaError_t activationGrad<T>(ActivationGrad, const T*, const T*, T*, int64_t, cudaStream_t);
WEFT_FLOATING(float)
WEFT_FLOATING(double)
#undef WEFT_FLOATING

#define WEFT_ANY(T)                                                                                           \
  template cudaError_t accumulate<T>(const T*, T*, int64_t, cudaStream_t);                                    \
  template cudaError_t fill<T>(T*, T, int64_t, cudaStream_t);                                                 \
  template cudaError_t spread<T>(const T*, T*, int64_t, const BroadcastMap&, T, cudaStream_t);                \
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
