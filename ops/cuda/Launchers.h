// The launchers of weft's CUDA kernels: plain functions over device pointers, defined in the .cu
// files beside this header and called by the op kernels in the .cpp files of the same names.
// This header is the whole boundary between nvcc and the host compiler, so it holds plain data
// only (no weft core types). Each launcher queues its kernel on `stream` and returns the launch
// status for the caller to check.
#pragma once

#include "core/cuda/KernelError.h"
#include "ops/ElementwiseFunctors.h"  // WEFT_HOST_DEVICE
#include "ops/OptimizerRules.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace weft::cudaops {

constexpr int kMaxRank = 8;

/// Maps a flat index of an output shape to the offset of the element of an input that numpy
/// broadcasting pairs with it (stride 0 along broadcast axes).
struct BroadcastMap {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};

  WEFT_HOST_DEVICE int64_t offset(int64_t flat) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      off += (flat % dims[d]) * strides[d];
      flat /= dims[d];
    }
    return off;
  }
};

/// x seen as (kept axes) x (reduced axes): output o and reduced element r are at
/// kept.offset(o) + reduced.offset(r).
struct ReducePlan {
  BroadcastMap kept, reduced;
  int64_t outputs = 1, count = 1;
};

enum class Reduction { Sum, Mean, Max };

/// A tensor seen as rows over its last axis.
struct Rows {
  int64_t count, width;
};

/// Where a kernel records a data error of plan step `step`.
struct ErrorSink {
  cuda::KernelError* slot;
  int step;
};

namespace launch {

// ---- Elementwise.cu ----
/// out = F(a, b); maps are null when a and b have out's shape.
template <class F, class T>
cudaError_t binary(const T* a, const T* b, T* out, int64_t n, const BroadcastMap* ma, const BroadcastMap* mb,
                   cudaStream_t stream);
enum class Unary { Neg, Exp, Log, Tanh, Sigmoid, Relu, Sqrt, Rsqrt, Abs, Square, Reciprocal, Sign, Sin, Cos };
template <class T>
cudaError_t unary(Unary op, const T* x, T* out, int64_t n, cudaStream_t stream);
enum class ActivationGrad { Relu, Sigmoid, Tanh };
template <class T>
cudaError_t activationGrad(ActivationGrad op, const T* dy, const T* y, T* out, int64_t n, cudaStream_t stream);
template <class C, class T>
cudaError_t where(const C* c, const T* a, const T* b, T* out, int64_t n, const BroadcastMap& mc,
                  const BroadcastMap& ma, const BroadcastMap& mb, cudaStream_t stream);
template <class S, class D>
cudaError_t cast(const S* x, D* out, int64_t n, cudaStream_t stream);
/// out += x
template <class T>
cudaError_t accumulate(const T* x, T* out, int64_t n, cudaStream_t stream);
template <class T>
cudaError_t fill(T* out, T value, int64_t n, cudaStream_t stream);
/// out[i] = a * out[i] + b * x[i]
template <class T>
cudaError_t blend(const T* x, T* out, T a, T b, int64_t n, cudaStream_t stream);
/// out[i] = x[m.offset(i)] * scale
template <class T>
cudaError_t spread(const T* x, T* out, int64_t n, const BroadcastMap& m, T scale, cudaStream_t stream);
/// Records an integer division by zero for the first zero divisor.
template <class T>
cudaError_t checkDivisors(const T* b, int64_t n, ErrorSink errors, cudaStream_t stream);

// ---- Reduce.cu ----
template <class T>
cudaError_t reduce(Reduction kind, const T* x, T* out, const ReducePlan& plan, cudaStream_t stream);
template <class T>
cudaError_t argmax(const T* x, int64_t* out, int64_t outer, int64_t n, int64_t inner, cudaStream_t stream);

// ---- Softmax.cu ----
template <class T>
cudaError_t softmax(bool logSoftmax, const T* x, T* y, Rows rows, cudaStream_t stream);
template <class T, class I>
cudaError_t sparseXent(const T* x, const I* ids, T* loss, T* probs, Rows rows, int64_t ignoreIndex, ErrorSink errors,
                       cudaStream_t stream);
template <class T, class I>
cudaError_t sparseXentGrad(const T* probs, const I* ids, const T* dy, T* out, Rows rows, int64_t ignoreIndex,
                           ErrorSink errors, cudaStream_t stream);

// ---- Optimizers.cu ----
/// One dense update of rule R; lr (and for Adam the step count) are read on the device.
template <rules::Rule R, class T>
cudaError_t denseUpdate(const rules::Hyper& h, T* w, T* s1, T* s2, const T* g, const T* lr, const int64_t* step,
                        int64_t n, cudaStream_t stream);

}  // namespace launch
}  // namespace weft::cudaops
