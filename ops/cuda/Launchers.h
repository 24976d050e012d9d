// The launchers of weft's CUDA kernels: plain functions over device pointers, defined in the .cu
// files beside this header and called by the op kernels in the .cpp files of the same names.
// This header is the whole boundary between nvcc and the host compiler, so it holds plain data
// only (no weft core types). Each launcher queues its kernel on `stream` and returns the launch
// status for the caller to check.
#pragma once

#include "core/cuda/KernelError.h"
#include "core/HostDevice.h"
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
/// Up to kMaxAddends inputs of AddN.
constexpr int kMaxAddends = 16;
struct Addends {
  const void* x[kMaxAddends];
  int count;
};
/// out = the sum of the addends in order (computed in f32 for 16-bit types, rounded once), plus
/// out's own value first when `accumulate`.
template <class T>
cudaError_t addN(const Addends& addends, T* out, int64_t n, bool accumulate, cudaStream_t stream);
template <class T>
cudaError_t fill(T* out, T value, int64_t n, cudaStream_t stream);
/// out[i] = x[m.offset(i)] * scale (computed in f32 for the 16-bit types)
template <class T>
cudaError_t spread(const T* x, T* out, int64_t n, const BroadcastMap& m, double scale, cudaStream_t stream);
/// Records an integer division by zero, naming a zero divisor (the first to reach the record).
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
/// The sampled softmax's cross-entropy (ops/Softmax.cpp): rows of sampled logits beside their
/// true logits, and its gradient (dSampled may be probs).
template <class T>
cudaError_t sampledXent(const T* trueLogits, const T* sampled, T* loss, T* probs, T* trueProbs, Rows rows,
                        cudaStream_t stream);
template <class T>
cudaError_t sampledXentGrad(const T* probs, const T* trueProbs, const T* dy, T* dSampled, T* dTrue, Rows rows,
                            cudaStream_t stream);
/// y[r, c] -= penalty where rowIds[r] == columnIds[c], in place over y (rows x width).
template <class T, class I>
cudaError_t penalizeMatches(T* y, const I* rowIds, const I* columnIds, Rows rows, T penalty, cudaStream_t stream);

// ---- Shape.cu ----
/// dst[dstBase + dstMap.offset(i)] = src[srcBase + srcMap.offset(i)] for the n elements of the box
/// both maps describe (same dims); elements of 2, 4 or 8 bytes, copied as bits.
cudaError_t boxCopy(size_t elementBytes, const void* src, int64_t srcBase, const BroadcastMap& srcMap, void* dst,
                    int64_t dstBase, const BroadcastMap& dstMap, int64_t n, cudaStream_t stream);

/// Reverses the first lengths[b] steps along the sequence axis of each batch entry b; steps past
/// a length are copied. A length outside [0, seqLen] is recorded as an error.
template <class I>
cudaError_t reverseSequence(size_t elementBytes, const void* x, void* out, int64_t n, int64_t seqStride,
                            int64_t seqLen, int64_t batchStride, int64_t batch, const I* lengths, ErrorSink errors,
                            cudaStream_t stream);

// ---- Embedding.cu ----
/// out row i = params row ids[i] (rows of `width` elements of elementBytes each).
template <class I>
cudaError_t gatherRows(size_t elementBytes, const void* params, int64_t rows, int64_t width, const I* ids, int64_t n,
                       void* out, ErrorSink errors, cudaStream_t stream);
/// Records the first of n ids outside [0, limit): the check of ops whose data is empty.
template <class I>
cudaError_t checkIds(const I* ids, int64_t n, int64_t limit, ErrorSink errors, cudaStream_t stream);
/// Bytes of device workspace that sorting n ids needs (segmentSum, sparseUpdate).
template <class I>
size_t idSortWorkspaceBytes(int64_t n);
/// out row s = (init row s, or 0) + the sum, in position order, of the data rows whose id is s:
/// the ids are sorted stably, then one block sums each output row (deterministic).
template <class T, class I>
cudaError_t segmentSum(const T* data, const I* ids, int64_t n, int64_t width, const T* init, T* out,
                       int64_t segments, void* workspace, ErrorSink errors, cudaStream_t stream);

// ---- Rnn.cu (the gate math of one step over (batch, hidden); see ops/Rnn.cpp for the formulas) ----
/// gates (B, 4H): x wx + h wh on entry, activations i, f, g, o on exit; writes c and h.
template <class T>
cudaError_t lstmStep(int64_t batch, int64_t hidden, const T* bias, const T* cPrev, T* gates, T* c, T* h,
                     cudaStream_t stream);
/// dh, dc: gradients reaching h_t, c_t from later steps on entry; dc reaches c_{t-1} on exit.
template <class T>
cudaError_t lstmStepGrad(int64_t batch, int64_t hidden, const T* gates, const T* c, const T* cPrev, const T* dy,
                         T* dh, T* dc, T* dGates, cudaStream_t stream);
/// gates (B, 3H): x wx with h wh added on r and z on entry, activations r, z, n on exit;
/// hn (B, H): h wh_n on entry, + bh_n on exit.
template <class T>
cudaError_t gruCell(int64_t batch, int64_t hidden, const T* bx, const T* bh, const T* h, T* gates, T* hn, T* hNew,
                    cudaStream_t stream);
template <class T>
cudaError_t gruCellGrad(int64_t batch, int64_t hidden, const T* gates, const T* hn, const T* h, const T* dhNew,
                        T* dGx, T* dGh, T* dh, cudaStream_t stream);

