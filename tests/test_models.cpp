// Layers and the MLP reference model, end to end.
#include "tests/TestUtil.h"

#include "data/GaussianMixture.h"
#include "models/Mlp.h"
#include "nn/Layers.h"
#include "optim/Optimizer.h"

using namespace weft;

TEST_CASE("Linear computes x W + b on matrices and on higher-rank inputs") {
  Graph g;
  Output x = g.placeholder("x", f64, {-1, 2, 3});
  nn::Linear layer(g, "proj", 3, 4, true, f64);
  Output y = layer(x);
  CHECK(y.shape() == Shape{-1, 2, 4});
  Session s(g);
  const Tensor xv = testing::randomTensor(f64, {5, 2, 3}, 3);
  const Tensor out = s.run({y}, {{x, xv}})[0];
  const std::vector<double> w = s.variable(layer.weight.node()).toDoubles();
  std::vector<double> expected;
  for (int r = 0; r < 10; ++r) {
    for (int j = 0; j < 4; ++j) {
      double acc = 0;  // bias starts at zero
      for (int k = 0; k < 3; ++k) acc += xv.at(r * 3 + k) * w[static_cast<size_t>(k * 4 + j)];
      expected.push_back(acc);
    }
  }
  CHECK_CLOSE(out, expected, 1e-12);
  CHECK(layer.weight.node()->name == "proj/weight");
  CHECK(y.node()->name.rfind("proj/", 0) == 0);
}

TEST_CASE("BatchNorm in training registers moving-statistics updates that minimize runs") {
  Graph g;
  Output x = g.placeholder("x", f64, {4, 2});
  nn::BatchNorm bn(g, "bn", 2, 0.5, 1e-5, f64);
  Output w = g.variable("w", f64, {2}, Initializer::constant(1));
  Output loss = sum(bn(x, true) * w);
  CHECK(g.collection("update_ops").size() == 2);
  Node* step = optim::SGD(0.1).minimize(loss);
  Session s(g);
  s.run(step, {{x, Tensor::fromVector<double>({1, 10, 3, 10, 5, 20, 7, 20}, {4, 2})}});
  // batch means (4, 15), biased variances (5, 25); moving = 0.5 * initial + 0.5 * batch
  CHECK_CLOSE(s.variable("bn/moving_mean"), (std::vector<double>{2, 7.5}), 1e-12);
  CHECK_CLOSE(s.variable("bn/moving_var"), (std::vector<double>{3, 13}), 1e-12);
}

TEST_CASE("the generated task is deterministic and its splits differ") {
  data::GaussianMixtureSpec spec;
  const auto a = data::gaussianMixture(spec, 100, 1), b = data::gaussianMixture(spec, 100, 1),
             c = data::gaussianMixture(spec, 100, 2);
  CHECK(a.features.toDoubles() == b.features.toDoubles());
  CHECK(a.features.toDoubles() != c.features.toDoubles());
  for (double label : a.labels.toDoubles()) CHECK((label >= 0 && label < 10));
  CHECK_THROWS_AS(data::batchOf(a, 90, 20), Error);
}

TEST_CASE("the MLP learns the generated task to over 95% held-out accuracy") {
  data::GaussianMixtureSpec task;
  const auto train = data::gaussianMixture(task, 12800, 10);
  const auto test = data::gaussianMixture(task, 4000, 11);
  Graph g;
  models::MlpConfig config;
  const models::MlpModel m = models::buildMlp(g, config);
  Node* step = optim::Adam(1e-3).minimize(m.loss);
  Session s(g, {2, false});
  double firstLoss = 0, lastLoss = 0;
  for (int epoch = 0; epoch < 4; ++epoch) {
    for (int64_t b = 0; b < 100; ++b) {
      const auto batch = data::batchOf(train, b * 128, 128);
      lastLoss = s.run({m.loss}, {{m.features, batch.features}, {m.labels, batch.labels}}, {step})[0].item();
      if (epoch == 0 && b == 0) firstLoss = lastLoss;
    }
  }
  CHECK(lastLoss < firstLoss / 5);
  const double accuracy = s.run({m.accuracy}, {{m.features, test.features}, {m.labels, test.labels}})[0].item();
  CHECK(accuracy > 0.95);
}

TEST_CASE("training is reproducible from the seed") {
  auto run = [](uint64_t seed) {
    data::GaussianMixtureSpec task;
    const auto batch = data::gaussianMixture(task, 64, 3);
    Graph g;
    models::MlpConfig config;
    config.seed = seed;
    config.dropout = 0.2;
    const models::MlpModel m = models::buildMlp(g, config);
    Node* step = optim::Momentum(0.05, 0.9).minimize(m.loss);
    Session s(g, {2, false});
    std::vector<double> losses;
    for (int i = 0; i < 5; ++i) {
      losses.push_back(s.run({m.loss}, {{m.features, batch.features}, {m.labels, batch.labels}}, {step})[0].item());
    }
    return losses;
  };
  CHECK(run(1) == run(1));
  CHECK(run(1) != run(2));
}
