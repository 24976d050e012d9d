// Fusions (ops/Fusion.h): a batch norm and the ReLU after it become one op forward and one
// backward, a training step gives the same bits as without fusing (in f32, and in bf16 after the
// mixed-precision rewrite), every value a caller can fetch keeps its meaning, and a batch norm
// whose output something else reads stays as it is.
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "models/ResNet.h"
#include "ops/Fusion.h"
#include "optim/Optimizer.h"

using namespace weft;
using weft::testing::randomInts;
using weft::testing::randomTensor;

namespace {

int countOps(const Graph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.nodes()) n += node->op == op;
  return n;
}

/// A small ResNet (CIFAR layout, depth 8, width 4) and its training step; `fuse` chooses whether
/// minimize() fuses.
struct SmallResNet {
  Graph g;
  models::ResNetNet net;
  Node* step = nullptr;
  FeedMap feeds;

  SmallResNet(bool fuse, DType precision) {
    {
      auto mixed = g.mixedPrecision(precision);
      net = models::buildResNet(g, {8, 4, 3, 3, 0.9, 5, f32});
    }
    optim::MinimizeOptions options;
    options.fuse = fuse;
    step = optim::Momentum(0.05, 0.9).minimize(net.loss, options);
    feeds = {{net.images, randomTensor(f32, {6, 3, 8, 8}, 13)}, {net.labels, randomInts(i64, {6}, 0, 3, 14)}};
  }
};

}  // namespace

TEST_CASE("a fused ResNet step gives the bits of the unfused step, in f32 and in bf16") {
  for (const DType precision : {f32, bf16}) {
    CAPTURE(dtypeName(precision));
    SmallResNet plain(false, precision), fused(true, precision);
    // Each block's first unit and the stem have a ReLU of their own (the other ReLUs follow a sum).
    CHECK(countOps(fused.g, "BatchNormReluTrain") == 4);
    CHECK(countOps(fused.g, "BatchNormReluGrad") == 4);
    CHECK(countOps(plain.g, "BatchNormReluTrain") == 0);
    Session a(plain.g), b(fused.g);
    CHECK(b.planStats({fused.net.loss}, fused.feeds, {fused.step}).opCount <
          a.planStats({plain.net.loss}, plain.feeds, {plain.step}).opCount);
    for (int i = 0; i < 3; ++i) {
      CAPTURE(i);
      const Tensor la = a.run({plain.net.loss}, plain.feeds, {plain.step})[0];
      const Tensor lb = b.run({fused.net.loss}, fused.feeds, {fused.step})[0];
      CHECK(lb.item() == la.item());
    }
    for (Node* v : plain.g.variables()) {
      CAPTURE(v->name);
      CHECK(testing::compare(b.variable(v->name), a.variable(v).toDoubles(), 0.0) == "");
    }
    fused.g.verify();
  }
}

TEST_CASE("after fusing, the batch norm's own output still holds the values before the ReLU") {
  Graph g;
  const Output x = g.constant(randomTensor(f32, {4, 3, 5, 5}, 21, -2, 2));
  const Output gamma = g.variable("gamma", f32, {3}, Initializer::constant(1));
  const Output beta = g.variable("beta", f32, {3}, Initializer::zeros());
  const BatchNormOutputs bn = batchNormTrain(x, gamma, beta, 1e-5);
  const Output activated = relu(bn.y);
  const Output loss = sum(square(activated));
  const std::vector<Grad> grads = gradients(loss, {gamma});
  CHECK(fuseBatchNormRelu(g) == 1);
  CHECK(activated.node()->op == "BatchNormReluTrain");
  CHECK(grads[0].dense.node()->op == "BatchNormReluGrad");
  CHECK(grads[0].dense.node()->gradientOf == activated.node());  // a pipeline cut keeps them together
  Session s(g);
  const std::vector<Tensor> v = s.run({bn.y, activated, bn.batchMean});
  int negatives = 0;
  for (double y : v[0].toDoubles()) negatives += y < 0;
  CHECK(negatives > 0);  // the normalised values, not their ReLU
  std::vector<double> expected = v[0].toDoubles();
  for (double& y : expected) y = std::max(y, 0.0);
  CHECK(testing::compare(v[1], expected, 0.0) == "");
  g.verify();
}

TEST_CASE("a batch norm and its ReLU fuse on a GPU, and stay apart when placed on different devices") {
  // Only the graph is rewritten here, so no GPU is needed.
  for (const bool apart : {false, true}) {
    CAPTURE(apart);
    Graph g;
    Output activated;
    {
      auto placed = g.onDevice("cuda:0");
      const Output x = g.constant(randomTensor(f32, {4, 3, 5, 5}, 22));
      const Output gamma = g.variable("gamma", f32, {3}, Initializer::constant(1));
      const Output beta = g.variable("beta", f32, {3}, Initializer::zeros());
      const BatchNormOutputs bn = batchNormTrain(x, gamma, beta, 1e-5);
      auto reluPlaced = g.onDevice(apart ? "cpu" : "cuda:0");
      activated = relu(bn.y);
    }
    CHECK(fuseBatchNormRelu(g) == (apart ? 0 : 1));
    CHECK(activated.node()->op == (apart ? "Relu" : "BatchNormReluTrain"));
  }
}

TEST_CASE("a batch norm whose output another op reads too is left unfused") {
  Graph g;
  const Output x = g.constant(randomTensor(f32, {4, 3, 2, 2}, 22));
  const Output gamma = g.variable("gamma", f32, {3}, Initializer::constant(1));
  const Output beta = g.variable("beta", f32, {3}, Initializer::zeros());
  const BatchNormOutputs bn = batchNormTrain(x, gamma, beta, 1e-5);
  const Output both = relu(bn.y) + bn.y;
  optim::SGD(0.1).minimize(sum(square(both)));
  CHECK(countOps(g, "BatchNormReluTrain") == 0);
  CHECK(both.node()->inputs[0].node()->op == "Relu");
}
