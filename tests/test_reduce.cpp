// Tests of the reductions (ops/Reduce.cpp): sum, mean and max over any set of axes with and
// without kept dimensions, argmax, finite-difference gradients and axis errors.
#include "autodiff/Gradients.h"
#include "ops/Ops.h"
#include "tests/TestUtil.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

using namespace weft;
using weft::testing::evaluate;
using weft::testing::randomInts;
using weft::testing::randomTensor;
using weft::testing::toleranceFor;

namespace {

enum class Kind { Sum, Mean, Max };

/// Whether axis d of a rank-r tensor is among `axes` (all when empty; negative from the end).
bool isReduced(const std::vector<int64_t>& axes, int d, int r) {
  if (axes.empty()) return true;
  return std::any_of(axes.begin(), axes.end(), [&](int64_t a) { return (a < 0 ? a + r : a) == d; });
}

/// The output shape of a reduction.
Shape reducedShape(const Shape& x, const std::vector<int64_t>& axes, bool keepDims) {
  std::vector<int64_t> dims;
  for (int d = 0; d < x.rank(); ++d) {
    if (!isReduced(axes, d, x.rank())) dims.push_back(x[d]);
    else if (keepDims) dims.push_back(1);
  }
  return Shape(std::move(dims));
}

/// Naive reduction: each element goes to the output cell with its reduced coordinates zeroed.
std::vector<double> reduceReference(const Tensor& x, const std::vector<int64_t>& axes, Kind kind) {
  const Shape& s = x.shape();
  const Shape kept = reducedShape(s, axes, true);
  const double init = kind == Kind::Max ? -std::numeric_limits<double>::infinity() : 0.0;
  std::vector<double> out(static_cast<size_t>(kept.numel()), init);
  std::vector<int64_t> count(out.size(), 0);
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t rem = i, o = 0, stride = 1;
    for (int d = s.rank() - 1; d >= 0; --d) {
      const int64_t coord = rem % s[d];
      rem /= s[d];
      if (!isReduced(axes, d, s.rank())) o += coord * stride;
      stride *= kept[d];
    }
    double& cell = out[static_cast<size_t>(o)];
    cell = kind == Kind::Max ? std::max(cell, x.at(i)) : cell + x.at(i);
    ++count[static_cast<size_t>(o)];
  }
  if (kind == Kind::Mean) {
    for (size_t o = 0; o < out.size(); ++o) out[o] /= static_cast<double>(count[o]);
  }
  return out;
}

Output reduceOp(Kind kind, Output x, std::vector<int64_t> axes, bool keepDims) {
  switch (kind) {
    case Kind::Sum: return sum(x, std::move(axes), keepDims);
    case Kind::Mean: return mean(x, std::move(axes), keepDims);
    case Kind::Max: return max(x, std::move(axes), keepDims);
  }
  return {};
}

const char* kindName(Kind k) { return k == Kind::Sum ? "Sum" : k == Kind::Mean ? "Mean" : "Max"; }

struct ReduceCase {
  Shape shape;
  std::vector<int64_t> axes;
};

std::string axesStr(const std::vector<int64_t>& axes) {
  std::string s;
  for (int64_t a : axes) s += std::to_string(a) + " ";
  return s;
}

}  // namespace

