// The graph rewrite API that passes use: redirecting uses, changing one input, retargeting a
// node's op with its types inferred again, control edges, the topological order that holds after
// a rewrite (and that autodiff walks), and verify(), which catches what a rewrite broke.
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "core/OpRegistry.h"
#include "ops/Ops.h"

#include <algorithm>

using namespace weft;

namespace {

size_t positionOf(const std::vector<Node*>& order, const Node* n) {
  return static_cast<size_t>(std::find(order.begin(), order.end(), n) - order.begin());
}

}  // namespace

TEST_CASE("replaceUses redirects every reader, or only the consumers named") {
  Graph g;
  const Output x = g.placeholder("x", f32, {3});
  const Output a = x * 2.0, b = x + 1.0;
  const Output y = g.placeholder("y", f32, {3});
  CHECK(g.replaceUses(x, y, {b.node()}) == 1);
  CHECK(a.node()->inputs[0] == x);
  CHECK(b.node()->inputs[0] == y);
  CHECK(g.replaceUses(x, y) == 1);
  CHECK(a.node()->inputs[0] == y);
}

TEST_CASE("a replacement of another shape re-infers what lies downstream") {
  Graph g;
  const Output x = g.placeholder("x", f32, {3});
  const Output a = x * 2.0;
  const Output b = tanh(a);
  const Output rows = g.placeholder("rows", f32, {8});  // as an AllGather's rows replace one worker's
  CHECK(g.replaceUses(x, rows) == 1);
  CHECK(a.node()->outputs[0].shape == Shape{8});
  CHECK(b.node()->outputs[0].shape == Shape{8});
  g.verify();
}

TEST_CASE("a replacement of another dtype, one a consumer refuses, or one that reads itself changes nothing") {
  Graph g;
  const Output x = g.placeholder("x", f32, {2, 3});
  const Output w = g.placeholder("w", f32, {3, 4});
  const Output a = matmul(x, w);
  const Output out = tanh(a);
  const Output doubles = g.placeholder("d", f64, {2, 3});
  const Output wrongInner = g.placeholder("wrong", f32, {2, 5});
  CHECK(contains(errorOf([&] { g.replaceUses(x, doubles); }), "f64[2, 3]"));
  CHECK(contains(errorOf([&] { g.replaceUses(x, wrongInner); }), "inner dimensions differ"));
  CHECK(contains(errorOf([&] { g.setInput(out.node(), 0, out); }), "its own output"));
  CHECK(a.node()->inputs[0] == x);
  CHECK(out.node()->inputs[0] == a);
  CHECK(out.node()->outputs[0].shape == Shape{2, 4});
  g.verify();
}

TEST_CASE("retarget changes a node's op and attributes and infers its outputs again") {
  Graph g;
  const Output x = g.placeholder("x", f32, {2, 3});
  const Output s = sum(x, {1});
  Node* n = s.node();
  const Output consumer = s * 2.0;
  g.retarget(n, "Max", n->attrs, "cpu");
  CHECK(n->op == "Max");
  CHECK(n->device == "cpu");
  CHECK(n->def == &OpRegistry::global().get("Max"));
  CHECK(consumer.node()->inputs[0] == s);
  g.verify();
}

TEST_CASE("retarget refuses an op whose outputs would not fit the consumers, changing nothing") {
  Graph g;
  const Output x = g.placeholder("x", f32, {2, 3});
  const Output s = sum(x, {1});
  const Output consumer = s * 2.0;
  Attrs allAxes = s.node()->attrs;
  allAxes.set("axes", std::vector<int64_t>{0, 1});
  CHECK(contains(errorOf([&] { g.retarget(s.node(), "Sum", allAxes, ""); }), "its consumers read f32[2]"));
  CHECK(s.node()->attrs.get<std::vector<int64_t>>("axes") == std::vector<int64_t>{1});
  CHECK(contains(errorOf([&] { g.retarget(s.node(), "MatMul", s.node()->attrs, ""); }), "MatMul"));
  CHECK(s.node()->op == "Sum");
  CHECK(consumer.node()->outputs[0].shape == Shape{2});
}

TEST_CASE("control edges go through the graph") {
  Graph g;
  const Output v = g.variable("v", f32, {1}, Initializer::zeros());
  Node* first = assign(v, g.scalar(1.0) * onesLike(v));
  Node* second = assignAdd(v, onesLike(v));
  Node* step = g.group({first});
  g.replaceControlInputs(first, second);
  CHECK(step->controlInputs == std::vector<Node*>{second});
  g.addControlInput(second, first);
  CHECK(second->controlInputs == std::vector<Node*>{first});
  CHECK(contains(errorOf([&] { g.addControlInput(first, first); }), "distinct"));
  CHECK(contains(errorOf([&] { g.replaceControlInputs(first, second); }), "would wait for itself"));
}

TEST_CASE("a node that waited for two nodes replaced by one waits for it once") {
  Graph g;
  const Output v = g.variable("v", f32, {1}, Initializer::zeros());
  Node* first = assign(v, onesLike(v));
  Node* second = assignAdd(v, onesLike(v));
  Node* step = g.group({first, second});
  Node* both = g.group({});
  g.replaceControlInputs(first, both);
  g.replaceControlInputs(second, both);
  CHECK(step->controlInputs == std::vector<Node*>{both});
}

