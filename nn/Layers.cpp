#include "nn/Layers.h"

#include <cmath>

namespace weft::nn {

Linear::Linear(Graph& g, const std::string& layerName, int64_t in, int64_t out, bool hasBias, DType dtype)
    : name(layerName) {
  auto scope = g.scope(name);
  weight = g.variable("weight", dtype, {in, out}, Initializer::glorotUniform());
  if (hasBias) bias = g.variable("bias", dtype, {out}, Initializer::zeros());
}

Output Linear::operator()(Output x) const {
  auto scope = x.graph().scope(name);
  Output y;
  if (x.rank() == 2) {
    y = matmul(x, weight);
  } else {
    // (..., in) -> (rows, in) -> (rows, out) -> (..., out)
    std::vector<int64_t> outShape = x.shape().dims();
    outShape.back() = weight.shape()[1];
    for (size_t i = 0; i + 1 < outShape.size(); ++i) {
      if (outShape[i] < 0) outShape[i] = -1;
    }
    WEFT_CHECK(std::count(outShape.begin(), outShape.end(), -1) <= 1,
               "Linear: input {} has more than one unknown dimension", x.shape().str());
    y = reshape(matmul(reshape(x, {-1, weight.shape()[0]}), weight), outShape);
  }
  return bias.valid() ? y + bias : y;
}

Embedding::Embedding(Graph& g, const std::string& layerName, int64_t vocab, int64_t dim, DType dtype,
                     EmbeddingGradient gradientKind)
    : name(layerName), gradient(gradientKind) {
  auto scope = g.scope(name);
  table = g.variable("table", dtype, {vocab, dim}, Initializer::normal(0, 1.0 / std::sqrt(static_cast<double>(dim))));
}

Output Embedding::operator()(Output ids) const {
  auto scope = ids.graph().scope(name);
  // Through an Identity the rows' gradient reaches the table summed into a dense one: autodiff
  // keeps a gradient sparse only where it meets a variable.
  return gather(gradient == EmbeddingGradient::Dense ? identity(table) : table, ids);
}

LSTM::LSTM(Graph& g, const std::string& layerName, int64_t in, int64_t hiddenSize, DType dtype, LSTMOptions lstmOptions)
    : name(layerName), hidden(hiddenSize), options(lstmOptions) {
  auto scope = g.scope(name);
  const double limit = 1.0 / std::sqrt(static_cast<double>(hidden));
  wx = g.variable("wx", dtype, {in, 4 * hidden}, Initializer::uniform(-limit, limit));
  wh = g.variable("wh", dtype, {hidden, 4 * hidden}, Initializer::uniform(-limit, limit));
  if (options.twoBiases) {
    bih = g.variable("bias_ih", dtype, {4 * hidden}, Initializer::uniform(-limit, limit));
    bhh = g.variable("bias_hh", dtype, {4 * hidden}, Initializer::uniform(-limit, limit));
    b = bih + bhh;
    return;
  }
  Tensor bias = Tensor::zeros(dtype, {4 * hidden});
  for (int64_t j = hidden; j < 2 * hidden; ++j) {
    if (dtype == f32) bias.data<float>()[j] = 1;
    else bias.data<double>()[j] = 1;
  }
  b = g.variable("bias", dtype, {4 * hidden}, Initializer::fromTensor(bias));
}

LstmOutputs LSTM::operator()(Output x, Output h0, Output c0) const {
  auto scope = x.graph().scope(name);
  if (options.batchFirst) x = transpose(x, {1, 0, 2});
  if (!h0.valid() || !c0.valid()) {
    // Zeros of (B, hidden), with B known only at run time: (B, 1) zeros + (1, hidden) zeros.
    Output first = reshape(slice(x, {0, 0, 0}, {1, -1, -1}), {-1, x.shape()[2]});
    Graph& g = x.graph();
    Output zeros = zerosLike(sum(first, {1}, true)) + g.constant(Tensor::zeros(x.dtype(), {1, hidden}));
    if (!h0.valid()) h0 = zeros;
    if (!c0.valid()) c0 = zeros;
  }
  LstmOutputs out = lstm(x, h0, c0, wx, wh, b);
  if (options.batchFirst) out.y = transpose(out.y, {1, 0, 2});
  return out;
}

GRUCell::GRUCell(Graph& g, const std::string& layerName, int64_t in, int64_t hidden, DType dtype) : name(layerName) {
  auto scope = g.scope(name);
  const double limit = 1.0 / std::sqrt(static_cast<double>(hidden));
  wx = g.variable("wx", dtype, {in, 3 * hidden}, Initializer::uniform(-limit, limit));
  wh = g.variable("wh", dtype, {hidden, 3 * hidden}, Initializer::uniform(-limit, limit));
  bx = g.variable("bx", dtype, {3 * hidden}, Initializer::zeros());
  bh = g.variable("bh", dtype, {3 * hidden}, Initializer::zeros());
}

Output GRUCell::operator()(Output x, Output h) const {
  auto scope = x.graph().scope(name);
  return gruCell(x, h, wx, wh, bx, bh);
}

Conv2d::Conv2d(Graph& g, const std::string& layerName, int64_t in, int64_t out, int64_t kernel, Conv2dOptions opts,
               bool hasBias, DType dtype)
    : name(layerName), options(std::move(opts)) {
  auto scope = g.scope(name);
  filter = g.variable("filter", dtype, {out, in, kernel, kernel}, Initializer::heNormal());
  if (hasBias) bias = g.variable("bias", dtype, {out, 1, 1}, Initializer::zeros());
}

Output Conv2d::operator()(Output x) const {
  auto scope = x.graph().scope(name);
  Output y = conv2d(x, filter, options);
  return bias.valid() ? y + bias : y;
}

BatchNorm::BatchNorm(Graph& g, const std::string& layerName, int64_t channels, double m, double eps, DType dtype)
    : name(layerName), momentum(m), epsilon(eps) {
  auto scope = g.scope(name);
  gamma = g.variable("gamma", dtype, {channels}, Initializer::constant(1));
  beta = g.variable("beta", dtype, {channels}, Initializer::zeros());
  movingMean = g.variable("moving_mean", dtype, {channels}, Initializer::zeros(), false);
  movingVar = g.variable("moving_var", dtype, {channels}, Initializer::constant(1), false);
}

Output BatchNorm::operator()(Output x, bool training) const {
  auto scope = x.graph().scope(name);
  if (!training) return batchNormInference(x, gamma, beta, movingMean, movingVar, epsilon);
  BatchNormOutputs out = batchNormTrain(x, gamma, beta, epsilon);
  Graph& g = x.graph();
  g.addToCollection("update_ops", assignMovingAverage(movingMean, out.batchMean, momentum));
  g.addToCollection("update_ops", assignMovingAverage(movingVar, out.batchVar, momentum));
  return out.y;
}

Output meanSparseCrossEntropy(Output logits, Output labels, int64_t ignoreIndex) {
  Output losses = sparseSoftmaxCrossEntropy(logits, labels, ignoreIndex);
  Output counted = cast(notEqual(labels, labels.graph().scalar(static_cast<double>(ignoreIndex), labels.dtype())),
                        losses.dtype());
  return sum(losses) / maximum(sum(counted), scalarLike(losses, 1.0));
}

Output accuracy(Output logits, Output labels) {
  Output hits = equal(argmax(logits, -1), cast(labels, i64));
  return mean(cast(hits, logits.dtype()));
}

}  // namespace weft::nn
