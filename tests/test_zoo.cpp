// Every zoo model keeps the contract `weft train` relies on: it builds, its batches feed its
// placeholders, a training step gives a finite loss, and evaluation reports its target metric.
#include "tests/TestUtil.h"

#include "models/ZooModel.h"

#include <cmath>

using namespace weft;

TEST_CASE("every zoo model builds, trains a step and evaluates") {
  for (const std::string& name : models::zooModelNames()) {
    CAPTURE(name);
    auto model = models::makeZooModel(name);
    Graph g;
    models::CommonOptions common;
    common.seed = 3;
    model->build(g, common);
    Node* step = optim::SGD(1e-3).minimize(model->loss());
    Session s(g, {2, false});
    const data::Batch batch = model->trainData().next();
    const double loss = s.run({model->loss()}, models::feedsFor(g, batch), {step})[0].item();
    CHECK(std::isfinite(loss));
    CHECK(model->itemsIn(batch).second > 0);
    const std::map<std::string, double> metrics = model->evaluate(s, 1);
    CHECK(metrics.count(model->targetMetric()) == 1);
    CHECK(model->defaultSteps() > 0);
    CHECK(!model->defaultOptimizer().name.empty());
  }
}

TEST_CASE("unknown models are named in the error with the known ones") {
  const std::string msg = errorOf([] { models::makeZooModel("nosuch"); });
  CHECK(contains(msg, "'nosuch'"));
  CHECK(contains(msg, "mlp"));
}

TEST_CASE("a batch field without a placeholder is an error naming it") {
  Graph g;
  g.placeholder("x", f32, {2});
  const std::string msg = errorOf([&] { models::feedsFor(g, {{"y", Tensor::zeros(f32, {2})}}); });
  CHECK(contains(msg, "'y'"));
}
