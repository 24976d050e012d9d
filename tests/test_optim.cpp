// Optimizers: updates against hand-computed values, sparse against dense updates on the rows a
// lookup touches, weight decay, learning-rate schedules, moving averages and the step counter.
#include "tests/TestUtil.h"

#include "optim/Optimizer.h"

#include <functional>
#include <memory>

using namespace weft;

namespace {

/// w starts at (1, 2); loss = sum(w * c) with c = (0.5, -1), so every gradient is c.
std::vector<double> twoSteps(optim::Optimizer& opt) {
  Graph g;
  Output w = g.variable("w", f64, {2}, Initializer::fromTensor(Tensor::fromVector<double>({1, 2}, {2})));
  Output loss = sum(w * g.constant(Tensor::fromVector<double>({0.5, -1}, {2})));
  Node* step = opt.minimize(loss);
  Session s(g);
  s.run(step);
  s.run(step);
  return s.variable("w").toDoubles();
}

}  // namespace

TEST_CASE("SGD: w -= lr g") {
  optim::SGD opt(0.1);
  CHECK_CLOSE(Tensor::fromVector(twoSteps(opt), {2}), (std::vector<double>{0.9, 2.2}), 1e-12);
}

TEST_CASE("SGD with weight decay adds wd w to the gradient") {
  optim::SGD opt(0.1, 0.5);
  // step 1: (1, 2) - 0.1 ((0.5, -1) + 0.5 (1, 2)) = (0.9, 2.0); step 2: (0.9, 2) - 0.1 (0.95, 0) = (0.805, 2.0)
  CHECK_CLOSE(Tensor::fromVector(twoSteps(opt), {2}), (std::vector<double>{0.805, 2.0}), 1e-12);
}

TEST_CASE("momentum accumulates a = m a + g") {
  optim::Momentum opt(0.1, 0.9);
  // a1 = c, w1 = w0 - 0.1 c; a2 = 1.9 c, w2 = w1 - 0.19 c
  CHECK_CLOSE(Tensor::fromVector(twoSteps(opt), {2}), (std::vector<double>{0.855, 2.29}), 1e-12);
}

TEST_CASE("Nesterov momentum steps by g + m a") {
  optim::Momentum opt(0.1, 0.9, true);
  // step 1: 1.9 c; step 2: c + 0.9 * 1.9 c = 2.71 c; total 0.461 c
  CHECK_CLOSE(Tensor::fromVector(twoSteps(opt), {2}), (std::vector<double>{0.7695, 2.461}), 1e-12);
}

TEST_CASE("Adam's bias-corrected first steps move by lr sign(g)") {
  optim::Adam opt(0.1);
  CHECK_CLOSE(Tensor::fromVector(twoSteps(opt), {2}), (std::vector<double>{0.8, 2.2}), 1e-6);
}

TEST_CASE("AdamW decays the weights directly") {
  optim::Adam opt(0.1, 0.9, 0.999, 1e-8, 0.5, true);
  // step 1: w = w - 0.1 (sign(c) + 0.5 w): (1 - 0.1 (1 + 0.5), 2 - 0.1 (-1 + 1)) = (0.85, 2.0)
  // step 2: (0.85 - 0.1 (1 + 0.425), 2 - 0.1 (-1 + 1)) = (0.7075, 2.0)
  CHECK_CLOSE(Tensor::fromVector(twoSteps(opt), {2}), (std::vector<double>{0.7075, 2.0}), 1e-6);
}

