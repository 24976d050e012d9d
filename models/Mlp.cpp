#include "models/Mlp.h"

#include <string>

namespace weft::models {

MlpModel buildMlp(Graph& g, const MlpConfig& config) {
  g.setSeed(config.seed);
  MlpModel m;
  m.features = g.placeholder("features", config.dtype, {-1, config.inputs});
  m.labels = g.placeholder("labels", i64, {-1});
  std::vector<nn::Linear> layers;
  int64_t width = config.inputs;
  for (size_t i = 0; i < config.hidden.size(); ++i) {
    layers.emplace_back(g, "fc" + std::to_string(i + 1), width, config.hidden[i], true, config.dtype);
    width = config.hidden[i];
  }
  nn::Linear out(g, "logits", width, config.classes, true, config.dtype);
  auto forward = [&](bool training) {
    Output h = m.features;
    for (size_t i = 0; i < layers.size(); ++i) h = nn::Dropout(config.dropout, config.seed + i)(relu(layers[i](h)), training);
    return out(h);
  };
  const Output trainLogits = forward(config.dropout > 0);
  m.loss = nn::meanSparseCrossEntropy(trainLogits, m.labels);
  m.logits = config.dropout > 0 ? forward(false) : trainLogits;
  m.accuracy = nn::accuracy(m.logits, m.labels);
  return m;
}

}  // namespace weft::models
