// The AMPNet list-reduction task: the generator against direct reductions, and the LSTM model
// (builds, last-position selection, one step lowers the loss, finite-difference gradients).
#include "autodiff/Gradients.h"
#include "data/ListReduction.h"
#include "models/ListReduction.h"
#include "tests/TestUtil.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

using namespace weft;
using namespace weft::models;

namespace {

std::unique_ptr<ZooModel> tinyListModel(Graph& g, const std::string& dtype, int64_t hidden) {
  auto model = makeListReductionModel();
  setOption<int64_t>(*model, "embedding", 3);
  setOption<int64_t>(*model, "hidden", hidden);
  setOption<int64_t>(*model, "max-length", 5);
  setOption<int64_t>(*model, "train-size", 32);
  setOption<int64_t>(*model, "test-size", 10);
  CommonOptions common;
  common.batchSize = 4;
  common.dtype = dtype;
  model->build(g, common);
  return model;
}

/// The answer computed directly from the digits.
int64_t expectedAnswer(int64_t reductionToken, const std::vector<int64_t>& d) {
  switch (reductionToken - data::kListDigits) {
    case 0:
      return std::accumulate(d.begin(), d.end(), int64_t{0}) % 10;
    case 1: {
      int64_t p = 1;
      for (const int64_t x : d) p = p * x % 10;
      return p;
    }
    case 2:
      return *std::max_element(d.begin(), d.end());
    case 3:
      return *std::min_element(d.begin(), d.end());
    case 4:
      return d.front();
    case 5:
      return d.back();
  }
  FAIL("bad reduction token " << reductionToken);
  return -1;
}

}  // namespace

TEST_CASE("list-reduction examples have the documented layout and correct answers") {
  const data::ListReductionSpec spec{2, 7};
  const std::vector<data::Example> examples = data::listReduction(spec, 2000, 3);
  std::set<int64_t> reductions, lengths, answers;
  for (const data::Example& e : examples) {
    const std::vector<int64_t> tokens = e.at("tokens").toVector<int64_t>();
    REQUIRE(tokens.size() >= 3);
    REQUIRE(tokens.size() <= 8);
    CHECK(e.at("labels").shape() == Shape({}));
    CHECK(tokens[0] >= data::kListDigits);
    CHECK(tokens[0] < data::kListVocab);
    const std::vector<int64_t> digits(tokens.begin() + 1, tokens.end());
    for (const int64_t d : digits) CHECK((d >= 0 && d < data::kListDigits));
    CHECK(e.at("labels").item() == expectedAnswer(tokens[0], digits));
    reductions.insert(tokens[0]);
    lengths.insert(static_cast<int64_t>(digits.size()));
    answers.insert(static_cast<int64_t>(e.at("labels").item()));
  }
  CHECK(reductions.size() == static_cast<size_t>(data::kListReductions));
  CHECK(lengths == std::set<int64_t>{2, 3, 4, 5, 6, 7});
  CHECK(answers.size() == 10);
}

TEST_CASE("the list-reduction generator is deterministic and example i depends only on (seed, i)") {
  const auto a = data::listReduction({}, 50, 9), b = data::listReduction({}, 50, 9);
  const auto prefix = data::listReduction({}, 20, 9), other = data::listReduction({}, 50, 10);
  int differing = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].at("tokens").toVector<int64_t>() == b[i].at("tokens").toVector<int64_t>());
    CHECK(a[i].at("labels").item() == b[i].at("labels").item());
    if (i < prefix.size()) CHECK(a[i].at("tokens").toVector<int64_t>() == prefix[i].at("tokens").toVector<int64_t>());
    differing += a[i].at("tokens").toVector<int64_t>() != other[i].at("tokens").toVector<int64_t>();
  }
  CHECK(differing > 40);
  CHECK(data::reductionName(data::Reduction::Product) == "product");
  CHECK(contains(errorOf([] { data::listReduction({3, 2}, 1, 1); }), "lengths 3..2"));
}

TEST_CASE("lastStates picks each sequence's last real position") {
  Graph g;
  const Output y = g.placeholder("y", f64, {-1, -1, 1});
  const Output mask = g.placeholder("mask", f32, {-1, -1});
  const Output last = lastStates(y, mask);
  // T = 3, B = 3: y[t, b] = 10 t + b; lengths 1, 3, 2.
  const Tensor yv = Tensor::fromVector(std::vector<double>{0, 1, 2, 10, 11, 12, 20, 21, 22}, {3, 3, 1});
  const Tensor mv = Tensor::fromVector(std::vector<float>{1, 0, 0, 1, 1, 1, 1, 1, 0}, {3, 3});
  CHECK_CLOSE(testing::evaluate(g, last, {{y, yv}, {mask, mv}}), std::vector<double>({0, 21, 12}), 0.0);
  CHECK_GRADIENTS(checkGradients(g, last, {y}, {{y, yv}, {mask, mv}}));
}

TEST_CASE("the list-reduction model builds and gives (batch, 10) logits") {
  Graph g;
  const ListReductionGraph m = buildListReduction(g, {});
  const std::vector<data::Example> examples = data::listReduction({}, 5, 1);
  std::vector<const data::Example*> members;
  for (const auto& e : examples) members.push_back(&e);
  const data::Batch batch = data::collate(members, {5, false, 0, {"tokens"}, 0, 0, {}});
  Session s(g, {1});
  const std::vector<Tensor> r = s.run({m.logits, m.loss}, feedsFor(g, batch));
  CHECK(r[0].shape() == Shape({5, data::kListClasses}));
  CHECK(std::isfinite(r[1].item()));
}

TEST_CASE("one optimizer step on a fixed batch lowers the list-reduction loss") {
  Graph g;
  auto model = tinyListModel(g, "f32", 16);
  const OptimizerSpec spec = model->defaultOptimizer();
  Node* step = optim::Adam(spec.lr).minimize(model->loss());
  Session s(g, {1});
  const FeedMap feeds = feedsFor(g, model->trainData().next());
  const double before = s.run({model->loss()}, feeds, {step})[0].item();
  CHECK(s.run({model->loss()}, feeds)[0].item() < before);
}

TEST_CASE("list-reduction gradients match finite differences") {
  Graph g;
  auto model = tinyListModel(g, "f64", 3);
  const FeedMap feeds = feedsFor(g, model->trainData().next());
  CHECK_GRADIENTS(checkVariableGradients(
      g, model->loss(), {"embedding/table", "lstm/wx", "lstm/wh", "lstm/bias", "logits/weight"}, feeds, {1e-6, 1e-5}));
}

TEST_CASE("list-reduction evaluation reports accuracy over the held-out lists") {
  Graph g;
  auto model = tinyListModel(g, "f32", 8);
  Session s(g, {1});
  const auto metrics = model->evaluate(s, 0);
  CHECK(metrics.at("accuracy") >= 0.0);
  CHECK(metrics.at("accuracy") <= 1.0);
  CHECK(std::isfinite(metrics.at("loss")));
  CHECK(model->targetMetric() == "accuracy");
  CHECK(model->itemsIn(model->trainData().next()).second == 4);
  Graph g2;
  auto withData = makeListReductionModel();
  CommonOptions common;
  common.data = "lists.txt";
  CHECK(contains(errorOf([&] { withData->build(g2, common); }), "--data is not supported"));
}