TEST_CASE("sum, mean and max match a naive reference over any axes, with and without keepDims") {
  FOR_EACH_FLOAT_DTYPE(dt)
  const std::vector<ReduceCase> cases = {
      {{2, 3, 4}, {}},      {{2, 3, 4}, {0}},        {{2, 3, 4}, {1}},     {{2, 3, 4}, {2}},
      {{2, 3, 4}, {-1}},    {{2, 3, 4}, {0, 2}},     {{2, 3, 4}, {2, 0}},  {{2, 3, 4}, {1, 2}},
      {{2, 3, 4}, {0, 1}},  {{2, 3, 4}, {-3, -2}},   {{2, 3, 4}, {0, 1, 2}}, {{5}, {0}},
      {{5}, {}},            {{1, 1}, {0}},           {{3, 1, 2}, {1}},     {{2, 1, 3, 2}, {1, 3}},
      {{37, 41}, {0}},      {{37, 41}, {1}},         {{9, 17, 11}, {1}},   {{9, 17, 11}, {0, 2}},
      {{}, {}},
  };
  for (Kind kind : {Kind::Sum, Kind::Mean, Kind::Max}) {
    for (const ReduceCase& c : cases) {
      for (bool keep : {false, true}) {
        CAPTURE(std::string(kindName(kind)));
        CAPTURE(c.shape.str());
        CAPTURE(axesStr(c.axes));
        CAPTURE(keep);
        Graph g;
        Output x = g.placeholder("x", dt, c.shape);
        Output y = reduceOp(kind, x, c.axes, keep);
        const Shape expectedShape = reducedShape(c.shape, c.axes, keep);
        CHECK(y.shape() == expectedShape);
        CHECK(y.dtype() == dt);
        const Tensor tx = randomTensor(dt, c.shape, 1);
        const Tensor out = evaluate(g, y, {{x, tx}}, 4);
        CHECK(out.shape() == expectedShape);
        CHECK_CLOSE(out, reduceReference(tx, c.axes, kind), toleranceFor(dt));
      }
    }
  }
}

TEST_CASE("sum and mean over empty dimensions") {
  FOR_EACH_FLOAT_DTYPE(dt)
  Graph g;
  Output x = g.placeholder("x", dt, {0, 3});
  const FeedMap feeds{{x, Tensor::zeros(dt, {0, 3})}};
  // Summing nothing gives zeros; reducing a non-empty axis of an empty tensor gives an empty one.
  const Tensor s0 = evaluate(g, sum(x, {0}), feeds);
  CHECK(s0.shape() == Shape{3});
  CHECK(s0.toDoubles() == std::vector<double>{0, 0, 0});
  CHECK(evaluate(g, sum(x, {1}, true), feeds).shape() == Shape{0, 1});
  CHECK(evaluate(g, mean(x, {1}), feeds).shape() == Shape{0});
  CHECK(evaluate(g, max(x, {1}), feeds).shape() == Shape{0});
  CHECK(evaluate(g, sum(x), feeds).item() == 0.0);
}

TEST_CASE("reductions of integers") {
  for (DType dt : {i32, i64}) {
    CAPTURE(std::string(dtypeName(dt)));
    Graph g;
    Output x = g.constant(Tensor::fromVector<int32_t>({1, -5, 3, 4, 2, 6}, {2, 3}).cast(dt));
    CHECK(evaluate(g, sum(x, {1})).toDoubles() == std::vector<double>{-1, 12});
    CHECK(evaluate(g, max(x, {0})).toDoubles() == std::vector<double>{4, 2, 6});
    CHECK(evaluate(g, max(x)).item() == 6);
    CHECK(evaluate(g, sum(x)).dtype() == dt);
  }
}

TEST_CASE("max of values that are all -inf is -inf") {
  FOR_EACH_FLOAT_DTYPE(dt)
  Graph g;
  Output x = g.constant(Tensor::fromVector<double>({-HUGE_VAL, -HUGE_VAL, 1, 2}, {2, 2}).cast(dt));
  const Tensor out = evaluate(g, max(x, {1}));
  CHECK(out.at(0) == -HUGE_VAL);
  CHECK(out.at(1) == 2);
}

TEST_CASE("mean of integers is rejected when the graph is built") {
  Graph g;
  Output x = g.constant(Tensor::fromVector<int32_t>({2, 4, 3, 6}, {2, 2}));
  CHECK_THROWS_AS(mean(x, {1}), weft::Error);
}

TEST_CASE("max propagates NaN") {
  FOR_EACH_FLOAT_DTYPE(dt)
  Graph g;
  Output x = g.constant(Tensor::fromVector<double>({1, NAN, 3, 2}, {2, 2}).cast(dt));
  const Tensor out = evaluate(g, max(x, {1}));
  CHECK(std::isnan(out.at(0)));
  CHECK(out.at(1) == 3);
}