TEST_CASE("a sharded update changes its elements of the variable as the whole update does, and no other") {
  Graph g;
  const Tensor start = Tensor::fromVector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  const Output lr = g.scalar(0.1, f64);
  const Attrs momentum{{"momentum", 0.9}};
  const Output w = g.variable("w", f64, {2, 3}, Initializer::fromTensor(start));
  const Output a = g.variable("a", f64, {2, 3}, Initializer::zeros());
  const Output grad = g.constant(Tensor::fromVector<double>({0.5, -1, 2, -3, 0.25, 7}, {2, 3}));
  Node* whole = g.addNode("ApplyMomentum", {w, a, grad, lr}, momentum);
  // Elements [2, 5) of the same variable, its slot and gradient.
  const Output w2 = g.variable("w2", f64, {2, 3}, Initializer::fromTensor(start));
  const Output a2 = g.variable("a2", f64, {2, 3}, Initializer::zeros());
  g.shardVariable(a2.node(), 2, 3);
  Attrs sharded = momentum;
  sharded.set("shard_offset", int64_t{2});
  Node* shard =
      g.addNode("ApplyMomentum", {w2, a2, g.constant(Tensor::fromVector<double>({2, -3, 0.25}, {3})), lr}, sharded);
  Session s(g);
  for (int i = 0; i < 2; ++i) s.run({}, {}, {whole, shard});
  const std::vector<double> expected = s.variable("w").toDoubles(), got = s.variable("w2").toDoubles();
  for (size_t i = 0; i < 6; ++i) CHECK(got[i] == (i >= 2 && i < 5 ? expected[i] : start.toDoubles()[i]));
  const std::vector<double> slot = s.variable("a").toDoubles();
  CHECK(s.variable("a2").toDoubles() == std::vector<double>(slot.begin() + 2, slot.begin() + 5));
}

TEST_CASE("a sharded update reaching past the variable's end is refused, naming the elements") {
  Graph g;
  const Output w = g.variable("w", f64, {6}, Initializer::zeros());
  const Output a = g.variable("a", f64, {8}, Initializer::zeros());
  g.shardVariable(a.node(), 4, 3);  // a slot of 3 elements, as a shard [4, 7) of w's would be
  const std::string error = errorOf([&] {
    g.addNode("ApplyMomentum", {w, a, g.constant(Tensor::full(f64, {3}, 1)), g.scalar(0.1, f64)},
              {{"momentum", 0.9}, {"shard_offset", int64_t{4}}});
  });
  CHECK(contains(error, "shard [4, 7) lies outside the variable of 6 elements"));
}

TEST_CASE("Adagrad divides by the root of the summed squares") {
  optim::Adagrad opt(0.1);
  const double s = 0.1 / std::sqrt(2.0);
  CHECK_CLOSE(Tensor::fromVector(twoSteps(opt), {2}), (std::vector<double>{0.9 - s, 2.1 + s}), 1e-9);
}

TEST_CASE("sparse updates equal dense updates on the rows a lookup touches") {
  using Factory = std::function<std::unique_ptr<optim::Optimizer>(double wd)>;
  const std::vector<std::pair<const char*, Factory>> optimizers{
      {"sgd", [](double wd) { return std::make_unique<optim::SGD>(0.1, wd); }},
      {"momentum", [](double wd) { return std::make_unique<optim::Momentum>(0.1, 0.9, true, wd); }},
      {"adam", [](double wd) { return std::make_unique<optim::Adam>(0.05, 0.9, 0.999, 1e-8, wd); }},
      {"adagrad", [](double wd) { return std::make_unique<optim::Adagrad>(0.1, 1e-10, wd); }}};
  const Tensor coef = testing::randomTensor(f64, {4, 3}, 9);
  const Tensor idsValue = Tensor::fromVector<int64_t>({1, 4, 1, 2}, {4});  // row 1 twice
  for (const auto& [name, make] : optimizers) {
    for (double wd : {0.0, 0.1}) {
      CAPTURE(name);
      CAPTURE(wd);
      auto train = [&](bool sparse) {
        Graph g;
        g.setSeed(5);
        Output table = g.variable("table", f64, {6, 3}, Initializer::normal(0, 1));
        Output ids = g.placeholder("ids", i64, {4});
        Output loss = sum(square(gather(table, ids) * g.constant(coef)));
        Grad grad = gradients(loss, {table})[0];
        REQUIRE(grad.isSparse());
        if (!sparse) grad = Grad(toDense(grad));
        auto opt = make(wd);
        Node* step = opt->applyGradients({{grad, table}});
        Session s(g);
        for (int i = 0; i < 3; ++i) s.run(step, {{ids, idsValue}});
        return s.variable("table").toDoubles();
      };
      const std::vector<double> sparse = train(true), dense = train(false);
      for (int row : {1, 2, 4}) {
        for (int j = 0; j < 3; ++j) {
          CHECK(sparse[static_cast<size_t>(row * 3 + j)] ==
                doctest::Approx(dense[static_cast<size_t>(row * 3 + j)]).epsilon(1e-12));
        }
      }
      if (wd == 0) CHECK_CLOSE(Tensor::fromVector(sparse, {18}), dense, 1e-12);
    }
  }
}

