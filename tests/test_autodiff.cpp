// gradients(): the chain rule over shared subexpressions, recorded gradient links (dense and
// sparse), densification of mixed gradients, and the errors.
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "core/OpRegistry.h"
#include "ops/Ops.h"

using namespace weft;

namespace {

/// An op computing x^2 whose gradient rule is wrong (x dy instead of 2 x dy).
void registerWrongSquare() {
  registerAllOps();
  OpRegistry& r = OpRegistry::global();
  if (!r.find("TestWrongSquare")) {
    r.add(OpDef("TestWrongSquare")
              .inputs(1)
              .infer([](const InferContext& c) -> std::vector<TensorType> { return {c.inputs[0]}; })
              .cpu([](KernelContext& ctx) {
                const double* x = ctx.input(0).data<double>();
                double* y = ctx.output(0).data<double>();
                for (int64_t i = 0; i < ctx.input(0).numel(); ++i) y[i] = x[i] * x[i];
              })
              .grad([](GradContext& c) -> std::vector<Grad> { return {c.dy() * c.x(0)}; }));  // should be 2x
  }
}

}  // namespace

TEST_CASE("a value used twice receives both contributions") {
  Graph g;
  Output x = g.placeholder("x", f64, {3});
  Output y = sum(x * x + exp(x));  // dy/dx = 2x + e^x
  const Tensor xv = Tensor::fromVector<double>({0.5, -1, 2}, {3});
  const Tensor dx = testing::evaluate(g, gradients(y, {x})[0].dense, {{x, xv}});
  CHECK_CLOSE(dx, (std::vector<double>{1 + std::exp(0.5), -2 + std::exp(-1), 4 + std::exp(2)}), 1e-12);
}

TEST_CASE("the gradient check agrees with autodiff on a composite function") {
  Graph g;
  Output a = g.placeholder("a", f64, {2, 3});
  Output b = g.placeholder("b", f64, {3, 2});
  Output y = tanh(matmul(a, b)) * sigmoid(mean(a, {1}, true));
  CHECK_GRADIENTS(checkGradients(
      g, y, {a, b}, {{a, testing::randomTensor(f64, {2, 3}, 1)}, {b, testing::randomTensor(f64, {3, 2}, 2)}}));
}

TEST_CASE("the gradient check catches a wrong gradient rule") {
  registerWrongSquare();
  Graph g;
  Output x = g.placeholder("x", f64, {3});
  Output y = g.addNode("TestWrongSquare", {x})->output();
  const GradCheckReport report = checkGradients(g, y, {x}, {{x, testing::randomTensor(f64, {3}, 4)}});
  CHECK_FALSE(report.ok);
  CHECK(report.detail.find("x:0") != std::string::npos);
}

TEST_CASE("gradients of variables are recorded as links in the graph") {
  Graph g;
  Output w = g.variable("w", f32, {4, 3}, Initializer::glorotUniform());
  Output table = g.variable("table", f32, {100, 4}, Initializer::normal(0, 1));
  Output ids = g.placeholder("ids", i32, {-1});
  Output loss = sum(matmul(gather(table, ids), w));
  const std::vector<Grad> grads = gradients(loss, {w, table});
  REQUIRE(g.gradientLinks().size() == 2);
  const GradientLink& dense = g.gradientLinks()[0];
  CHECK(dense.variable == w.node());
  CHECK_FALSE(dense.sparse);
  CHECK(dense.dense == grads[0].dense);
  const GradientLink& sparse = g.gradientLinks()[1];
  CHECK(sparse.variable == table.node());
  CHECK(sparse.sparse);
  CHECK(sparse.denseShape == Shape{100, 4});
  CHECK(sparse.values.shape() == Shape{-1, 4});

  // The sparse gradient holds one row per looked-up id, duplicates included.
  Session s(g);
  const auto out = s.run({sparse.indices, sparse.values}, {{ids, Tensor::fromVector<int32_t>({3, 7, 3}, {3})}});
  CHECK(out[0].toDoubles() == std::vector<double>{3, 7, 3});
  CHECK(out[1].shape() == Shape{3, 4});
}

TEST_CASE("two lookups of one table give one sparse gradient with both sets of rows") {
  Graph g;
  Output table = g.variable("table", f64, {10, 2}, Initializer::normal(0, 1));
  Output a = g.placeholder("a", i64, {2}), b = g.placeholder("b", i64, {1});
  Output loss = sum(gather(table, a)) + 2.0 * sum(gather(table, b));
  const Grad grad = gradients(loss, {table})[0];
  REQUIRE(grad.isSparse());
  Session s(g);
  const auto out = s.run({grad.indices, toDense(grad)}, {{a, Tensor::fromVector<int64_t>({1, 4}, {2})},
                                                        {b, Tensor::fromVector<int64_t>({4}, {1})}});
  CHECK(out[0].numel() == 3);
  std::vector<double> expected(20, 0);
  expected[2] = expected[3] = 1;
  expected[8] = expected[9] = 3;
  CHECK_CLOSE(out[1], expected, 0);
}