TEST_CASE("an untouched graph's topological order is its creation order") {
  Graph g;
  const Output x = g.placeholder("x", f32, {4});
  const Output loss = sum(tanh(x * 3.0) + x);
  gradients(loss, {x});
  const std::vector<Node*> order = g.topologicalOrder();
  REQUIRE(order.size() == g.size());
  for (size_t i = 0; i < order.size(); ++i) CHECK(order[i]->id == static_cast<int>(i));
}

TEST_CASE("after a rewrite, a node that reads a later one comes after it, and autodiff follows") {
  Graph g;
  const Output x = g.placeholder("x", f32, {3});
  const Output h = tanh(x);      // created before the node it will read
  const Output scaled = x * 2.0;  // created after h
  g.setInput(h.node(), 0, scaled);
  const std::vector<Node*> order = g.topologicalOrder();
  CHECK(positionOf(order, scaled.node()) < positionOf(order, h.node()));
  g.verify();
  // d/dx sum(tanh(2x)) = 2 (1 - tanh(2x)^2), through the rewritten edge.
  const Output loss = sum(h);
  const Output dx = gradients(loss, {x})[0].dense;
  const Tensor xv = Tensor::fromVector<float>({0.1f, -0.4f, 0.7f}, {3});
  Session s(g);
  const std::vector<double> got = s.run({dx}, {{x, xv}})[0].toDoubles();
  for (size_t i = 0; i < 3; ++i) {
    const double t = std::tanh(2.0 * xv.toDoubles()[i]);
    CHECK(got[i] == doctest::Approx(2 * (1 - t * t)).epsilon(1e-6));
  }
}

TEST_CASE("a rewrite that would close a cycle is refused and changes nothing") {
  Graph g;
  const Output x = g.placeholder("x", f32, {3});
  const Output a = tanh(x);
  const Output b = a * 2.0;
  CHECK(contains(errorOf([&] { g.setInput(a.node(), 0, b); }), "cycle through"));  // a would read b, which reads a
  CHECK(contains(errorOf([&] { g.replaceUses(x, b); }), "cycle through"));
  CHECK(a.node()->inputs[0] == x);
  g.verify();
}

TEST_CASE("a cycle made behind the graph's back is named by topologicalOrder and verify") {
  Graph g;
  const Output x = g.placeholder("x", f32, {3});
  const Output a = tanh(x);
  const Output b = a * 2.0;
  a.node()->inputs[0] = b;  // what editing nodes field by field can leave behind
  CHECK(contains(errorOf([&] { g.topologicalOrder(); }), "cycle through"));
  CHECK(contains(errorOf([&] { g.verify(); }), "cycle"));
}

TEST_CASE("verify names a node whose recorded outputs its op no longer infers") {
  Graph g;
  const Output x = g.placeholder("x", f32, {3});
  const Output a = x * 2.0;
  g.verify();
  a.node()->outputs[0].dtype = f64;  // what editing nodes field by field can leave behind
  CHECK(contains(errorOf([&] { g.verify(); }), a.node()->describe()));
}

TEST_CASE("retype feeds a node values of another dtype and gives its other readers a conversion") {
  Graph g;
  const Output x = g.placeholder("x", f32, {4});
  const Output half = cast(x, bf16);
  const Output r = relu(cast(half, f32));
  const Output reader = r * 2.0;
  Node* converted = nullptr;
  g.retype(r.node(), {{0, half}}, [&](Output low) {
    const Output wide = cast(low, f32);
    converted = wide.node();
    return wide;
  });
  CHECK(r.dtype() == bf16);
  CHECK(r.node()->inputs[0] == half);
  REQUIRE(converted != nullptr);
  CHECK(converted->inputs[0] == r);
  CHECK(reader.node()->inputs[0] == converted->output());
  CHECK(reader.dtype() == f32);
  g.verify();
  // An input the op refuses changes nothing.
  const Output ints = g.placeholder("ints", i32, {4});
  CHECK(contains(errorOf([&] { g.retype(reader.node(), {{0, ints}}, [](Output o) { return o; }); }),
                 "must have the same dtype"));
  CHECK(reader.node()->inputs[0] == converted->output());
  g.verify();
}

TEST_CASE("rebuild turns a node into another op on other inputs, and refuses a change its readers would see") {
  Graph g;
  const Output x = g.placeholder("x", f32, {4});
  const Output r = relu(x * 2.0);
  const Output reader = r + 1.0;
  g.rebuild(r.node(), "Abs", {x}, {});
  CHECK(r.node()->op == "Abs");
  CHECK(r.node()->inputs[0] == x);
  CHECK(reader.node()->inputs[0] == r);
  g.verify();
  // Another output type, or a cycle, changes nothing.
  CHECK(contains(errorOf([&] { g.rebuild(r.node(), "Cast", {x}, {{"dtype", f64}}); }), "output 0 would be f64[4]"));
  CHECK(contains(errorOf([&] { g.rebuild(r.node(), "Neg", {reader}, {}); }), "cycle"));
  CHECK(r.node()->op == "Abs");
  CHECK(r.node()->inputs[0] == x);
  g.verify();
}
