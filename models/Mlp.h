// A multi-layer perceptron classifier: Linear -> ReLU (-> Dropout) ... -> Linear, trained with
// softmax cross-entropy.
#pragma once

#include "models/ZooModel.h"
#include "nn/Layers.h"

#include <vector>

namespace weft::models {

struct MlpConfig {
  int64_t inputs = 32;
  std::vector<int64_t> hidden{256, 256};
  int64_t classes = 10;
  double dropout = 0.0;
  uint64_t seed = 1;
  DType dtype = f32;
  Recompute recompute = Recompute::None;  // each hidden layer a recompute segment of this mode
};

struct MlpModel {
  Output features;  // placeholder (batch, inputs) f32; the layers compute in the config's dtype
  Output labels;    // placeholder (batch) i64
  Output loss;      // mean cross-entropy, dropout active (train on this)
  Output logits;    // (batch, classes), dropout off (evaluate on this)
  Output accuracy;  // fraction correct, dropout off
};

/// Builds the MLP in `g`: one set of weights, a training path and an evaluation path.
MlpModel buildMlp(Graph& g, const MlpConfig& config);

/// The zoo's "mlp": the MLP on the built-in Gaussian-mixture task (data/GaussianMixture.h).
std::unique_ptr<ZooModel> makeMlpModel();

}  // namespace weft::models