TEST_CASE("a sparse update with an out-of-range row id is refused") {
  Graph g;
  Output table = g.variable("table", f32, {3, 2}, Initializer::zeros());
  Output ids = g.placeholder("ids", i64, {1});
  Output values = g.placeholder("values", f32, {1, 2});
  Node* step = optim::SGD(0.1).applyGradients({{Grad::sparse(ids, values, {3, 2}), table}});
  Session s(g);
  CHECK_THROWS_WITH_AS(
      s.run(step, {{ids, Tensor::fromVector<int64_t>({5}, {1})}, {values, Tensor::zeros(f32, {1, 2})}}),
      doctest::Contains("row id 5"), Error);
}

TEST_CASE("the global step counts training steps") {
  Graph g;
  Output w = g.variable("w", f32, {1}, Initializer::zeros());
  Node* step = optim::SGD(0.1).minimize(sum(w * 2.0));
  Session s(g);
  for (int i = 0; i < 3; ++i) s.run(step);
  CHECK(s.variable("global_step").item() == 3);
}

TEST_CASE("learning-rate schedules follow their formulas") {
  auto at = [](optim::LearningRate lr, int64_t stepValue) {
    Graph g;
    Output w = g.variable("w", f64, {1}, Initializer::zeros());
    optim::SGD opt(std::move(lr));
    opt.minimize(sum(w));
    Session s(g);
    s.setVariable("global_step", Tensor::fromVector<int64_t>({stepValue}, {}));
    return s.run({opt.learningRate()})[0].item();
  };
  CHECK(at(0.3, 17) == doctest::Approx(0.3));
  CHECK(at(optim::exponentialDecay(0.1, 0.5, 10), 5) == doctest::Approx(0.1 * std::sqrt(0.5)));
  CHECK(at(optim::exponentialDecay(0.1, 0.5, 10, true), 15) == doctest::Approx(0.05));
  CHECK(at(optim::cosineDecay(1.0, 100, 0.1), 50) == doctest::Approx(0.55));
  CHECK(at(optim::cosineDecay(1.0, 100, 0.1), 500) == doctest::Approx(0.1));
  CHECK(at(optim::warmup(1.0, 10), 4) == doctest::Approx(0.5));
  CHECK(at(optim::warmup(1.0, 10), 40) == doctest::Approx(1.0));
}

TEST_CASE("a moving average tracks variables after the step it follows") {
  Graph g;
  Output w = g.variable("w", f64, {1}, Initializer::constant(1));
  Node* bump = assignAdd(w, g.constant(Tensor::fromVector<double>({1}, {1})));
  optim::ExponentialMovingAverage ema(0.5);
  Node* average = ema.apply({w}, bump);
  Session s(g);
  s.run(average);  // w = 2, avg = 0.5 * 1 + 0.5 * 2
  CHECK(s.variable(ema.average(w).node()).item() == doctest::Approx(1.5));
  s.run(average);  // w = 3, avg = 0.75 + 1.5
  CHECK(s.variable(ema.average(w).node()).item() == doctest::Approx(2.25));
}

TEST_CASE("slots are created once per variable and can be looked up") {
  Graph g;
  Output w = g.variable("w", f32, {2, 2}, Initializer::zeros());
  optim::Adam opt(0.1);
  opt.minimize(sum(w));
  CHECK(opt.slot(w, "m").shape() == Shape{2, 2});
  CHECK(opt.slot(w, "v").node()->attrs.get<bool>("trainable") == false);
  CHECK_THROWS_AS(opt.slot(w, "momentum"), Error);
}

TEST_CASE("minimize without trainable variables is an error") {
  Graph g;
  Output x = g.placeholder("x", f32, {2});
  CHECK_THROWS_WITH_AS(optim::SGD(0.1).minimize(sum(x)), doctest::Contains("no trainable variables"), Error);
}
