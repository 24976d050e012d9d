// The graph networks: GGSNN and GCN build, train, pass finite-difference gradient checks, and the
// GCN normalisation matches a hand computation.
#include "autodiff/Gradients.h"
#include "data/Graphs.h"
#include "models/Gnn.h"
#include "tests/TestUtil.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

using namespace weft;
using namespace weft::models;

namespace {

/// A tiny generated-task model: few graphs, small states.
std::unique_ptr<ZooModel> tinyGnn(Graph& g, const std::string& kind, const std::string& dtype, int64_t hidden) {
  auto model = makeGnnModel();
  setOption<std::string>(*model, "kind", kind);
  setOption<int64_t>(*model, "hidden", hidden);
  setOption<int64_t>(*model, "propagation-steps", 2);
  setOption<int64_t>(*model, "train-size", 16);
  setOption<int64_t>(*model, "test-size", 8);
  CommonOptions common;
  common.batchSize = 2;
  common.dtype = dtype;
  model->build(g, common);
  return model;
}

data::Batch generatedBatch(int64_t graphs, uint64_t seed) {
  const std::vector<data::Example> examples = data::typedReachability({}, graphs, seed);
  std::vector<const data::Example*> members;
  for (const data::Example& e : examples) members.push_back(&e);
  return data::collateGraphs(members);
}

}  // namespace

TEST_CASE("GGSNN and GCN build with the right shapes") {
  for (const std::string kind : {"ggsnn", "gcn"}) {
    CAPTURE(kind);
    Graph g;
    GnnConfig c;
    c.kind = kind;
    const GnnGraph m = buildGnn(g, c);
    const data::Batch batch = generatedBatch(3, 1);
    Session s(g, {1});
    const std::vector<Tensor> r = s.run({m.logits, m.loss, m.accuracy, m.hits}, feedsFor(g, batch));
    const int64_t nodes = batch.at("features").shape()[0];
    CHECK(r[0].shape() == Shape({nodes, 3}));
    CHECK(r[1].shape() == Shape({}));
    CHECK(std::isfinite(r[1].item()));
    CHECK(r[3].shape() == Shape({nodes}));
  }
}

TEST_CASE("gnn rejects an unknown kind and states narrower than the features") {
  Graph g;
  GnnConfig c;
  c.kind = "transformer";
  CHECK(contains(errorOf([&] { buildGnn(g, c); }), "unknown kind 'transformer'"));
  Graph g2;
  GnnConfig narrow;
  narrow.features = 8;
  narrow.hidden = 4;
  CHECK(contains(errorOf([&] { buildGnn(g2, narrow); }), "hidden size 4 is smaller than the 8 node features"));
}

TEST_CASE("one optimizer step on a fixed batch lowers the gnn loss") {
  for (const std::string kind : {"ggsnn", "gcn"}) {
    CAPTURE(kind);
    Graph g;
    auto model = tinyGnn(g, kind, "f32", 16);
    const OptimizerSpec spec = model->defaultOptimizer();
    CHECK(spec.name == "adam");
    Node* step = optim::Adam(spec.lr).minimize(model->loss());
    Session s(g, {1});
    const FeedMap feeds = feedsFor(g, model->trainData().next());
    const double before = s.run({model->loss()}, feeds, {step})[0].item();
    const double after = s.run({model->loss()}, feeds)[0].item();
    CHECK(after < before);
  }
}

TEST_CASE("GGSNN gradients match finite differences") {
  Graph g;
  auto model = tinyGnn(g, "ggsnn", "f64", 3);
  const FeedMap feeds = feedsFor(g, model->trainData().next());
  CHECK_GRADIENTS(checkVariableGradients(
      g, model->loss(), {"message/weight", "message/bias", "update/wh", "readout/weight"}, feeds, {1e-6, 1e-5}));
}

