// Mixed precision without per-op casts (ops/MixedPrecision.h): under 16-bit copies of operands,
// the ops marked as taking 16-bit activations read and write them directly after minimize(), a
// ResNet step runs a fraction of the casts it would, the values between convolutions are the
// same bits as with the casts, training follows the casting step, and gradients of variables
// stay f32. These run on the CPU, whose kernels compute such ops in f32.
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "models/ResNet.h"
#include "ops/MixedPrecision.h"
#include "optim/Optimizer.h"

#include <set>

using namespace weft;
using weft::testing::randomInts;
using weft::testing::randomTensor;

namespace {

/// A small ResNet (CIFAR layout, depth 8, width 4) in bf16 on 8 x 8 images, with its training
/// step; `keepLow` chooses whether minimize() keeps activations in 16 bits.
struct SmallResNet {
  Graph g;
  models::ResNetNet net;
  Node* step = nullptr;
  FeedMap feeds;

  explicit SmallResNet(bool keepLow, DType low = bf16) {
    {
      auto mixed = g.mixedPrecision(low);
      net = models::buildResNet(g, {8, 4, 3, 3, 0.9, 7, f32});
    }
    optim::MinimizeOptions options;
    options.keepActivationsLow = keepLow;
    step = optim::Momentum(0.05, 0.9).minimize(net.loss, options);
    feeds = {{net.images, randomTensor(f32, {6, 3, 8, 8}, 11)}, {net.labels, randomInts(i64, {6}, 0, 3, 12)}};
  }
};

int countOps(const Graph& g, const std::string& op, DType output) {
  int n = 0;
  for (const auto& node : g.nodes()) n += node->op == op && node->outputs[0].dtype == output;
  return n;
}

}  // namespace

TEST_CASE("a ResNet step keeps its activations in bf16 and runs a fraction of the casts") {
  SmallResNet casting(false), low(true);
  Session sc(casting.g), sl(low.g);
  const PlanStats before = sc.planStats({casting.net.loss}, casting.feeds, {casting.step});
  const PlanStats after = sl.planStats({low.net.loss}, low.feeds, {low.step});
  // Left: each convolution's filter cast down and its filter gradient cast up, the images and the
  // classifier's product; every activation cast between convolutions is gone.
  const int convolutions = countOps(low.g, "Conv2D", bf16) / 2;  // the training and evaluation passes
  CAPTURE(before.castOps);
  CAPTURE(after.castOps);
  CHECK(after.castOps <= static_cast<size_t>(2 * convolutions + 8));
  // A convolution's input and output, forward and backward: at least three casts each are gone.
  CHECK(before.castOps >= after.castOps + static_cast<size_t>(3 * convolutions));
  CHECK(after.opCount < before.opCount);
  CHECK(after.arenaBytes < before.arenaBytes);  // 16-bit activations take half the bytes
  CHECK(countOps(low.g, "BatchNormTrain", f32) == 0);
  CHECK(countOps(low.g, "BatchNormGrad", f32) == 0);
  CHECK(countOps(low.g, "BatchNormTrain", bf16) == countOps(casting.g, "BatchNormTrain", f32));
  CHECK(countOps(low.g, "Relu", bf16) > 0);
  CHECK(countOps(low.g, "ReluGrad", bf16) > 0);
  CHECK(low.net.loss.dtype() == f32);
  low.g.verify();
}

TEST_CASE("the rewritten ResNet step trains as the casting step does, to bf16 rounding") {
  SmallResNet casting(false), low(true);
  Session sc(casting.g), sl(low.g);
  for (int i = 0; i < 5; ++i) {
    CAPTURE(i);
    const double a = sc.run({casting.net.loss}, casting.feeds, {casting.step})[0].item();
    const double b = sl.run({low.net.loss}, low.feeds, {low.step})[0].item();
    CHECK(b == doctest::Approx(a).epsilon(0.02));
  }
  for (const char* name : {"stem/filter", "stem_bn/gamma", "fc/weight"}) {
    CAPTURE(name);
    const Tensor& v = sc.variable(name);
    CHECK_CLOSE(sl.variable(name), v.toDoubles(), 0.02);
  }
}