// ---- Random.cu ----
/// mask[i] = keep where uniformAt(key, base + i) >= rate, else 0; y = x * mask (as on the CPU).
template <class T>
cudaError_t dropout(const T* x, T* y, T* mask, int64_t n, uint64_t key, uint64_t base, double rate, T keep,
                    cudaStream_t stream);

// ---- Clip.cu ----
/// out = sum of x^2, accumulated in double in a fixed order.
template <class T>
cudaError_t squaredNorm(const T* x, int64_t n, T* out, double* partials, cudaStream_t stream);
/// Partial sums squaredNorm needs (its `partials` workspace).
int64_t squaredNormPartials(int64_t n);
/// *flag = 0 when some x[i] is NaN or infinite; otherwise *flag is left as it is.
template <class T>
cudaError_t clearUnlessFinite(const T* x, int64_t n, float* flag, cudaStream_t stream);
/// *flag = value, on the stream.
cudaError_t setFlag(float* flag, float value, cudaStream_t stream);
/// out = sum over unique ids u of |the sum of the value rows with id u|^2; partials has n doubles.
template <class T, class I>
cudaError_t sparseSquaredNorm(const I* ids, const T* values, int64_t n, int64_t width, T* out, double* partials,
                              void* workspace, cudaStream_t stream);

// ---- Norm.cu ----
// x is seen as (N, C, S). T is the element type of x, y, dy and dx: f32 or f64, or a 16-bit type
// (BFloat16, Float16) whose statistics, gamma and beta are f32 (P). Each channel's N * S elements
// are split into parts, one block each; a part's sums land in `partials` (two doubles per part,
// batchNormPartials of them) and are combined in a fixed order, so results do not vary between
// runs.
struct NormShape {
  int64_t n, c, s;
};
/// Doubles of the `partials` workspace that the training ops need for this shape.
int64_t batchNormPartials(const NormShape& shape);
/// y = gamma (x - mean) invstd + beta with the batch's mean and biased variance, which are
/// written with invstd = 1 / sqrt(var + eps); with `relu`, y = max(0, that).
template <class T, class P>
cudaError_t batchNormTrain(const T* x, const P* gamma, const P* beta, T* y, P* mean, P* var, P* invstd, bool relu,
                           const NormShape& shape, double eps, double* partials, cudaStream_t stream);
/// dx, dgamma, dbeta of batchNormTrain; dmean and dvar may be null. `mask`, when not null, is the
/// fused ReLU's output: dy counts only where it is positive.
template <class T, class P>
cudaError_t batchNormGrad(const T* dy, const T* x, const T* mask, const P* gamma, const P* mean, const P* invstd,
                          const P* dmean, const P* dvar, T* dx, P* dgamma, P* dbeta, const NormShape& shape,
                          double* partials, cudaStream_t stream);
/// y = gamma (x - mean) / sqrt(var + eps) + beta with given statistics.
template <class T, class P>
cudaError_t batchNormInference(const T* x, const P* gamma, const P* beta, const P* mean, const P* var, T* y,
                               const NormShape& shape, double eps, cudaStream_t stream);

// ---- Pool.cu (planes = N * C of an NCHW tensor; T also a 16-bit type, computed in f32) ----
struct PoolShape {
  int64_t planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
};
template <class T>
cudaError_t maxPool(const T* x, T* y, const PoolShape& p, cudaStream_t stream);
/// Each output's gradient goes to the first element of its window equal to its maximum; an
/// input sums what reaches it in output order (as on the CPU). `winners`: one int32 per output.
template <class T>
cudaError_t maxPoolGrad(const T* x, const T* y, const T* dy, T* dx, const PoolShape& p, int32_t* winners,
                        cudaStream_t stream);
template <class T>
cudaError_t avgPool(const T* x, T* y, const PoolShape& p, cudaStream_t stream);
template <class T>
cudaError_t avgPoolGrad(const T* dy, T* dx, const PoolShape& p, cudaStream_t stream);

// ---- Optimizers.cu ----
// Every kernel that writes a variable leaves it as it was when the step has already recorded a
// data error: a failed step changes no variable on the GPU either (the CPU stops at the op).

/// The sparse update of rule R: repeated ids are summed first (in position order), so each
/// touched row is updated once, as on the CPU.
template <rules::Rule R, class T, class I>
cudaError_t sparseUpdate(const rules::Hyper& h, T* w, T* s1, T* s2, int64_t rows, int64_t width, const I* ids,
                         const T* values, int64_t n, const T* lr, const int64_t* step, void* workspace,
                         ErrorSink errors, cudaStream_t stream);
/// One dense update of rule R; lr (and for Adam the step count) are read on the device.
template <rules::Rule R, class T>
cudaError_t denseUpdate(const rules::Hyper& h, T* w, T* s1, T* s2, const T* g, const T* lr, const int64_t* step,
                        int64_t n, ErrorSink errors, cudaStream_t stream);
/// Assign: out = x, n elements of `elementBytes` bytes each.
cudaError_t assignVariable(const void* x, void* out, int64_t n, size_t elementBytes, ErrorSink errors,
                           cudaStream_t stream);
/// AssignAdd (a = 1, b = 1) and AssignMovingAverage: out[i] = a * out[i] + b * x[i].
template <class T>
cudaError_t blendVariable(const T* x, T* out, T a, T b, int64_t n, ErrorSink errors, cudaStream_t stream);

}  // namespace launch
}  // namespace weft::cudaops
