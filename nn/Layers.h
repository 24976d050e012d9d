// Layers: objects that own their variables (created under a name scope at construction) and
// apply them with operator(), so one layer can be applied many times with shared weights.
//
//     nn::Linear fc1(g, "fc1", 784, 512), fc2(g, "fc2", 512, 10);
//     Output logits = fc2(relu(fc1(x)));
#pragma once

#include "ops/Ops.h"

#include <string>

namespace weft::nn {

/// y = x W + b, with W (in, out) Glorot-uniform and b zeros. x: (..., in).
class Linear {
 public:
  Linear(Graph& g, const std::string& name, int64_t in, int64_t out, bool bias = true, DType dtype = f32);
  Output operator()(Output x) const;

  std::string name;
  Output weight, bias;  // bias is invalid when disabled
};

/// How an Embedding's table gets its gradient.
enum class EmbeddingGradient {
  Sparse,  ///< the looked-up rows (lazy optimizers update only those; servers take only those)
  Dense,   ///< the whole table, zero where nothing was looked up (every row updated, as PyTorch's default)
};

/// Rows of a (vocab, dim) table, N(0, 1/sqrt(dim))-initialised.
class Embedding {
 public:
  Embedding(Graph& g, const std::string& name, int64_t vocab, int64_t dim, DType dtype = f32,
            EmbeddingGradient gradient = EmbeddingGradient::Sparse);
  Output operator()(Output ids) const;

  std::string name;
  Output table;
  EmbeddingGradient gradient;
};

/// How an LSTM lays out its input and its biases.
struct LSTMOptions {
  /// x (B, T, in) and y (B, T, hidden) instead of time-major (T, B, ...).
  bool batchFirst = false;
  /// Two bias vectors, "bias_ih" and "bias_hh", summed (PyTorch's layout, so that its weights can
  /// be loaded), each uniform in +-1/sqrt(hidden) as PyTorch draws them; otherwise one "bias"
  /// whose forget-gate part starts at 1.
  bool twoBiases = false;
};

/// A whole-sequence LSTM; zero initial state when h0/c0 are not given. Gate order i, f, g, o
/// (PyTorch's): wx (in, 4 hidden) and wh (hidden, 4 hidden) are PyTorch's weight_ih and
/// weight_hh transposed.
class LSTM {
 public:
  LSTM(Graph& g, const std::string& name, int64_t in, int64_t hidden, DType dtype = f32, LSTMOptions options = {});
  LstmOutputs operator()(Output x, Output h0 = {}, Output c0 = {}) const;

  std::string name;
  Output wx, wh;
  Output b;         ///< the bias the gates add: the "bias" variable, or bias_ih + bias_hh
  Output bih, bhh;  ///< the two bias variables with twoBiases; invalid otherwise
  int64_t hidden;
  LSTMOptions options;
};

/// One GRU step: h' = GRU(x (B, in), h (B, hidden)).
class GRUCell {
 public:
  GRUCell(Graph& g, const std::string& name, int64_t in, int64_t hidden, DType dtype = f32);
  Output operator()(Output x, Output h) const;

  std::string name;
  Output wx, wh, bx, bh;
};

/// NCHW convolution with a He-normal (out, in, kh, kw) filter and an optional bias.
class Conv2d {
 public:
  Conv2d(Graph& g, const std::string& name, int64_t in, int64_t out, int64_t kernel,
         Conv2dOptions options = {}, bool bias = true, DType dtype = f32);
  Output operator()(Output x) const;

  std::string name;
  Output filter, bias;
  Conv2dOptions options;
};

/// Batch normalisation over all axes but 1 (channels). In training it normalises with the
/// batch's statistics and registers moving-average updates (decay `momentum`) in the graph's
/// "update_ops", which optimizers run with each step; in inference it uses the moving averages.
class BatchNorm {
 public:
  BatchNorm(Graph& g, const std::string& name, int64_t channels, double momentum = 0.9,
            double epsilon = 1e-5, DType dtype = f32);
  Output operator()(Output x, bool training) const;

  std::string name;
  Output gamma, beta, movingMean, movingVar;
  double momentum, epsilon;
};

/// Inverted dropout, active only in training.
class Dropout {
 public:
  Dropout(double rate, uint64_t seed) : rate(rate), seed(seed) {}
  Output operator()(Output x, bool training) const { return training && rate > 0 ? dropout(x, rate, seed) : x; }

  double rate;
  uint64_t seed;
};

/// Mean of the per-example sparse softmax cross-entropy over examples whose label is not
/// ignoreIndex (0 when there are none).
Output meanSparseCrossEntropy(Output logits, Output labels, int64_t ignoreIndex = -100);
/// Fraction of rows whose argmax equals the label.
Output accuracy(Output logits, Output labels);

}  // namespace weft::nn
