// Activation recomputation (Graph::recompute, autodiff/Recompute.h): the backward pass reads
// recomputed copies of a scope's values, which gives the same bits from a smaller peak of memory.
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "nn/Layers.h"
#include "ops/Ops.h"
#include "optim/Optimizer.h"

#include <cstring>
#include <set>

using namespace weft;

namespace {

constexpr int64_t kWidth = 64, kBatch = 32, kLayers = 6;

/// A chain of layers whose element-wise values the backward pass reads: with a = h w,
/// h = tanh(a) sigmoid(a) (a a + 1), each layer in its own recompute scope of `mode`. Kept, a
/// layer holds five values for its backward (a, tanh, sigmoid, their product, a a + 1).
struct Chain {
  Graph g;
  Output x;
  Output loss;
  std::vector<Output> weights;
};

void buildChain(Chain& c, Recompute mode, double dropoutRate = 0) {
  c.g.setSeed(5);
  c.x = c.g.placeholder("x", f32, {kBatch, kWidth});
  Output h = c.x;
  for (int64_t l = 0; l < kLayers; ++l) {
    const Output w = c.g.variable(fmt::format("w{}", l), f32, {kWidth, kWidth}, Initializer::glorotUniform());
    c.weights.push_back(w);
    auto segment = c.g.recompute(mode);
    const Output a = matmul(h, w);
    h = (tanh(a) * sigmoid(a)) * (a * a + 1.0);
    if (dropoutRate > 0) h = dropout(h, dropoutRate, 9);
  }
  c.loss = sum(h * h);
}

Tensor input() {
  Tensor x = Tensor::zeros(f32, {kBatch, kWidth});
  for (int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  return x;
}

/// The gradients of the chain's weights, and the peak bytes of the plan that computes them.
std::pair<std::vector<Tensor>, size_t> chainGradients(Recompute mode, double dropoutRate = 0) {
  Chain c;
  buildChain(c, mode, dropoutRate);
  std::vector<Output> fetches;
  for (const Grad& grad : gradients(c.loss, c.weights)) fetches.push_back(grad.dense);
  Session s(c.g, {1, false});
  const FeedMap feeds{{c.x, input()}};
  return {s.run(fetches, feeds), s.planStats(fetches, feeds).peakBytes};
}

void checkSameBits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    REQUIRE(a[i].numel() == b[i].numel());
    CHECK(std::memcmp(a[i].data<float>(), b[i].data<float>(), a[i].bytes()) == 0);
  }
}

/// The ops copied for the chain's backward pass under `mode`; each copies an op of a scope.
std::multiset<std::string> chainOpsRecomputed(Recompute mode) {
  Chain c;
  buildChain(c, mode);
  gradients(c.loss, c.weights);
  std::multiset<std::string> ops;
  for (const auto& n : c.g.nodes()) {
    if (!n->name.ends_with("/recomputed")) continue;
    CHECK(n->gradientOf->recomputeSegment >= 0);
    ops.insert(n->op);
  }
  return ops;
}

}  // namespace

/// Bytes of one (kBatch, kWidth) float value.
constexpr size_t kValueBytes = kBatch * kWidth * sizeof(float);

/// Checks that the chain's gradients under `mode` are those without recomputation, bit for bit,
/// from a plan whose peak is at least `savedPerLayer` values smaller for all but two layers
/// (the one being recomputed, and the last, whose backward starts at once).
void checkRecomputedChain(Recompute mode, size_t savedPerLayer) {
  const auto [kept, keptPeak] = chainGradients(Recompute::None);
  const auto [recomputed, recomputedPeak] = chainGradients(mode);
  checkSameBits(kept, recomputed);
  CAPTURE(keptPeak);
  CAPTURE(recomputedPeak);
  CHECK(recomputedPeak + (kLayers - 2) * savedPerLayer * kValueBytes <= keptPeak);
}

TEST_CASE("full recomputation gives the gradients of the graph without it, bit for bit, from a smaller peak") {
  // Without: every layer's five values stay alive until the backward reaches them; with: one
  // layer's at a time, and every layer's input.
  checkRecomputedChain(Recompute::Full, 4);
}

TEST_CASE("selective recomputation keeps the products' values and recomputes the element-wise ones") {
  const std::multiset<std::string> ops = chainOpsRecomputed(Recompute::Selective);
  CHECK(ops.count("MatMul") == 0);
  CHECK(ops.count("Tanh") == static_cast<size_t>(kLayers));
  CHECK(ops.count("Sigmoid") == static_cast<size_t>(kLayers));
  // Each layer keeps its product a instead of five values.
  checkRecomputedChain(Recompute::Selective, 3);
}

TEST_CASE("full recomputation copies the products too, and nothing outside the scopes") {
  const std::multiset<std::string> ops = chainOpsRecomputed(Recompute::Full);
  CHECK(ops.count("MatMul") == static_cast<size_t>(kLayers));
  CHECK(ops.count("Variable") == 0);
  CHECK(ops.count("Placeholder") == 0);
}

