// The list-reduction LSTM classifier and its zoo model.
#include "models/ListReduction.h"

#include "data/ListReduction.h"

#include <algorithm>

namespace weft::models {

Output lastStates(Output y, Output mask) {
  // mask[t] - mask[t + 1] is 1 exactly at the last real position of a prefix mask.
  const Output m = cast(mask, y.dtype());
  const Output last = m - pad(slice(m, {0, 1}, {-1, -1}), {0, 0, 0, 1});
  return sum(y * expandDims(transpose(last, {1, 0}), 2), {0});
}

ListReductionGraph buildListReduction(Graph& g, const ListReductionConfig& c) {
  WEFT_CHECK(c.embedding >= 1 && c.hidden >= 1, "list_reduction: invalid sizes (embedding {}, hidden {})", c.embedding,
             c.hidden);
  g.setSeed(c.seed);
  ListReductionGraph m;
  m.tokens = g.placeholder("tokens", i64, {-1, -1});
  m.mask = g.placeholder("tokens_mask", f32, {-1, -1});
  m.labels = g.placeholder("labels", i64, {-1});
  nn::Embedding embed(g, "embedding", data::kListVocab, c.embedding, c.dtype);
  nn::LSTM rnn(g, "lstm", c.embedding, c.hidden, c.dtype);
  nn::Linear out(g, "logits", c.hidden, data::kListClasses, true, c.dtype);
  Output states;  // the lookup and the LSTM: one recompute segment
  {
    auto segment = g.recompute(c.recompute);
    states = lastStates(rnn(transpose(embed(m.tokens), {1, 0, 2})).y, m.mask);
  }
  m.logits = out(states);
  m.loss = nn::meanSparseCrossEntropy(m.logits, m.labels);
  m.accuracy = nn::accuracy(m.logits, m.labels);
  return m;
}

namespace {

class ListReductionZooModel : public ZooModel {
 public:
  std::vector<ModelOption> options() override {
    return {{"embedding", "token embedding width", &config_.embedding},
            {"hidden", "LSTM state width", &config_.hidden},
            {"min-length", "shortest generated list", &task_.minLength},
            {"max-length", "longest generated list", &task_.maxLength},
            {"train-size", "generated training lists", &trainSize_},
            {"test-size", "generated held-out lists", &testSize_}};
  }
  OptimizerSpec defaultOptimizer() const override { return {"adam", 3e-3, 0.9, 0, 5.0}; }
  int64_t defaultSteps() const override { return 6000; }
  bool updatesSparsely() const override { return true; }  // the embedding

  void build(Graph& g, const CommonOptions& common) override {
    WEFT_CHECK(common.data.empty(), "list_reduction trains on its generated task only; --data is not supported");
    WEFT_CHECK(common.dtype == "f32" || common.dtype == "f64",
               "list_reduction: dtype '{}' is not supported (f32 or f64)", common.dtype);
    config_.seed = common.seed;
    config_.dtype = common.dtype == "f32" ? f32 : f64;
    config_.recompute = common.recompute;
    model_ = buildListReduction(g, config_);
    batch_ = common.batchSize > 0 ? common.batchSize : 64;
    train_ =
        std::make_unique<data::Batcher>(data::Dataset(data::listReduction(task_, trainSize_, common.seed * 2 + 100)),
                                        data::BatchOptions{batch_, true, common.seed, {"tokens"}, 0, 0, {}});
    test_ = data::Dataset(data::listReduction(task_, testSize_, common.seed * 2 + 101));
  }
  Output loss() const override { return model_.loss; }
  data::BatchSource& trainData() override { return *train_; }

  std::map<std::string, double> evaluate(Session& s, int64_t maxBatches) override {
    const data::BatchOptions options{batch_, false, 0, {"tokens"}, 0, 0, {}};
    double count = 0, correct = 0, loss = 0;
    for (size_t begin = 0, b = 0; begin < test_.size() && (maxBatches <= 0 || static_cast<int64_t>(b) < maxBatches);
         begin += static_cast<size_t>(batch_), ++b) {
      const size_t end = std::min(test_.size(), begin + static_cast<size_t>(batch_));
      const std::vector<Tensor> r =
          s.run({model_.loss, model_.accuracy}, feedsFor(s.graph(), data::collate(test_, begin, end, options)));
      const auto n = static_cast<double>(end - begin);
      loss += r[0].item() * n;
      correct += r[1].item() * n;
      count += n;
    }
    WEFT_CHECK(count > 0, "list_reduction: the held-out set is empty");
    return {{"accuracy", correct / count}, {"loss", loss / count}};
  }
  std::string targetMetric() const override { return "accuracy"; }
  bool higherIsBetter() const override { return true; }
  std::pair<std::string, double> itemsIn(const data::Batch& b) const override {
    return {"lists", static_cast<double>(b.at("labels").numel())};
  }

 private:
  ListReductionConfig config_;
  data::ListReductionSpec task_;
  int64_t trainSize_ = 100000, testSize_ = 10000, batch_ = 64;
  ListReductionGraph model_;
  std::unique_ptr<data::Batcher> train_;
  data::Dataset test_;
};

}  // namespace

std::unique_ptr<ZooModel> makeListReductionModel() { return std::make_unique<ListReductionZooModel>(); }

}  // namespace weft::models
