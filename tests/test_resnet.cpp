// ResNet: layouts and shapes, training and inference paths of batch norm, gradients against
// finite differences, and the zoo model's data and evaluation.
#include "tests/TestUtil.h"

#include "data/Images.h"
#include "models/ResNet.h"

#include <cmath>

using namespace weft;

namespace {

/// A batch of n synthetic images and labels of the given size.
std::pair<Tensor, Tensor> imageBatch(int64_t n, int64_t size, int64_t classes, uint64_t seed) {
  const Tensor images = testing::randomTensor(f32, {n, 3, size, size}, seed);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(i % classes);
  return {images, Tensor::fromVector(labels, {n})};
}

int64_t parameterCount(const Graph& g) {
  int64_t total = 0;
  for (Node* v : g.trainableVariables()) total += v->outputs[0].shape.numel();
  return total;
}

/// Largest |autodiff - central difference| over the elements of a variable, relative to the
/// gradient's scale; the loss is evaluated by perturbing the variable's value in the session.
double gradientError(Session& s, Output loss, Output variable, const FeedMap& feeds) {
  const Tensor analytic = s.run({gradients(loss, {variable})[0].dense}, feeds)[0];
  const std::string name = variable.node()->name;
  const Tensor original = s.variable(name).clone();
  const double h = 1e-5;
  double worst = 0, scale = 1e-3;
  for (int64_t i = 0; i < original.numel(); ++i) {
    auto lossAt = [&](double delta) {
      Tensor moved = original.clone();
      moved.data<double>()[i] += delta;
      s.setVariable(name, moved);
      return s.run({loss}, feeds)[0].item();
    };
    const double numeric = (lossAt(h) - lossAt(-h)) / (2 * h);
    worst = std::max(worst, std::abs(numeric - analytic.at(i)));
    scale = std::max(scale, std::abs(numeric));
  }
  s.setVariable(name, original);
  return worst / scale;
}

}  // namespace

TEST_CASE("ResNet-20 has 20 weighted layers, about 0.27M parameters and (batch, 10) logits") {
  Graph g;
  const models::ResNetNet net = models::buildResNet(g, {});
  int64_t convs = 0;
  for (Node* v : g.trainableVariables()) convs += v->name.ends_with("/filter") && !contains(v->name, "shortcut");
  CHECK(convs == 19);  // + the classifier
  CHECK(parameterCount(g) > 260000);
  CHECK(parameterCount(g) < 290000);
  CHECK(net.evalLogits.shape() == Shape{-1, 10});
  const auto [images, labels] = imageBatch(2, 32, 10, 1);
  Session s(g, {2});
  const auto out = s.run({net.evalLogits, net.loss}, {{net.images, images}, {net.labels, labels}});
  CHECK(out[0].shape() == Shape{2, 10});
  CHECK(std::isfinite(out[1].item()));
}

TEST_CASE("ResNet depth 56 has 55 convolutions and other depths are rejected naming them") {
  Graph g;
  models::ResNetConfig config;
  config.depth = 56;
  models::buildResNet(g, config);
  int64_t convs = 0;
  for (Node* v : g.trainableVariables()) convs += v->name.ends_with("/filter") && !contains(v->name, "shortcut");
  CHECK(convs == 55);
  Graph bad;
  config.depth = 21;
  CHECK(contains(errorOf([&] { models::buildResNet(bad, config); }), "depth 21"));
}

TEST_CASE("one momentum step on a fixed batch lowers the ResNet-20 training loss") {
  Graph g;
  const models::ResNetNet net = models::buildResNet(g, {});
  Node* step = optim::Momentum(0.05, 0.9, false, 5e-4).minimize(net.loss);
  const data::Batch batch = data::collate(data::syntheticImages({}, 16, 1), 0, 16, {});
  const FeedMap feeds{{net.images, batch.at("images")}, {net.labels, batch.at("labels")}};
  Session s(g, {2});
  const double before = s.run({net.loss}, feeds, {step})[0].item();
  const double after = s.run({net.loss}, feeds)[0].item();
  CHECK(after < before);
}

