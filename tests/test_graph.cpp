// Graph construction: names and scopes, build-time shape inference and its errors, the
// registry's completeness, and the text and DOT dumps.
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "core/OpRegistry.h"
#include "ops/Ops.h"

using namespace weft;

TEST_CASE("names are scoped and unique") {
  Graph g;
  Output x = g.placeholder("x", f32, {2});
  Output a, b;
  {
    auto outer = g.scope("encoder");
    auto inner = g.scope("layer1");
    a = x * 2.0;
    b = x * 3.0;
  }
  CHECK(a.node()->name.rfind("encoder/layer1/Mul", 0) == 0);
  CHECK(a.node()->name != b.node()->name);
  CHECK(g.find(a.node()->name) == a.node());
  CHECK(g.find("missing") == nullptr);
}

TEST_CASE("shapes are inferred when the graph is built, unknown dimensions included") {
  Graph g;
  Output x = g.placeholder("x", f32, {-1, 784});
  Output w = g.variable("w", f32, {784, 10}, Initializer::zeros());
  Output logits = matmul(x, w);
  CHECK(logits.shape() == Shape{-1, 10});
  CHECK(logits.dtype() == f32);
  CHECK(sum(logits, {1}).shape() == Shape{-1});
  CHECK(argmax(logits, 1).dtype() == i64);
}

TEST_CASE("shape errors name the op, the node and the input shapes") {
  Graph g;
  auto scope = g.scope("classifier");
  Output a = g.placeholder("a", f32, {2, 3});
  Output b = g.placeholder("b", f32, {4, 5});
  CHECK_THROWS_WITH_AS(matmul(a, b), doctest::Contains("op 'MatMul' (node 'classifier/MatMul')"), Error);
  CHECK_THROWS_WITH_AS(matmul(a, b), doctest::Contains("f32[2, 3], f32[4, 5]"), Error);
  CHECK_THROWS_WITH_AS(a + b, doctest::Contains("do not broadcast"), Error);
}

TEST_CASE("dtype mismatches are rejected") {
  Graph g;
  Output a = g.placeholder("a", f32, {2});
  Output b = g.placeholder("b", f64, {2});
  CHECK_THROWS_WITH_AS(a + b, doctest::Contains("same dtype"), Error);
}

TEST_CASE("unknown ops and wrong input counts are rejected") {
  registerAllOps();
  Graph g;
  Output a = g.placeholder("a", f32, {2});
  CHECK_THROWS_WITH_AS(g.addNode("Frobnicate", {a}), doctest::Contains("unknown op 'Frobnicate'"), Error);
  CHECK_THROWS_WITH_AS(g.addNode("Add", {a}), doctest::Contains("takes 2 inputs, got 1"), Error);
}

TEST_CASE(
    "every registered op has a shape function, a CPU kernel or source role, and a gradient rule or an explicit "
    "no-gradient mark") {
  registerAllOps();
  const OpRegistry& r = OpRegistry::global();
  CHECK(r.names().size() > 60);
  for (const std::string& name : r.names()) {
    CAPTURE(name);
    const OpDef& d = r.get(name);
    CHECK(static_cast<bool>(d.inferFn));
    CHECK((d.kernelFor(DeviceType::CPU) != nullptr || d.sourceKind != SourceKind::None));
    CHECK((static_cast<bool>(d.gradFn) != d.noGrad));
  }
}

TEST_CASE("variables need fully defined shapes") {
  Graph g;
  CHECK_THROWS_WITH_AS(g.variable("w", f32, {-1, 3}, Initializer::zeros()), doctest::Contains("'w'"), Error);
}

TEST_CASE("the text dump lists ops, shapes, devices and gradient links") {
  Graph g;
  Output x = g.placeholder("x", f32, {-1, 4});
  Output w = g.variable("w", f32, {4, 2}, Initializer::zeros());
  Output table = g.variable("table", f32, {10, 2}, Initializer::zeros());
  Output ids = g.placeholder("ids", i64, {-1});
  Output y;
  {
    auto device = g.onDevice("cpu:0");
    y = sum(matmul(x, w)) + sum(gather(table, ids));
  }
  gradients(y, {w, table});
  const std::string dump = g.dump();
  CHECK(dump.find("MatMul(x:0, w:0) -> (f32[?, 2])") != std::string::npos);
  CHECK(dump.find("@cpu:0") != std::string::npos);
  CHECK(dump.find("grad w = dense(") != std::string::npos);
  CHECK(dump.find("grad table = sparse(indices=") != std::string::npos);
  const std::string dot = g.toDot();
  CHECK(dot.rfind("digraph weft {", 0) == 0);
  CHECK(dot.find("\"x\" -> \"MatMul\"") != std::string::npos);
  CHECK(dot.find("sparse grad") != std::string::npos);
}

TEST_CASE("device scopes validate their device") {
  Graph g;
  CHECK_THROWS_WITH_AS(g.onDevice("tpu:0"), doctest::Contains("tpu:0"), Error);
}