TEST_CASE("GCN gradients match finite differences") {
  Graph g;
  auto model = tinyGnn(g, "gcn", "f64", 3);
  const FeedMap feeds = feedsFor(g, model->trainData().next());
  CHECK_GRADIENTS(checkVariableGradients(g, model->loss(), {"gcn1/weight", "gcn2/weight", "gcn2/bias", "logits/weight"},
                                         feeds, {1e-6, 1e-5}));
}

TEST_CASE("GCN aggregation matches a hand-computed normalisation") {
  // Edges 0->1, 0->2, 1->2: degrees (1 + in-degree) are 1, 2, 3.
  Graph g;
  const Output h = g.placeholder("h", f64, {-1, 2});
  const Output src = g.constant(Tensor::fromVector(std::vector<int32_t>{0, 0, 1}, {3}));
  const Output dst = g.constant(Tensor::fromVector(std::vector<int32_t>{1, 2, 2}, {3}));
  const Output out = gcnAggregate(h, src, dst);
  const Tensor hv = Tensor::fromVector(std::vector<double>{1, 2, 3, 4, 5, 6}, {3, 2});
  const double r2 = std::sqrt(2.0), r3 = std::sqrt(3.0), r6 = std::sqrt(6.0);
  const std::vector<double> expected{1,
                                     2,  //
                                     3.0 / 2 + 1 / r2,
                                     4.0 / 2 + 2 / r2,  //
                                     5.0 / 3 + 1 / r3 + 3 / r6,
                                     6.0 / 3 + 2 / r3 + 4 / r6};
  CHECK_CLOSE(testing::evaluate(g, out, {{h, hv}}), expected, 1e-12);
  CHECK_GRADIENTS(checkGradients(g, out, {h}, {{h, hv}}));
}

TEST_CASE("gnn evaluation reports node and graph accuracy") {
  Graph g;
  auto model = tinyGnn(g, "ggsnn", "f32", 8);
  Session s(g, {1});
  const auto metrics = model->evaluate(s, 0);
  CHECK(model->targetMetric() == "accuracy");
  CHECK(model->higherIsBetter());
  for (const char* name : {"accuracy", "graph_accuracy"}) {
    CHECK(metrics.at(name) >= 0.0);
    CHECK(metrics.at(name) <= 1.0);
  }
  CHECK(metrics.at("graph_accuracy") <= metrics.at("accuracy"));
  const data::Batch b = model->trainData().next();
  CHECK(model->itemsIn(b).second == static_cast<double>(b.at("features").shape()[0]));
}

TEST_CASE("gnn trains from a graph file") {
  const auto dir = std::filesystem::temp_directory_path() / ("weft-test-gnn-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "graphs.txt").string();
  data::saveGraphs(path, {data::kReachabilityFeatures, 3, true, false}, data::typedReachability({}, 20, 4));
  auto model = makeGnnModel();
  CommonOptions common;
  common.data = path;
  common.batchSize = 4;
  Graph g;
  model->build(g, common);
  std::filesystem::remove_all(dir);
  Node* step = optim::Adam(1e-2).minimize(model->loss());
  Session s(g, {1});
  s.run({}, feedsFor(g, model->trainData().next()), {step});
  CHECK(model->trainData().batchesPerEpoch() == 4);  // 18 training graphs, 2 held out
  CHECK(model->evaluate(s, 0).at("accuracy") >= 0.0);
}

TEST_CASE("GGSNN learns the reachability task") {
  Graph g;
  auto model = makeGnnModel();
  setOption<int64_t>(*model, "train-size", 3200);
  setOption<int64_t>(*model, "test-size", 200);
  model->build(g, {});
  const OptimizerSpec spec = model->defaultOptimizer();
  Node* step = optim::Adam(spec.lr).minimize(model->loss(), {spec.clipNorm, {}, std::nullopt});
  Session s(g, {2});
  for (int i = 0; i < 250; ++i) s.run({}, feedsFor(g, model->trainData().next()), {step});
  CHECK(model->evaluate(s, 0).at("accuracy") > 0.9);
}
