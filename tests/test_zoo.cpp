// Every zoo model keeps the contract `weft train` relies on: it builds, its batches feed its
// placeholders, a training step gives a finite loss, and evaluation reports its target metric.
#include "tests/TestUtil.h"

#include "models/ZooModel.h"

#include <fmt/ranges.h>

#include <cmath>
#include <map>
#include <set>

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

#ifdef WEFT_HAVE_CUDA
// What `--device cuda:N` can train: the ops of each zoo model's training step (with its default
// optimizer and clipping) that still lack a CUDA kernel. The list shrinks as kernels land.
TEST_CASE("the ops without CUDA kernels in each zoo model's training step") {
  const std::map<std::string, std::set<std::string>> missing{
      {"mlp", {}},
      {"lm", {}},
      {"nmt", {}},
#ifdef WEFT_HAVE_CUDNN
      {"resnet", {}},
#else
      {"resnet", {"Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput"}},
#endif
      {"gnn", {}},
      {"list_reduction", {}}};
  for (const std::string& name : models::zooModelNames()) {
    CAPTURE(name);
    auto model = models::makeZooModel(name);
    Graph g;
    model->build(g, models::CommonOptions{});
    optim::MinimizeOptions options;
    options.clipGlobalNorm = model->defaultOptimizer().clipNorm;
    optim::Adam(1e-3).minimize(model->loss(), options);
    std::set<std::string> without;
    for (const auto& n : g.nodes()) {
      if (n->def->sourceKind == SourceKind::None && !n->def->kernelFor(DeviceType::CUDA)) without.insert(n->op);
    }
    REQUIRE(missing.count(name) == 1);
    CAPTURE(fmt::format("{}", fmt::join(without, ", ")));
    CHECK(without == missing.at(name));
  }
}
#endif