TEST_CASE("a tiny f64 ResNet's gradients match central differences") {
  Graph g;
  models::ResNetConfig config;
  config.depth = 8;
  config.width = 2;
  config.classes = 3;
  config.dtype = f64;
  const models::ResNetNet net = models::buildResNet(g, config);
  const auto [images, labels] = imageBatch(4, 8, 3, 2);
  const FeedMap feeds{{net.images, images}, {net.labels, labels}};
  Session s(g, {1});
  for (const char* name : {"stem/filter", "stage2/block1/conv1/filter", "stage3/block1/shortcut/filter",
                           "stage2/block1/conv2_bn/gamma", "fc/weight"}) {
    Node* variable = g.find(name);
    REQUIRE_MESSAGE(variable != nullptr, name);
    CHECK_MESSAGE(gradientError(s, net.loss, variable->output(0), feeds) < 1e-6, name);
  }
}

TEST_CASE("a training step updates the batch-norm moving statistics") {
  Graph g;
  models::ResNetConfig config;
  config.depth = 8;
  config.width = 4;
  const models::ResNetNet net = models::buildResNet(g, config);
  CHECK(g.collection("update_ops").size() == 2 * 9);  // mean and variance of 9 batch norms
  Node* step = optim::Momentum(0.01, 0.9).minimize(net.loss);
  const auto [images, labels] = imageBatch(4, 16, 10, 3);
  Session s(g, {2});
  const Tensor mean = s.variable("stem_bn/moving_mean").clone(), var = s.variable("stem_bn/moving_var").clone();
  s.run(step, {{net.images, images}, {net.labels, labels}});
  CHECK(s.variable("stem_bn/moving_mean").toDoubles() != mean.toDoubles());
  CHECK(s.variable("stem_bn/moving_var").toDoubles() != var.toDoubles());
}

TEST_CASE("the inference path normalises with the moving statistics, not the batch's") {
  Graph g;
  models::ResNetConfig config;
  config.depth = 8;
  config.width = 4;
  const models::ResNetNet net = models::buildResNet(g, config);
  const auto [images, labels] = imageBatch(4, 16, 10, 4);
  Session s(g, {2});
  const Tensor batched = s.run({net.evalLogits}, {{net.images, images}})[0];
  // Example 0 alone gives the same logits: nothing depends on the rest of the batch.
  const Tensor alone = s.run({net.evalLogits}, {{net.images, Tensor(images.buffer(), 0, f32, {1, 3, 16, 16})}})[0];
  std::vector<double> first = batched.toDoubles();
  first.resize(10);
  CHECK_CLOSE(alone, first, 1e-5);
  // Changing the moving statistics changes the output.
  s.setVariable("stem_bn/moving_mean", Tensor::full(f32, {4}, 0.5));
  const Tensor shifted = s.run({net.evalLogits}, {{net.images, images}})[0];
  CHECK(shifted.toDoubles() != batched.toDoubles());
}

TEST_CASE("ResNet-50 has bottleneck stages to 2048 channels and runs a training step on 64x64 images") {
  Graph g;
  models::ResNetConfig config;
  config.depth = 50;
  const models::ResNetNet net = models::buildResNet(g, config);
  // 25.6M with a 1000-way classifier; 23.5M with 10 classes.
  CHECK(parameterCount(g) > 23400000);
  CHECK(parameterCount(g) < 23600000);
  Node* last = g.find("stage4/block3/conv3/filter");
  REQUIRE(last != nullptr);
  CHECK(last->outputs[0].shape == Shape{2048, 512, 1, 1});
  Node* step = optim::Momentum(0.01, 0.9).minimize(net.loss);
  const auto [images, labels] = imageBatch(2, 64, 10, 5);
  const FeedMap feeds{{net.images, images}, {net.labels, labels}};
  Session s(g, {2});
  const Tensor before = s.variable("fc/weight").clone();
  const double loss = s.run({net.loss}, feeds, {step})[0].item();
  CHECK(std::isfinite(loss));
  CHECK(s.variable("fc/weight").toDoubles() != before.toDoubles());
  CHECK(s.run({net.evalLogits}, feeds)[0].shape() == Shape{2, 10});
}