TEST_CASE("a recomputed dropout draws the mask the forward pass drew") {
  const auto [kept, keptPeak] = chainGradients(Recompute::None, 0.3);
  const auto [recomputed, recomputedPeak] = chainGradients(Recompute::Full, 0.3);
  checkSameBits(kept, recomputed);
}

TEST_CASE("batch norm in a recompute scope updates its moving statistics once") {
  auto train = [](Recompute mode) {
    Graph g;
    g.setSeed(2);
    const Output x = g.placeholder("x", f32, {8, 3, 4, 4});
    nn::BatchNorm bn(g, "bn", 3);
    Output y;
    {
      auto segment = g.recompute(mode);
      y = relu(bn(x, true)) * 2.0;
    }
    Node* step = optim::SGD(0.1).minimize(sum(y * y));
    Session s(g, {1, false});
    Tensor batch = Tensor::zeros(f32, {8, 3, 4, 4});
    for (int64_t i = 0; i < batch.numel(); ++i)
      batch.data<float>()[i] = static_cast<float>(std::cos(0.1 * static_cast<double>(i)));
    for (int i = 0; i < 3; ++i) s.run(step, {{x, batch}});
    return s.run({bn.movingMean, bn.movingVar, bn.gamma, bn.beta});
  };
  checkSameBits(train(Recompute::None), train(Recompute::Full));
}

TEST_CASE("a sparse lookup in a recompute scope keeps its gradient sparse and equal") {
  auto lookupGradient = [](Recompute mode) {
    Graph g;
    g.setSeed(4);
    const Output ids = g.placeholder("ids", i32, {6});
    nn::Embedding table(g, "table", 20, 8);
    Output h;
    {
      auto segment = g.recompute(mode);
      h = tanh(table(ids)) * 3.0;
    }
    const std::vector<Grad> grads = gradients(sum(h * h), {table.table});
    REQUIRE(grads[0].isSparse());
    Session s(g, {1, false});
    Tensor idValues = Tensor::zeros(i32, {6});
    for (int i = 0; i < 6; ++i) idValues.data<int32_t>()[i] = (i * 7) % 20;
    return s.run({grads[0].indices, grads[0].values}, {{ids, idValues}});
  };
  const std::vector<Tensor> kept = lookupGradient(Recompute::None), recomputed = lookupGradient(Recompute::Full);
  REQUIRE(kept.size() == 2);
  CHECK(std::memcmp(kept[0].data<int32_t>(), recomputed[0].data<int32_t>(), kept[0].bytes()) == 0);
  CHECK(std::memcmp(kept[1].data<float>(), recomputed[1].data<float>(), kept[1].bytes()) == 0);
}

TEST_CASE("every zoo model trains to the same variables with selective and full recomputation") {
  for (const std::string& name : models::zooModelNames()) {
    CAPTURE(name);
    auto train = [&](Recompute mode) {
      auto model = models::makeZooModel(name);
      // Small data and batches: the rewrite, not the model's size, is under test.
      for (const models::ModelOption& option : model->options()) {
        if (option.name == "train-size" || option.name == "train-sentences") *std::get<int64_t*>(option.target) = 300;
        if (option.name == "image-size") *std::get<int64_t*>(option.target) = 16;
      }
      Graph g;
      models::CommonOptions common;
      common.seed = 3;
      common.batchSize = 16;
      common.recompute = mode;
      model->build(g, common);
      Node* step = optim::Adam(1e-3).minimize(model->loss());
      const auto copies = std::count_if(g.nodes().begin(), g.nodes().end(),
                                        [](const auto& n) { return n->name.ends_with("/recomputed"); });
      // The MLP's backward reads only its layers' inputs and outputs (ReLU's), which stay kept.
      if (mode == Recompute::None || name == "mlp") CHECK(copies == 0);
      else CHECK(copies > 0);
      Session s(g, {2, false});
      for (int i = 0; i < 2; ++i) s.run(step, models::feedsFor(g, model->trainData().next()));
      std::vector<Tensor> values;
      for (Node* v : g.variables()) values.push_back(s.variable(v));
      return values;
    };
    const std::vector<Tensor> kept = train(Recompute::None);
    for (Recompute mode : {Recompute::Selective, Recompute::Full}) {
      CAPTURE(recomputeName(mode));
      const std::vector<Tensor> recomputed = train(mode);
      REQUIRE(kept.size() == recomputed.size());
      for (size_t i = 0; i < kept.size(); ++i) {
        CAPTURE(i);
        REQUIRE(kept[i].bytes() == recomputed[i].bytes());
        CHECK(std::memcmp(kept[i].raw(), recomputed[i].raw(), kept[i].bytes()) == 0);
      }
    }
  }
}

TEST_CASE("--recompute takes none, selective or full") {
  CHECK(parseRecompute("none") == Recompute::None);
  CHECK(parseRecompute("selective") == Recompute::Selective);
  CHECK(parseRecompute("full") == Recompute::Full);
  CHECK_THROWS_WITH(parseRecompute("some"), doctest::Contains("recompute 'some': expected none, selective or full"));
}