TEST_CASE("reductions with an unknown dimension") {
  Graph g;
  Output x = g.placeholder("x", f32, {-1, 3});
  CHECK(sum(x, {0}).shape() == Shape{3});
  CHECK(mean(x, {1}).shape() == Shape{-1});
  CHECK(max(x, {1}, true).shape() == Shape{-1, 1});
  const Tensor tx = randomTensor(f32, {4, 3}, 2);
  const Tensor out = evaluate(g, mean(x, {1}), {{x, tx}});
  CHECK(out.shape() == Shape{4});
  CHECK_CLOSE(out, reduceReference(tx, {1}, Kind::Mean), toleranceFor(f32));
}

TEST_CASE("sum, mean and max gradients match finite differences") {
  const std::vector<std::vector<int64_t>> axesList = {{}, {0}, {1}, {-1}, {0, 2}, {1, 2}, {0, 1}};
  for (Kind kind : {Kind::Sum, Kind::Mean, Kind::Max}) {
    for (const auto& axes : axesList) {
      for (bool keep : {false, true}) {
        CAPTURE(std::string(kindName(kind)));
        CAPTURE(axesStr(axes));
        CAPTURE(keep);
        Graph g;
        Output x = g.placeholder("x", f64, {2, 3, 2});
        const FeedMap feeds{{x, randomTensor(f64, {2, 3, 2}, 3)}};
        CHECK_GRADIENTS(checkGradients(g, reduceOp(kind, x, axes, keep), {x}, feeds));
      }
    }
  }
}

TEST_CASE("reduction gradients with size-1 axes and a scalar input") {
  for (Kind kind : {Kind::Sum, Kind::Mean, Kind::Max}) {
    CAPTURE(std::string(kindName(kind)));
    Graph g;
    Output x = g.placeholder("x", f64, {1, 3, 1}), s = g.placeholder("s", f64, {});
    const FeedMap feeds{{x, randomTensor(f64, {1, 3, 1}, 4)}, {s, randomTensor(f64, {}, 5)}};
    CHECK_GRADIENTS(checkGradients(g, reduceOp(kind, x, {0, 2}, false), {x}, feeds));
    CHECK_GRADIENTS(checkGradients(g, reduceOp(kind, x, {2}, true), {x}, feeds));
    CHECK_GRADIENTS(checkGradients(g, reduceOp(kind, s, {}, false), {s}, feeds));
  }
}

TEST_CASE("reduction gradients with an unknown dimension use the run-time shape") {
  for (Kind kind : {Kind::Sum, Kind::Mean, Kind::Max}) {
    for (const auto& axes : std::vector<std::vector<int64_t>>{{}, {0}, {1}}) {
      for (bool keep : {false, true}) {
        CAPTURE(std::string(kindName(kind)));
        CAPTURE(axesStr(axes));
        CAPTURE(keep);
        Graph g;
        Output x = g.placeholder("x", f64, {-1, 3});
        const FeedMap feeds{{x, randomTensor(f64, {4, 3}, 8)}};
        CHECK_GRADIENTS(checkGradients(g, reduceOp(kind, x, axes, keep), {x}, feeds));
      }
    }
  }
}

TEST_CASE("second-order use: the gradient of a reduction feeds another reduction") {
  // The gradient of sum(x^2 * mean(x)) runs BroadcastReduced inside a larger expression.
  Graph g;
  Output x = g.placeholder("x", f64, {2, 3});
  Output y = sum(square(x) * mean(x, {1}, true), {0});
  CHECK_GRADIENTS(checkGradients(g, y, {x}, {{x, randomTensor(f64, {2, 3}, 6)}}));
}

TEST_CASE("max shares the gradient equally among tied maxima") {
  Graph g;
  Output x = g.placeholder("x", f64, {2, 3});
  const Tensor tx = Tensor::fromVector<double>({1, 3, 3, 2, 0, 2}, {2, 3});
  const std::vector<Grad> grads = gradients(sum(max(x, {1})), {x});
  REQUIRE(grads[0].valid());
  CHECK_CLOSE(evaluate(g, toDense(grads[0]), {{x, tx}}), (std::vector<double>{0, 0.5, 0.5, 0.5, 0, 0.5}), 1e-12);
}