TEST_CASE("the resnet zoo model trains on synthetic images and evaluates top-1 accuracy") {
  std::unique_ptr<models::ZooModel> model = models::makeResNetModel();
  for (const models::ModelOption& o : model->options()) {
    if (o.name == "depth") *std::get<int64_t*>(o.target) = 8;
    if (o.name == "train-images") *std::get<int64_t*>(o.target) = 64;
    if (o.name == "test-images") *std::get<int64_t*>(o.target) = 30;
    if (o.name == "eval-batch") *std::get<int64_t*>(o.target) = 16;
  }
  CHECK(model->defaultOptimizer().name == "momentum");
  CHECK(model->defaultOptimizer().weightDecay > 0);
  Graph g;
  models::CommonOptions common;
  common.batchSize = 8;
  model->build(g, common);
  const data::Batch batch = model->trainData().next();
  CHECK(batch.at("images").shape() == Shape{8, 3, 32, 32});
  CHECK(batch.at("labels").shape() == Shape{8});
  CHECK(model->itemsIn(batch) == std::pair<std::string, double>{"images", 8});
  Node* step = optim::Momentum(0.05, 0.9).minimize(model->loss());
  Session s(g, {2});
  s.run({model->loss()}, models::feedsFor(g, batch), {step});
  const auto metrics = model->evaluate(s, 0);
  CHECK(metrics.at("accuracy") >= 0);
  CHECK(metrics.at("accuracy") <= 1);
  CHECK(std::isfinite(metrics.at("loss")));
  CHECK(model->targetMetric() == "accuracy");
  CHECK(model->higherIsBetter());
}

TEST_CASE("the resnet zoo model reports a missing CIFAR-10 directory by file") {
  std::unique_ptr<models::ZooModel> model = models::makeResNetModel();
  Graph g;
  models::CommonOptions common;
  common.data = "/nonexistent/cifar";
  CHECK(contains(errorOf([&] { model->build(g, common); }), "data_batch_1.bin"));
}

TEST_CASE("the resnet zoo model takes a CIFAR-100 directory with 100 fine or 20 coarse classes") {
  TempDir dir;
  auto write = [&](const std::string& name, int records) {
    std::string bytes;
    for (int r = 0; r < records; ++r) {
      bytes.push_back(static_cast<char>(r % 20));  // coarse
      bytes.push_back(static_cast<char>(r % 100)); // fine
      bytes.append(3072, static_cast<char>(r));
    }
    dir.write(name, bytes);
  };
  write("train.bin", 8);
  write("test.bin", 4);
  for (const char* labels : {"fine", "coarse"}) {
    CAPTURE(labels);
    std::unique_ptr<models::ZooModel> model = models::makeResNetModel();
    for (const models::ModelOption& o : model->options()) {
      if (o.name == "depth") *std::get<int64_t*>(o.target) = 8;
      if (o.name == "cifar100-labels") *std::get<std::string*>(o.target) = labels;
    }
    Graph g;
    models::CommonOptions common;
    common.batchSize = 4;
    common.data = dir.path.string();
    model->build(g, common);
    CHECK(g.find("fc/weight")->output().shape()[1] == (std::string(labels) == "fine" ? 100 : 20));
    CHECK(model->trainData().next().at("labels").shape() == Shape{4});
  }
  std::unique_ptr<models::ZooModel> model = models::makeResNetModel();
  for (const models::ModelOption& o : model->options())
    if (o.name == "cifar100-labels") *std::get<std::string*>(o.target) = "medium";
  Graph g;
  models::CommonOptions common;
  common.data = dir.path.string();
  CHECK(contains(errorOf([&] { model->build(g, common); }), "--cifar100-labels is fine or coarse, not 'medium'"));
}

TEST_CASE("the resnet zoo model draws synthetic images of the size asked, and refuses it for CIFAR-10") {
  auto withSize = [](int64_t size) {
    std::unique_ptr<models::ZooModel> model = models::makeResNetModel();
    for (const models::ModelOption& o : model->options()) {
      if (o.name == "depth") *std::get<int64_t*>(o.target) = 8;
      if (o.name == "image-size") *std::get<int64_t*>(o.target) = size;
      if (o.name == "train-images") *std::get<int64_t*>(o.target) = 8;
      if (o.name == "test-images") *std::get<int64_t*>(o.target) = 4;
    }
    return model;
  };
  Graph g;
  models::CommonOptions common;
  common.batchSize = 4;
  std::unique_ptr<models::ZooModel> model = withSize(48);
  model->build(g, common);
  CHECK(model->trainData().next().at("images").shape() == Shape{4, 3, 48, 48});
  Graph tiny, cifar;
  CHECK(contains(errorOf([&] { withSize(4)->build(tiny, common); }), "image-size 4"));
  common.data = "/nonexistent/cifar";
  CHECK(contains(errorOf([&] { withSize(48)->build(cifar, common); }), "not the 48 of --image-size"));
}