TEST_CASE("batch norm and ReLU between two convolutions give the next convolution the same bits") {
  // round(relu(y)) = relu(round(y)): the second convolution reads the same 16-bit values whether
  // batch norm and ReLU ran in f32 between casts or in 16 bits.
  for (const DType low : {bf16, f16}) {
    CAPTURE(dtypeName(low));
    std::vector<Tensor> results;
    for (const bool keepLow : {false, true}) {
      Graph g;
      const Output x = g.constant(randomTensor(f32, {2, 3, 6, 6}, 21));
      const Output f1 = g.variable("f1", f32, {4, 3, 3, 3}, Initializer::uniform(-0.5, 0.5));
      const Output f2 = g.variable("f2", f32, {5, 4, 3, 3}, Initializer::uniform(-0.5, 0.5));
      const Output gamma = g.variable("gamma", f32, {4}, Initializer::uniform(0.5, 1.5));
      const Output beta = g.variable("beta", f32, {4}, Initializer::uniform(-0.5, 0.5));
      Output y;
      {
        auto mixed = g.mixedPrecision(low);
        const Output h = relu(batchNormTrain(conv2d(x, f1, {{1, 1}, {1, 1}, {1, 1}}), gamma, beta, 1e-5).y);
        y = conv2d(h, f2, {{1, 1}, {1, 1}, {1, 1}});
      }
      if (keepLow) CHECK(keepActivationsLow(g).opsLowered == 2);
      results.push_back(testing::evaluate(g, y));
    }
    CHECK(testing::compare(results[1], results[0].toDoubles(), 0.0) == "");
  }
}

TEST_CASE("a variable's gradient stays f32 where the op summing it could take bf16") {
  // One filter used by two convolutions: its gradient is the AddN of two f32 filter gradients
  // cast up from bf16, which the rewrite leaves in f32 because a gradient link names it.
  Graph g;
  const Output x = g.constant(randomTensor(f32, {2, 3, 5, 5}, 31));
  const Output f = g.variable("f", f32, {3, 3, 3, 3}, Initializer::uniform(-0.5, 0.5));
  Output loss;
  {
    auto mixed = g.mixedPrecision(bf16);
    const Output once = conv2d(x, f, {{1, 1}, {1, 1}, {1, 1}});
    loss = sum(square(conv2d(relu(once), f, {{1, 1}, {1, 1}, {1, 1}})));
  }
  optim::SGD(0.1).minimize(loss);
  bool found = false;
  for (const GradientLink& link : g.gradientLinks()) {
    if (link.variable != f.node()) continue;
    found = true;
    CHECK(link.dense.dtype() == f32);
    CHECK(link.dense.node()->op == "AddN");
  }
  CHECK(found);
  CHECK(countOps(g, "Relu", bf16) == 1);
  g.verify();
}

TEST_CASE("the casts the rewrite adds belong to the device, stage and collections of their op") {
  SmallResNet low(true);
  const std::vector<Node*>& backward = low.g.collection(kBackwardCollection);
  const std::set<const Node*> inBackward(backward.begin(), backward.end());
  int casts = 0;
  for (const auto& n : low.g.nodes()) {
    if (n->op != "Cast" || n->inputs[0].node()->op == "Cast") continue;
    const Node* source = n->inputs[0].node();
    if (n->outputs[0].dtype != f32 || source->def->halfOutputs.empty()) continue;
    ++casts;
    CHECK(n->device == source->device);
    CHECK(n->stage == source->stage);
    CHECK(inBackward.count(n.get()) == inBackward.count(source));
  }
  CHECK(casts > 0);
}

TEST_CASE("a graph without 16-bit casts is left as it is") {
  SmallResNet plain(true, f32);
  CHECK(keepActivationsLow(plain.g).opsLowered == 0);
  CHECK(countOps(plain.g, "Cast", bf16) == 0);
}

TEST_CASE("batch norm takes 16-bit x with f32 parameters, and refuses 16-bit parameters") {
  Graph g;
  const Output x = g.constant(randomTensor(f32, {4, 3, 2, 2}, 41));
  const Output gamma = g.constant(randomTensor(f32, {3}, 42)), beta = g.constant(randomTensor(f32, {3}, 43));
  const BatchNormOutputs half = batchNormTrain(cast(x, bf16), gamma, beta, 1e-5);
  CHECK(half.y.dtype() == bf16);
  CHECK(half.batchMean.dtype() == f32);
  // The 16-bit op computes what the f32 op computes on the rounded input, rounded.
  const BatchNormOutputs wide = batchNormTrain(cast(cast(x, bf16), f32), gamma, beta, 1e-5);
  Session s(g);
  const auto v = s.run({half.y, cast(wide.y, bf16), half.batchVar, wide.batchVar});
  CHECK(testing::compare(v[0], v[1].toDoubles(), 0.0) == "");
  CHECK(testing::compare(v[2], v[3].toDoubles(), 0.0) == "");
  CHECK_THROWS_WITH_AS(batchNormTrain(cast(x, bf16), cast(gamma, bf16), beta, 1e-5),
                       doctest::Contains("input 1 must be f32 to go with the 16-bit input 0 (bf16), got bf16"), Error);
}
