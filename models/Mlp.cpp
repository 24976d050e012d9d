#include "models/Mlp.h"

#include "data/GaussianMixture.h"
#include "data/Mnist.h"

#include <string>

namespace weft::models {

MlpModel buildMlp(Graph& g, const MlpConfig& config) {
  g.setSeed(config.seed);
  MlpModel m;
  m.features = g.placeholder("features", f32, {-1, config.inputs});
  m.labels = g.placeholder("labels", i64, {-1});
  std::vector<nn::Linear> layers;
  int64_t width = config.inputs;
  for (size_t i = 0; i < config.hidden.size(); ++i) {
    layers.emplace_back(g, "fc" + std::to_string(i + 1), width, config.hidden[i], true, config.dtype);
    width = config.hidden[i];
  }
  nn::Linear out(g, "logits", width, config.classes, true, config.dtype);
  auto forward = [&](bool training) {
    Output h = config.dtype == f32 ? m.features : cast(m.features, config.dtype);
    for (size_t i = 0; i < layers.size(); ++i) {
      auto segment = g.recompute(training ? config.recompute : Recompute::None);
      h = nn::Dropout(config.dropout, config.seed + i)(relu(layers[i](h)), training);
    }
    return out(h);
  };
  const Output trainLogits = forward(config.dropout > 0);
  m.loss = nn::meanSparseCrossEntropy(trainLogits, m.labels);
  m.logits = config.dropout > 0 ? forward(false) : trainLogits;
  m.accuracy = nn::accuracy(m.logits, m.labels);
  return m;
}

namespace {

/// Examples {"features": f32 [dim], "labels": i64 scalar} of the generated task.
data::Dataset mixtureDataset(const data::GaussianMixtureSpec& spec, int64_t n, uint64_t seed) {
  const data::ClassificationData d = data::gaussianMixture(spec, n, seed);
  std::vector<data::Example> examples;
  examples.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const data::ClassificationData row = data::batchOf(d, i, 1);
    examples.push_back({{"features", row.features.reshaped({spec.dim})}, {"labels", row.labels.reshaped({})}});
  }
  return data::Dataset(std::move(examples));
}

class MlpZooModel : public ZooModel {
 public:
  std::vector<ModelOption> options() override {
    return {{"hidden-width", "width of each of the two hidden layers", &width_},
            {"dropout", "dropout rate after each hidden layer", &config_.dropout},
            {"train-size", "generated training examples (without --data)", &trainSize_},
            {"test-size", "generated held-out examples (without --data)", &testSize_}};
  }

  void build(Graph& g, const CommonOptions& common) override {
    WEFT_CHECK(common.dtype == "f32" || common.dtype == "f64", "mlp: dtype '{}' is not f32 or f64", common.dtype);
    data::Dataset train;
    if (common.data.empty()) {
      train = mixtureDataset(task_, trainSize_, common.seed * 2 + 100);
      test_ = mixtureDataset(task_, testSize_, common.seed * 2 + 101);
    } else {
      train = data::loadMnistSplit(common.data, true);
      test_ = data::loadMnistSplit(common.data, false);
      WEFT_CHECK(train.size() > 0 && test_.size() > 0, "mlp: MNIST in '{}' has {} training and {} test images; both "
                 "are needed", common.data, train.size(), test_.size());
      config_.inputs = train[0].at("features").numel();
      WEFT_CHECK(test_[0].at("features").numel() == config_.inputs, "mlp: MNIST in '{}': training images of {} "
                 "pixels, test images of {}", common.data, config_.inputs, test_[0].at("features").numel());
      config_.classes = 10;
    }
    config_.hidden = {width_, width_};
    config_.seed = common.seed;
    config_.dtype = common.dtype == "f64" ? f64 : f32;
    config_.recompute = common.recompute;
    model_ = buildMlp(g, config_);
    const int64_t batch = common.batchSize > 0 ? common.batchSize : 128;
    data::BatchOptions batching{batch, true, common.seed, {}, 0, 0, {}};
    train_ = std::make_unique<data::Batcher>(std::move(train), batching);
  }
  Output loss() const override { return model_.loss; }
  data::BatchSource& trainData() override { return *train_; }

  std::map<std::string, double> evaluate(Session& s, int64_t maxBatches) override {
    const int64_t batch = std::min<int64_t>(1000, static_cast<int64_t>(test_.size()));
    data::Batcher eval(test_, {batch, false, 0, {}, 0, 0, {}});
    const int64_t batches = maxBatches > 0 ? std::min(maxBatches, eval.batchesPerEpoch()) : eval.batchesPerEpoch();
    double correct = 0;
    for (int64_t b = 0; b < batches; ++b) {
      correct += s.run({model_.accuracy}, feedsFor(s.graph(), eval.next()))[0].item() * static_cast<double>(batch);
    }
    return {{"accuracy", correct / static_cast<double>(batches * batch)}};
  }
  std::string targetMetric() const override { return "accuracy"; }
  bool higherIsBetter() const override { return true; }
  std::pair<std::string, double> itemsIn(const data::Batch& b) const override {
    return {"examples", static_cast<double>(b.at("labels").numel())};
  }

 private:
  data::GaussianMixtureSpec task_;
  MlpConfig config_;
  int64_t width_ = 256, trainSize_ = 50000, testSize_ = 10000;
  MlpModel model_;
  std::unique_ptr<data::Batcher> train_;
  data::Dataset test_;
};

}  // namespace

std::unique_ptr<ZooModel> makeMlpModel() { return std::make_unique<MlpZooModel>(); }

}  // namespace weft::models
