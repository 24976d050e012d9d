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

/// A whole-sequence LSTM over x (T, B, in); zero initial state when h0/c0 are not given. The
/// forget-gate bias starts at 1.
class LSTM {
 public:
  LSTM(Graph& g, const std::string& name, int64_t in, int64_t hidden, DType dtype = f32);
  LstmOutputs operator()(Output x, Output h0 = {}, Output c0 = {}) const;

  std::string name;
  Output wx, wh, b;
  int64_t hidden;
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