TEST_CASE("argmax returns the first index of the maximum as i64") {
  DType dt = f32;
  SUBCASE("f32") { dt = f32; }
  SUBCASE("f64") { dt = f64; }
  SUBCASE("i32") { dt = i32; }
  SUBCASE("i64") { dt = i64; }
  for (const Shape& shape : {Shape{2, 3, 4}, Shape{5}, Shape{1, 4}, Shape{3, 1}, Shape{0, 3}}) {
    for (int64_t axis = -shape.rank(); axis < shape.rank(); ++axis) {
      const int a = static_cast<int>(axis < 0 ? axis + shape.rank() : axis);
      if (shape[a] == 0) continue;
      CAPTURE(shape.str());
      CAPTURE(axis);
      Graph g;
      Output x = g.placeholder("x", dt, shape);
      Output y = argmax(x, axis);
      CHECK(y.dtype() == i64);
      std::vector<int64_t> outDims = shape.dims();
      outDims.erase(outDims.begin() + a);
      CHECK(y.shape() == Shape(outDims));
      // Values in {0, 1, 2} make ties common.
      const Tensor tx = randomInts(i32, shape, 0, 3, 7).cast(dt);
      int64_t outer = 1, inner = 1;
      for (int d = 0; d < a; ++d) outer *= shape[d];
      for (int d = a + 1; d < shape.rank(); ++d) inner *= shape[d];
      std::vector<double> expected;
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t j = 0; j < inner; ++j) {
          int64_t best = 0;
          for (int64_t i = 0; i < shape[a]; ++i) {
            if (tx.at((o * shape[a] + i) * inner + j) > tx.at((o * shape[a] + best) * inner + j)) best = i;
          }
          expected.push_back(static_cast<double>(best));
        }
      }
      const Tensor out = evaluate(g, y, {{x, tx}});
      CHECK(out.dtype() == i64);
      CHECK(out.shape() == Shape(outDims));
      CHECK_CLOSE(out, expected, 0.0);
    }
  }
}

TEST_CASE("argmax has no gradient") {
  Graph g;
  Output x = g.placeholder("x", f64, {2, 3});
  CHECK_FALSE(gradients(sum(cast(argmax(x, 1), f64)), {x})[0].valid());
}

TEST_CASE("reductions reject out-of-range and repeated axes, naming the op") {
  for (Kind kind : {Kind::Sum, Kind::Mean, Kind::Max}) {
    CAPTURE(std::string(kindName(kind)));
    Graph g;
    Output x = g.placeholder("x", f32, {2, 3});
    std::string msg = errorOf([&] { reduceOp(kind, x, {2}, false); });
    CHECK_MESSAGE(contains(msg, kindName(kind)), msg);
    CHECK_MESSAGE(contains(msg, "out of range"), msg);
    msg = errorOf([&] { reduceOp(kind, x, {-3}, false); });
    CHECK_MESSAGE(contains(msg, kindName(kind)), msg);
    msg = errorOf([&] { reduceOp(kind, x, {1, -1}, false); });
    CHECK_MESSAGE(contains(msg, kindName(kind)), msg);
    CHECK_MESSAGE(contains(msg, "repeated"), msg);
  }
}

TEST_CASE("max and argmax reject an empty axis") {
  Graph g;
  Output x = g.placeholder("x", f32, {0, 3});
  std::string msg = errorOf([&] { max(x, {0}); });
  CHECK_MESSAGE(contains(msg, "Max"), msg);
  CHECK_MESSAGE(contains(msg, "empty"), msg);
  msg = errorOf([&] { argmax(x, 0); });
  CHECK_MESSAGE(contains(msg, "ArgMax"), msg);
  CHECK_MESSAGE(contains(msg, "empty"), msg);
}

TEST_CASE("argmax rejects an out-of-range axis") {
  Graph g;
  Output x = g.placeholder("x", f32, {2, 3});
  for (int64_t axis : {2, -3}) {
    const std::string msg = errorOf([&] { argmax(x, axis); });
    CHECK_MESSAGE(contains(msg, "ArgMax"), msg);
    CHECK_MESSAGE(contains(msg, "out of range"), msg);
  }
}