TEST_CASE("a table used both densely and through a lookup gets a dense gradient") {
  Graph g;
  Output table = g.variable("table", f64, {5, 2}, Initializer::normal(0, 1));
  Output ids = g.placeholder("ids", i64, {2});
  Output loss = sum(gather(table, ids)) + sum(table * table);
  const Grad grad = gradients(loss, {table})[0];
  CHECK_FALSE(grad.isSparse());
  CHECK_FALSE(g.gradientLinks().back().sparse);
  Session s(g);
  const Tensor d = s.run({grad.dense}, {{ids, Tensor::fromVector<int64_t>({0, 0}, {2})}})[0];
  const std::vector<double> w = s.variable("table").toDoubles();
  std::vector<double> expected(10);
  for (size_t i = 0; i < 10; ++i) expected[i] = 2 * w[i] + (i < 2 ? 2 : 0);
  CHECK_CLOSE(d, expected, 1e-12);
}

TEST_CASE("an input the loss does not depend on gets no gradient") {
  Graph g;
  Output x = g.placeholder("x", f64, {2});
  Output z = g.placeholder("z", f64, {2});
  Output loss = sum(x * 2.0);
  const std::vector<Grad> grads = gradients(loss, {x, z});
  CHECK(grads[0].valid());
  CHECK_FALSE(grads[1].valid());
}

TEST_CASE("stopGradient blocks the gradient") {
  Graph g;
  Output x = g.placeholder("x", f64, {2});
  Output loss = sum(stopGradient(x) * x);  // d/dx = stop(x)
  const Tensor d = testing::evaluate(g, gradients(loss, {x})[0].dense, {{x, Tensor::fromVector<double>({3, 4}, {2})}});
  CHECK_CLOSE(d, (std::vector<double>{3, 4}), 0);
}

TEST_CASE("the loss must be a floating scalar") {
  Graph g;
  Output x = g.placeholder("x", f64, {2});
  CHECK_THROWS_WITH_AS(gradients(x * 2.0, {x}), doctest::Contains("scalar"), Error);
}

TEST_CASE("an op without a gradient rule is reported") {
  registerAllOps();
  OpRegistry& r = OpRegistry::global();
  if (!r.find("TestNoGradRule")) {
    r.add(OpDef("TestNoGradRule")
              .inputs(1)
              .infer([](const InferContext& c) -> std::vector<TensorType> { return {c.inputs[0]}; })
              .cpu([](KernelContext& ctx) { ctx.output(0).copyFrom(ctx.input(0)); }));
  }
  Graph g;
  Output x = g.placeholder("x", f64, {2});
  Output loss = sum(g.addNode("TestNoGradRule", {x})->output());
  CHECK_THROWS_WITH_AS(gradients(loss, {x}), doctest::Contains("no gradient is defined for op 'TestNoGradRule'"),
                       Error);
}

TEST_CASE("backward nodes live under the gradients scope") {
  Graph g;
  Output x = g.placeholder("x", f64, {2});
  Output loss = sum(exp(x));
  const Grad d = gradients(loss, {x})[0];
  CHECK(d.dense.node()->name.rfind("gradients/", 0) == 0);
}

TEST_CASE("checkVariableGradients checks a model's variables and refuses vacuous checks") {
  Graph g;
  Output w = g.variable("w", f64, {3}, Initializer::normal(0, 1));
  Output unused = g.variable("unused", f64, {2}, Initializer::normal(0, 1));
  (void)unused;
  Output x = g.placeholder("x", f64, {3});
  Output loss = sum(tanh(w * x) * w);
  const FeedMap feeds{{x, testing::randomTensor(f64, {3}, 5)}};
  CHECK_GRADIENTS(checkVariableGradients(g, loss, {"w"}, feeds));
  const GradCheckReport missing = checkVariableGradients(g, loss, {"w", "unused"}, feeds);
  CHECK_FALSE(missing.ok);
  CHECK(contains(missing.detail, "'unused'"));

  registerWrongSquare();
  Graph h;
  Output v = h.variable("v", f64, {3}, Initializer::normal(0, 1));
  Output wrong = sum(h.addNode("TestWrongSquare", {v})->output());
  const GradCheckReport report = checkVariableGradients(h, wrong, {"v"}, {});
  CHECK_FALSE(report.ok);
}
