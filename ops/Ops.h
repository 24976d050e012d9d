// The op builders: functions that append ops to the graph of their inputs and return their
// outputs. Every op's definition (shape function, CPU kernel, gradient rule) lives in the family
// file named beside each group. Shapes in comments: (N, C) etc.
#pragma once

#include "core/Graph.h"
#include "core/OpRegistry.h"

#include <string>
#include <utility>
#include <vector>

namespace weft {

// ---- Elementwise.cpp: numpy-style broadcasting arithmetic and unary math -------------------
Output add(Output a, Output b);
Output sub(Output a, Output b);
Output mul(Output a, Output b);
Output div(Output a, Output b);
Output maximum(Output a, Output b);
Output minimum(Output a, Output b);
Output pow(Output a, Output b);
/// A scalar constant of x's dtype.
Output scalarLike(Output x, double value);

Output operator+(Output a, Output b);
Output operator-(Output a, Output b);
Output operator*(Output a, Output b);
Output operator/(Output a, Output b);
Output operator-(Output a);
Output operator+(Output a, double b);
Output operator-(Output a, double b);
Output operator*(Output a, double b);
Output operator/(Output a, double b);
Output operator+(double a, Output b);
Output operator-(double a, Output b);
Output operator*(double a, Output b);
Output operator/(double a, Output b);

Output neg(Output x);
Output exp(Output x);
Output log(Output x);
Output tanh(Output x);
Output sigmoid(Output x);
Output relu(Output x);
Output sqrt(Output x);
Output rsqrt(Output x);
Output abs(Output x);
Output square(Output x);
Output reciprocal(Output x);
Output sign(Output x);
Output sin(Output x);
Output cos(Output x);

/// Comparisons give 1 where true and 0 where false, in the inputs' dtype.
Output less(Output a, Output b);
Output lessEqual(Output a, Output b);
Output greater(Output a, Output b);
Output greaterEqual(Output a, Output b);
Output equal(Output a, Output b);
Output notEqual(Output a, Output b);
/// Elementwise cond != 0 ? a : b, broadcasting all three.
Output where(Output cond, Output a, Output b);

Output cast(Output x, DType to);
/// Sum of same-typed, same-shaped tensors.
Output addN(const std::vector<Output>& xs);
Output identity(Output x);
/// Identity whose gradient is zero.
Output stopGradient(Output x);
Output zerosLike(Output x);
Output onesLike(Output x);
/// Sums `x` over the axes on which it was broadcast to reach its shape from `like`'s shape.
Output reduceToLike(Output x, Output like);
/// Broadcasts `x` to `like`'s shape.
Output broadcastLike(Output x, Output like);
/// Identity that fails, naming `message`, when x holds NaN or Inf.
Output checkNumerics(Output x, const std::string& message);

// ---- MatMul.cpp ---------------------------------------------------------------------------
/// (M, K) x (K, N) -> (M, N); transposes apply to the last two axes.
Output matmul(Output a, Output b, bool transposeA = false, bool transposeB = false);
/// (..., M, K) x (..., K, N) -> (..., M, N) with equal batch dimensions.
Output batchMatmul(Output a, Output b, bool transposeA = false, bool transposeB = false);
/// Lets f32 products on GPUs run on TF32 tensor cores (inputs rounded to a 10-bit mantissa,
/// f32 accumulation): much faster, less exact. Off by default; the CPU is unaffected.
void allowTF32(bool allow);
bool tf32Allowed();

// ---- Reduce.cpp ---------------------------------------------------------------------------
/// Reductions over `axes` (all axes when empty); negative axes count from the end.
Output sum(Output x, std::vector<int64_t> axes = {}, bool keepDims = false);
Output mean(Output x, std::vector<int64_t> axes = {}, bool keepDims = false);
Output max(Output x, std::vector<int64_t> axes = {}, bool keepDims = false);
/// Index of the maximum along `axis` (first on ties), as i64.
Output argmax(Output x, int64_t axis);

// ---- Shape.cpp: layout ops ----------------------------------------------------------------
/// One dimension may be -1 (inferred from the element count).
Output reshape(Output x, std::vector<int64_t> shape);
Output transpose(Output x, std::vector<int64_t> perm);
Output concat(const std::vector<Output>& xs, int64_t axis);
/// Splits `axis` into pieces of the given sizes.
std::vector<Output> split(Output x, std::vector<int64_t> sizes, int64_t axis);
/// size -1 takes the rest of the axis.
Output slice(Output x, std::vector<int64_t> begin, std::vector<int64_t> size);
/// paddings: (before, after) per axis, flattened: {b0, a0, b1, a1, ...}.
Output pad(Output x, std::vector<int64_t> paddings, double value = 0.0);
/// Reverses the first lengths[b] items of each sequence along seqAxis.
Output reverseSequence(Output x, Output lengths, int64_t seqAxis, int64_t batchAxis);
Output expandDims(Output x, int64_t axis);
Output squeeze(Output x, std::vector<int64_t> axes);

// ---- Softmax.cpp: softmax and losses (over the last axis) ----------------------------------
Output softmax(Output logits);
Output logSoftmax(Output logits);
/// Per-example -sum(labels * log softmax(logits)); labels (N, C) like logits.
Output softmaxCrossEntropy(Output logits, Output labels);
/// Per-example -log softmax(logits)[id]; ids (N) i32/i64; ids equal to ignoreIndex give 0 loss
/// and 0 gradient. Ids outside [0, C) other than ignoreIndex are an error.
Output sparseSoftmaxCrossEntropy(Output logits, Output ids, int64_t ignoreIndex = -100);
/// Per-row -log softmax([t, s_1 .. s_S])[0] for true logits t (N) and sampled logits s (N, S):
/// a sampled softmax's loss with the true class's logit kept apart, so that no (N, S + 1) matrix
/// is concatenated, nor its gradient split.
Output sampledSoftmaxCrossEntropy(Output trueLogits, Output sampledLogits);
/// logits (N, C) with `penalty` subtracted where rowIds[n] == columnIds[c] (ids i32 or i64, of
/// one dtype), other elements as they are: a sampled softmax's accidental hits, a candidate that
/// is the row's own target, pushed out of the softmax. One pass over the matches alone where it
/// runs in place; the gradient passes through unchanged (the penalty is a constant).
Output penalizeMatches(Output logits, Output rowIds, Output columnIds, double penalty);

// ---- Embedding.cpp: gather and scatter ---------------------------------------------------
/// Rows of params (V, ...) at ids (...): (..., ...). The gradient for params is sparse.
Output gather(Output params, Output ids);
/// x with updates (n, ...) added at rows ids (n) (duplicates accumulate).
Output scatterAdd(Output x, Output ids, Output updates);
/// out[s] = sum of data rows whose segment id is s; (numSegments, ...).
Output unsortedSegmentSum(Output data, Output segmentIds, int64_t numSegments);

// ---- Conv.cpp: NCHW convolution and pooling ----------------------------------------------
struct Conv2dOptions {
  std::vector<int64_t> stride{1, 1};
  std::vector<int64_t> padding{0, 0};   // symmetric (h, w)
  std::vector<int64_t> dilation{1, 1};
};
/// x (N, C, H, W), filter (O, C, kh, kw) -> (N, O, H', W').
Output conv2d(Output x, Output filter, const Conv2dOptions& options = {});
Output maxPool2d(Output x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                 std::vector<int64_t> padding = {0, 0});
/// Averages over the window's in-bounds elements.
Output avgPool2d(Output x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                 std::vector<int64_t> padding = {0, 0});
/// (N, C, H, W) -> (N, C).
Output globalAvgPool(Output x);
/// Lets GPU convolutions take cuDNN's non-deterministic algorithms (which sum partial results
/// with atomics, so their bits vary from run to run) where cuDNN's timing finds them fastest, as
/// PyTorch's cudnn.benchmark does without cudnn.deterministic. Off by default: every algorithm is
/// deterministic and a step gives the same bits every run. Applies to shapes planned afterwards.
void allowNondeterministicConvolutions(bool allow);
bool nondeterministicConvolutionsAllowed();

// ---- Norm.cpp: batch normalisation over all axes but 1 ------------------------------------
struct BatchNormOutputs {
  Output y, batchMean, batchVar;
};
/// Training mode: normalises with the batch's statistics (biased variance). With `relu`, y is
/// max(0, the normalised x) in the same op (minimize() fuses a batch norm and the ReLU after it
/// this way by itself).
BatchNormOutputs batchNormTrain(Output x, Output gamma, Output beta, double epsilon, bool relu = false);
/// Training mode from per-channel moments summed over a batch that is split across workers:
/// batchNormMoments gives x's (count, sum, sum of squares) per channel as f64 (3, C); once they
/// are summed over every worker's part, batchNormFromMoments normalises x with the total batch's
/// statistics. The distribution layer builds these (and their gradient ops) from batchNormTrain.
Output batchNormMoments(Output x);
BatchNormOutputs batchNormFromMoments(Output x, Output gamma, Output beta, Output moments, double epsilon);
/// Inference mode: normalises with given statistics.
Output batchNormInference(Output x, Output gamma, Output beta, Output mean, Output var,
                          double epsilon);

// ---- Random.cpp --------------------------------------------------------------------------
/// Zeroes each element with probability `rate` and scales the rest by 1/(1-rate); the mask is a
/// function of (seed, session step, element), so runs are reproducible.
Output dropout(Output x, double rate, uint64_t seed);

// ---- Rnn.cpp: fused recurrent layers ------------------------------------------------------
struct LstmOutputs {
  Output y;      // (T, B, H): hidden state at every step
  Output hLast;  // (B, H)
  Output cLast;  // (B, H)
};
/// A whole-sequence LSTM: x (T, B, I), h0 and c0 (B, H), wx (I, 4H), wh (H, 4H), b (4H); gate
/// order i, f, g, o. Gradients flow to every input.
LstmOutputs lstm(Output x, Output h0, Output c0, Output wx, Output wh, Output b);
/// One GRU step: x (B, I), h (B, H), wx (I, 3H), wh (H, 3H), bx and bh (3H); gate order r, z, n;
/// h' = (1 - z) * n + z * h with n = tanh(x wx_n + bx_n + r * (h wh_n + bh_n)).
Output gruCell(Output x, Output h, Output wx, Output wh, Output bx, Output bh);

// ---- Clip.cpp ----------------------------------------------------------------------------
/// sum(x^2) as a scalar of x's dtype.
Output squaredNorm(Output x);
/// sum over unique rows of (sum of the rows of `values` sharing an index)^2: the squared norm
/// of the dense tensor a sparse gradient stands for.
Output sparseSquaredNorm(Output indices, Output values);
/// Scales every gradient by clipNorm / max(globalNorm, clipNorm); sparse gradients count by their
/// dense value. Returns the scaled gradients and the global norm (before clipping).
std::pair<std::vector<Grad>, Output> clipByGlobalNorm(const std::vector<Grad>& grads, double clipNorm);
/// An f32 scalar: 1 when every element of every input (f32 or f64) is finite, else 0 (any NaN or
/// infinity).
Output allFinite(const std::vector<Output>& xs);

// ---- State.cpp: variables -----------------------------------------------------------------
/// variable := value. Nodes without outputs; run them as targets.
Node* assign(Output variable, Output value);
/// variable += value.
Node* assignAdd(Output variable, Output value);
/// variable = decay * variable + (1 - decay) * value (moving statistics, moving averages).
Node* assignMovingAverage(Output variable, Output value, double decay);

/// Registers every op family with the global registry (idempotent). Op builders call it; call
/// it yourself before adding nodes by op name with Graph::addNode.
void registerAllOps();

}  // namespace weft
