// Tests of the elementwise ops (ops/Elementwise.cpp): forward against naive double references with
// numpy broadcasting, finite-difference gradients, shape errors and run-time data errors.
#include "autodiff/Gradients.h"
#include "ops/Ops.h"
#include "tests/TestUtil.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

using namespace weft;
using weft::testing::evaluate;
using weft::testing::randomInts;
using weft::testing::randomTensor;
using weft::testing::toleranceFor;

namespace {

/// Flat index into a tensor of shape `in` of element `o` of its numpy broadcast to `out`.
int64_t broadcastIndex(const Shape& out, const Shape& in, int64_t o) {
  int64_t index = 0, stride = 1;
  for (int d = out.rank() - 1, e = in.rank() - 1; d >= 0; --d, --e) {
    const int64_t coord = o % out[d];
    o /= out[d];
    if (e < 0) continue;
    if (in[e] != 1) index += coord * stride;
    stride *= in[e];
  }
  return index;
}

std::vector<double> binaryReference(const Tensor& a, const Tensor& b, const Shape& out,
                                    const std::function<double(double, double)>& f) {
  std::vector<double> r(static_cast<size_t>(out.numel()));
  for (int64_t i = 0; i < out.numel(); ++i) {
    r[static_cast<size_t>(i)] = f(a.at(broadcastIndex(out, a.shape(), i)), b.at(broadcastIndex(out, b.shape(), i)));
  }
  return r;
}

std::vector<double> unaryReference(const Tensor& x, const std::function<double(double)>& f) {
  std::vector<double> r;
  for (int64_t i = 0; i < x.numel(); ++i) r.push_back(f(x.at(i)));
  return r;
}

struct BinaryOp {
  const char* name;
  Output (*build)(Output, Output);
  double (*reference)(double, double);
  double lo, hi;  // input range (positive where the op needs it)
};

const std::vector<BinaryOp>& binaryOps() {
  static const std::vector<BinaryOp> ops = {
      {"Add", weft::add, [](double a, double b) { return a + b; }, -1, 1},
      {"Sub", weft::sub, [](double a, double b) { return a - b; }, -1, 1},
      {"Mul", weft::mul, [](double a, double b) { return a * b; }, -1, 1},
      {"Div", weft::div, [](double a, double b) { return a / b; }, 0.5, 2},
      {"Maximum", weft::maximum, [](double a, double b) { return a >= b ? a : b; }, -1, 1},
      {"Minimum", weft::minimum, [](double a, double b) { return a <= b ? a : b; }, -1, 1},
      {"Pow", weft::pow, [](double a, double b) { return std::pow(a, b); }, 0.5, 2},
  };
  return ops;
}

struct BroadcastCase {
  Shape a, b, out;
};

const std::vector<BroadcastCase>& broadcastCases() {
  static const std::vector<BroadcastCase> cases = {
      {{2, 3}, {2, 3}, {2, 3}}, {{2, 3}, {3}, {2, 3}},       {{3}, {2, 3}, {2, 3}},
      {{2, 1}, {1, 3}, {2, 3}}, {{2, 3}, {}, {2, 3}},        {{}, {2, 3}, {2, 3}},
      {{}, {}, {}},             {{4, 1, 3}, {2, 1}, {4, 2, 3}}, {{1, 1}, {1, 1}, {1, 1}},
      {{0, 3}, {3}, {0, 3}},    {{2, 0}, {2, 1}, {2, 0}},
  };
  return cases;
}

struct UnaryOp {
  const char* name;
  Output (*build)(Output);
  double (*reference)(double);
  double lo, hi;
};

const std::vector<UnaryOp>& unaryOps() {
  static const std::vector<UnaryOp> ops = {
      {"Neg", weft::neg, [](double x) { return -x; }, -1, 1},
      {"Exp", weft::exp, [](double x) { return std::exp(x); }, -1, 1},
      {"Log", weft::log, [](double x) { return std::log(x); }, 0.5, 2},
      {"Tanh", weft::tanh, [](double x) { return std::tanh(x); }, -2, 2},
      {"Sigmoid", weft::sigmoid, [](double x) { return 1 / (1 + std::exp(-x)); }, -3, 3},
      {"Relu", weft::relu, [](double x) { return x > 0 ? x : 0.0; }, -1, 1},
      {"Sqrt", weft::sqrt, [](double x) { return std::sqrt(x); }, 0.5, 2},
      {"Rsqrt", weft::rsqrt, [](double x) { return 1 / std::sqrt(x); }, 0.5, 2},
      {"Abs", weft::abs, [](double x) { return std::abs(x); }, -1, 1},
      {"Square", weft::square, [](double x) { return x * x; }, -1, 1},
      {"Reciprocal", weft::reciprocal, [](double x) { return 1 / x; }, 0.5, 2},
      {"Sign", weft::sign, [](double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; }, -1, 1},
      {"Sin", weft::sin, [](double x) { return std::sin(x); }, -3, 3},
      {"Cos", weft::cos, [](double x) { return std::cos(x); }, -3, 3},
  };
  return ops;
}

}  // namespace

// ---- binary arithmetic ---------------------------------------------------------------------

TEST_CASE("binary arithmetic matches a double reference under broadcasting") {
  FOR_EACH_FLOAT_DTYPE(dt)
  for (const BinaryOp& op : binaryOps()) {
    for (const BroadcastCase& c : broadcastCases()) {
      CAPTURE(std::string(op.name));
      CAPTURE(c.a.str());
      CAPTURE(c.b.str());
      Graph g;
      Output a = g.placeholder("a", dt, c.a), b = g.placeholder("b", dt, c.b);
      Output y = op.build(a, b);
      CHECK(y.shape() == c.out);
      CHECK(y.dtype() == dt);
      const Tensor ta = randomTensor(dt, c.a, 1, op.lo, op.hi), tb = randomTensor(dt, c.b, 2, op.lo, op.hi);
      const Tensor out = evaluate(g, y, {{a, ta}, {b, tb}});
      CHECK(out.shape() == c.out);
      CHECK_CLOSE(out, binaryReference(ta, tb, c.out, op.reference), toleranceFor(dt));
    }
  }
}

TEST_CASE("binary arithmetic on large broadcast inputs is the same with several threads") {
  FOR_EACH_FLOAT_DTYPE(dt)
  for (const BinaryOp& op : binaryOps()) {
    for (const BroadcastCase& c : {BroadcastCase{{40, 50}, {50}, {40, 50}}, BroadcastCase{{40, 1}, {1, 50}, {40, 50}},
                                   BroadcastCase{{3, 40, 1}, {40, 1}, {3, 40, 1}}}) {
      CAPTURE(std::string(op.name));
      CAPTURE(c.a.str());
      Graph g;
      Output a = g.placeholder("a", dt, c.a), b = g.placeholder("b", dt, c.b);
      const Tensor ta = randomTensor(dt, c.a, 3, op.lo, op.hi), tb = randomTensor(dt, c.b, 4, op.lo, op.hi);
      const Tensor out = evaluate(g, op.build(a, b), {{a, ta}, {b, tb}}, 4);
      CHECK_CLOSE(out, binaryReference(ta, tb, c.out, op.reference), toleranceFor(dt));
    }
  }
}

TEST_CASE("binary arithmetic on integers") {
  for (DType dt : {i32, i64}) {
    CAPTURE(std::string(dtypeName(dt)));
    Graph g;
    const Tensor ta = Tensor::fromVector<int32_t>({7, -7, 6, 0}, {4}).cast(dt);
    const Tensor tb = Tensor::fromVector<int32_t>({2, 2, -4, 5}, {4}).cast(dt);
    Output a = g.constant(ta), b = g.constant(tb);
    CHECK(evaluate(g, add(a, b)).toDoubles() == std::vector<double>{9, -5, 2, 5});
    CHECK(evaluate(g, sub(a, b)).toDoubles() == std::vector<double>{5, -9, 10, -5});
    CHECK(evaluate(g, mul(a, b)).toDoubles() == std::vector<double>{14, -14, -24, 0});
    // C++ integer division truncates toward zero.
    CHECK(evaluate(g, div(a, b)).toDoubles() == std::vector<double>{3, -3, -1, 0});
    CHECK(evaluate(g, maximum(a, b)).toDoubles() == std::vector<double>{7, 2, 6, 5});
    CHECK(evaluate(g, minimum(a, b)).toDoubles() == std::vector<double>{2, -7, -4, 0});
    CHECK(evaluate(g, add(a, b)).dtype() == dt);
  }
}

TEST_CASE("binary arithmetic gradients match finite differences under broadcasting") {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{2, 3}, {2, 3}}, {{2, 3}, {3}}, {{2, 1}, {1, 3}}, {{2, 3}, {}}, {{}, {2, 3}}, {{1, 1}, {1, 3}}, {{0, 3}, {3}}};
  for (const BinaryOp& op : binaryOps()) {
    for (const auto& [sa, sb] : shapes) {
      CAPTURE(std::string(op.name));
      CAPTURE(sa.str());
      CAPTURE(sb.str());
      Graph g;
      Output a = g.placeholder("a", f64, sa), b = g.placeholder("b", f64, sb);
      // Distinct seeds keep maximum/minimum away from ties.
      const FeedMap feeds{{a, randomTensor(f64, sa, 5, op.lo, op.hi)}, {b, randomTensor(f64, sb, 6, op.lo, op.hi)}};
      CHECK_GRADIENTS(checkGradients(g, op.build(a, b), {a, b}, feeds));
    }
  }
}

TEST_CASE("integer pow is exact and takes negative exponents as truncated reciprocals") {
  Graph g;
  const Output a = g.placeholder("a", i64, {9}), b = g.placeholder("b", i64, {9});
  const Tensor ta = Tensor::fromVector<int64_t>({3, -2, 2, 1, -1, -1, 0, 7, 3}, {9});
  const Tensor tb = Tensor::fromVector<int64_t>({4, 3, -1, -5, -3, -2, -1, 0, 39}, {9});
  // 3^39 = 4052555153018976267 needs 62 bits: a double holds 53.
  CHECK(Session(g).run({pow(a, b)}, {{a, ta}, {b, tb}})[0].toVector<int64_t>() ==
        std::vector<int64_t>{81, -8, 0, 1, -1, 1, 0, 1, 4052555153018976267});
}

TEST_CASE("pow gradient with respect to a negative exponent") {
  Graph g;
  Output a = g.placeholder("a", f64, {2, 3}), b = g.placeholder("b", f64, {2, 3});
  const FeedMap feeds{{a, randomTensor(f64, {2, 3}, 7, 0.5, 2)}, {b, randomTensor(f64, {2, 3}, 8, -2, -0.5)}};
  CHECK_GRADIENTS(checkGradients(g, pow(a, b), {a, b}, feeds));
}

TEST_CASE("binary ops with an unknown dimension infer it from the broadcast and run") {
  Graph g;
  Output a = g.placeholder("a", f32, {-1, 3}), b = g.placeholder("b", f32, {3});
  Output y = add(a, b);
  CHECK(y.shape() == Shape{-1, 3});
  const Tensor ta = randomTensor(f32, {4, 3}, 9), tb = randomTensor(f32, {3}, 10);
  const Tensor out = evaluate(g, y, {{a, ta}, {b, tb}});
  CHECK(out.shape() == Shape{4, 3});
  CHECK_CLOSE(out, binaryReference(ta, tb, {4, 3}, [](double x, double z) { return x + z; }), toleranceFor(f32));
}

TEST_CASE("binary op gradients with unknown dimensions use the run-time shapes") {
  // (-1, 3) may be fed as (1, 3): its gradient must then be summed over the broadcast rows.
  struct Case {
    Shape a, b, feedA, feedB;
  };
  for (const Case& c : {Case{{-1, 3}, {3}, {2, 3}, {3}}, Case{{-1, 1}, {1, 3}, {2, 1}, {1, 3}},
                        Case{{-1, 3}, {4, 3}, {1, 3}, {4, 3}}, Case{{-1, 3}, {-1, 3}, {2, 3}, {1, 3}}}) {
    for (const BinaryOp& op : binaryOps()) {
      CAPTURE(std::string(op.name));
      CAPTURE(c.feedA.str());
      CAPTURE(c.feedB.str());
      Graph g;
      Output a = g.placeholder("a", f64, c.a), b = g.placeholder("b", f64, c.b);
      const FeedMap feeds{{a, randomTensor(f64, c.feedA, 60, op.lo, op.hi)},
                          {b, randomTensor(f64, c.feedB, 61, op.lo, op.hi)}};
      CHECK_GRADIENTS(checkGradients(g, op.build(a, b), {a, b}, feeds));
    }
  }
}

TEST_CASE("binary ops reject shapes that do not broadcast, naming the op and both shapes") {
  for (const BinaryOp& op : binaryOps()) {
    CAPTURE(std::string(op.name));
    Graph g;
    Output a = g.placeholder("a", f32, {2, 3}), b = g.placeholder("b", f32, {4});
    const std::string msg = errorOf([&] { op.build(a, b); });
    CHECK_MESSAGE(contains(msg, op.name), msg);
    CHECK_MESSAGE(contains(msg, "[2, 3]"), msg);
    CHECK_MESSAGE(contains(msg, "[4]"), msg);
  }
}

TEST_CASE("binary ops reject mixed dtypes") {
  Graph g;
  Output a = g.placeholder("a", f32, {2, 3}), b = g.placeholder("b", f64, {2, 3});
  const std::string msg = errorOf([&] { add(a, b); });
  CHECK_MESSAGE(contains(msg, "Add"), msg);
  CHECK_MESSAGE(contains(msg, "dtype"), msg);
}

TEST_CASE("integer division by zero fails at run time") {
  for (DType dt : {i32, i64}) {
    CAPTURE(std::string(dtypeName(dt)));
    Graph g;
    Output a = g.placeholder("a", dt, {3}), b = g.placeholder("b", dt, {3});
    const FeedMap feeds{{a, Tensor::fromVector<int32_t>({6, 7, 8}, {3}).cast(dt)},
                        {b, Tensor::fromVector<int32_t>({2, 0, 4}, {3}).cast(dt)}};
    const std::string msg = errorOf([&] { evaluate(g, div(a, b), feeds); });
    CHECK_MESSAGE(contains(msg, "Div"), msg);
    CHECK_MESSAGE(contains(msg, "division by zero"), msg);
  }
}

// ---- operators -----------------------------------------------------------------------------

TEST_CASE("arithmetic operators, including scalar forms, match a double reference") {
  FOR_EACH_FLOAT_DTYPE(dt)
  Graph g;
  Output x = g.placeholder("x", dt, {2, 3}), z = g.placeholder("z", dt, {3});
  const Tensor tx = randomTensor(dt, {2, 3}, 11, 0.5, 2), tz = randomTensor(dt, {3}, 12, 0.5, 2);
  const FeedMap feeds{{x, tx}, {z, tz}};
  const double s = 2.5;
  struct Case {
    const char* name;
    Output y;
    std::function<double(double, double)> reference;  // of (x, z) elements
  };
  const std::vector<Case> cases = {
      {"x + z", x + z, [](double a, double b) { return a + b; }},
      {"x - z", x - z, [](double a, double b) { return a - b; }},
      {"x * z", x * z, [](double a, double b) { return a * b; }},
      {"x / z", x / z, [](double a, double b) { return a / b; }},
      {"-x", -x, [](double a, double) { return -a; }},
      {"x + s", x + s, [s](double a, double) { return a + s; }},
      {"x - s", x - s, [s](double a, double) { return a - s; }},
      {"x * s", x * s, [s](double a, double) { return a * s; }},
      {"x / s", x / s, [s](double a, double) { return a / s; }},
      {"s + x", s + x, [s](double a, double) { return s + a; }},
      {"s - x", s - x, [s](double a, double) { return s - a; }},
      {"s * x", s * x, [s](double a, double) { return s * a; }},
      {"s / x", s / x, [s](double a, double) { return s / a; }},
  };
  for (const Case& c : cases) {
    CAPTURE(std::string(c.name));
    CHECK(c.y.dtype() == dt);
    CHECK(c.y.shape() == Shape{2, 3});
    CHECK_CLOSE(evaluate(g, c.y, feeds), binaryReference(tx, tz, {2, 3}, c.reference), toleranceFor(dt));
  }
}

TEST_CASE("scalarLike makes a scalar constant of the input's dtype") {
  FOR_EACH_FLOAT_DTYPE(dt)
  Graph g;
  Output x = g.placeholder("x", dt, {2});
  Output s = scalarLike(x, 1.5);
  CHECK(s.dtype() == dt);
  CHECK(s.shape() == Shape{});
  CHECK(evaluate(g, s).item() == 1.5);
}

TEST_CASE("arithmetic operators with scalars have finite-difference gradients") {
  Graph g;
  Output x = g.placeholder("x", f64, {2, 3}), z = g.placeholder("z", f64, {3});
  Output y = (2.0 / x - x * 3.0 + 1.5) / (z - 4.0) + (0.5 - z) * (-x) + x / 2.0 + 3.0 * z + (x + 1.0);
  const FeedMap feeds{{x, randomTensor(f64, {2, 3}, 13, 0.5, 2)}, {z, randomTensor(f64, {3}, 14, 0.5, 2)}};
  CHECK_GRADIENTS(checkGradients(g, y, {x, z}, feeds));
}

// ---- unary math ----------------------------------------------------------------------------

TEST_CASE("unary math matches a double reference") {
  FOR_EACH_FLOAT_DTYPE(dt)
  for (const UnaryOp& op : unaryOps()) {
    for (const Shape& shape : {Shape{2, 3}, Shape{1, 1}, Shape{}, Shape{0, 3}, Shape{37, 29}}) {
      CAPTURE(std::string(op.name));
      CAPTURE(shape.str());
      Graph g;
      Output x = g.placeholder("x", dt, shape);
      Output y = op.build(x);
      CHECK(y.shape() == shape);
      CHECK(y.dtype() == dt);
      const Tensor tx = randomTensor(dt, shape, 15, op.lo, op.hi);
      const Tensor out = evaluate(g, y, {{x, tx}}, 4);
      CHECK(out.shape() == shape);
      CHECK_CLOSE(out, unaryReference(tx, op.reference), toleranceFor(dt));
    }
  }
}

TEST_CASE("unary math at special points") {
  Graph g;
  Output x = g.constant(Tensor::fromVector<double>({0.0, -0.0, 1.0, -1.0}, {4}));
  CHECK(evaluate(g, relu(x)).toDoubles() == std::vector<double>{0, 0, 1, 0});
  CHECK(evaluate(g, sign(x)).toDoubles() == std::vector<double>{0, 0, 1, -1});
  CHECK(evaluate(g, abs(x)).toDoubles() == std::vector<double>{0, 0, 1, 1});
  CHECK(evaluate(g, sigmoid(x)).at(0) == doctest::Approx(0.5));
}

TEST_CASE("unary math gradients match finite differences") {
  for (const UnaryOp& op : unaryOps()) {
    for (const Shape& shape : {Shape{2, 3}, Shape{1}, Shape{}}) {
      CAPTURE(std::string(op.name));
      CAPTURE(shape.str());
      Graph g;
      Output x = g.placeholder("x", f64, shape);
      const FeedMap feeds{{x, randomTensor(f64, shape, 16, op.lo, op.hi)}};
      CHECK_GRADIENTS(checkGradients(g, op.build(x), {x}, feeds));
    }
  }
}

TEST_CASE("unary math rejects integer inputs") {
  for (const UnaryOp& op : unaryOps()) {
    CAPTURE(std::string(op.name));
    Graph g;
    Output x = g.placeholder("x", i32, {2});
    const std::string msg = errorOf([&] { op.build(x); });
    CHECK_MESSAGE(contains(msg, op.name), msg);
  }
}

// ---- comparisons and where -----------------------------------------------------------------

TEST_CASE("comparisons give 1 and 0 in the inputs' dtype, including ties") {
  struct Cmp {
    const char* name;
    Output (*build)(Output, Output);
    bool (*reference)(double, double);
  };
  const std::vector<Cmp> cmps = {
      {"Less", weft::less, [](double a, double b) { return a < b; }},
      {"LessEqual", weft::lessEqual, [](double a, double b) { return a <= b; }},
      {"Greater", weft::greater, [](double a, double b) { return a > b; }},
      {"GreaterEqual", weft::greaterEqual, [](double a, double b) { return a >= b; }},
      {"Equal", weft::equal, [](double a, double b) { return a == b; }},
      {"NotEqual", weft::notEqual, [](double a, double b) { return a != b; }},
  };
  DType dt = f32;
  SUBCASE("f32") { dt = f32; }
  SUBCASE("f64") { dt = f64; }
  SUBCASE("i32") { dt = i32; }
  SUBCASE("i64") { dt = i64; }
  for (const Cmp& cmp : cmps) {
    for (const BroadcastCase& c : broadcastCases()) {
      CAPTURE(std::string(cmp.name));
      CAPTURE(c.a.str());
      CAPTURE(c.b.str());
      Graph g;
      Output a = g.placeholder("a", dt, c.a), b = g.placeholder("b", dt, c.b);
      Output y = cmp.build(a, b);
      CHECK(y.dtype() == dt);
      CHECK(y.shape() == c.out);
      // Values in {-1, 0, 1} make ties common.
      const Tensor ta = randomInts(i32, c.a, -1, 2, 17).cast(dt), tb = randomInts(i32, c.b, -1, 2, 18).cast(dt);
      const Tensor out = evaluate(g, y, {{a, ta}, {b, tb}});
      CHECK_CLOSE(out,
                  binaryReference(ta, tb, c.out, [&](double p, double q) { return cmp.reference(p, q) ? 1.0 : 0.0; }),
                  0.0);
    }
  }
}

TEST_CASE("comparisons have no gradient") {
  Graph g;
  Output a = g.placeholder("a", f64, {2, 3}), b = g.placeholder("b", f64, {3});
  const std::vector<Grad> grads = gradients(sum(less(a, b) + greaterEqual(a, b) + equal(a, b)), {a, b});
  CHECK_FALSE(grads[0].valid());
  CHECK_FALSE(grads[1].valid());
}

TEST_CASE("where selects a where the condition is nonzero, broadcasting all three") {
  FOR_EACH_FLOAT_DTYPE(dt)
  struct Case {
    Shape cond, a, b, out;
    DType condType;
  };
  for (const Case& c : {Case{{2, 3}, {2, 3}, {2, 3}, {2, 3}, dt}, Case{{2, 1}, {2, 3}, {3}, {2, 3}, i64},
                        Case{{3}, {2, 1}, {}, {2, 3}, i32}, Case{{}, {2, 3}, {2, 3}, {2, 3}, dt},
                        Case{{0, 3}, {3}, {3}, {0, 3}, dt}}) {
    CAPTURE(c.cond.str());
    CAPTURE(c.a.str());
    CAPTURE(c.b.str());
    Graph g;
    Output cond = g.placeholder("cond", c.condType, c.cond);
    Output a = g.placeholder("a", dt, c.a), b = g.placeholder("b", dt, c.b);
    Output y = where(cond, a, b);
    CHECK(y.shape() == c.out);
    CHECK(y.dtype() == dt);
    const Tensor tc = randomInts(i32, c.cond, -1, 2, 19).cast(c.condType);
    const Tensor ta = randomTensor(dt, c.a, 20), tb = randomTensor(dt, c.b, 21);
    std::vector<double> expected;
    for (int64_t i = 0; i < c.out.numel(); ++i) {
      const bool pick = tc.at(broadcastIndex(c.out, c.cond, i)) != 0;
      expected.push_back(pick ? ta.at(broadcastIndex(c.out, c.a, i)) : tb.at(broadcastIndex(c.out, c.b, i)));
    }
    CHECK_CLOSE(evaluate(g, y, {{cond, tc}, {a, ta}, {b, tb}}), expected, 0.0);
  }
}

TEST_CASE("where gradients flow to the selected branch") {
  for (const auto& [sa, sb] : std::vector<std::pair<Shape, Shape>>{{{2, 3}, {2, 3}}, {{2, 3}, {3}}, {{2, 1}, {}}}) {
    CAPTURE(sa.str());
    CAPTURE(sb.str());
    Graph g;
    Output cond = g.constant(Tensor::fromVector<double>({1, 0, 1, 0, 0, 1}, {2, 3}));
    Output rowCond = g.constant(Tensor::fromVector<int64_t>({0, 3}, {2, 1}));
    Output a = g.placeholder("a", f64, sa), b = g.placeholder("b", f64, sb);
    const FeedMap feeds{{a, randomTensor(f64, sa, 22)}, {b, randomTensor(f64, sb, 23)}};
    CHECK_GRADIENTS(checkGradients(g, where(cond, a, b), {a, b}, feeds));
    CHECK_GRADIENTS(checkGradients(g, where(rowCond, a, b), {a, b}, feeds));
  }
}

TEST_CASE("where rejects shapes that do not broadcast") {
  Graph g;
  Output cond = g.placeholder("cond", f32, {4}), a = g.placeholder("a", f32, {2, 3}), b = g.placeholder("b", f32, {3});
  const std::string msg = errorOf([&] { where(cond, a, b); });
  CHECK_MESSAGE(contains(msg, "Where"), msg);
  CHECK_MESSAGE(contains(msg, "[4]"), msg);
}

// ---- cast ----------------------------------------------------------------------------------

TEST_CASE("cast converts between dtypes, truncating toward zero for integers") {
  const std::vector<double> values{2.7, -2.7, 0.0, 1e3, -0.5, 7.0};
  for (DType from : {f32, f64, i32, i64}) {
    for (DType to : {f32, f64, i32, i64}) {
      CAPTURE(std::string(dtypeName(from)));
      CAPTURE(std::string(dtypeName(to)));
      Graph g;
      Output x = g.placeholder("x", from, {2, 3});
      Output y = cast(x, to);
      CHECK(y.dtype() == to);
      CHECK(y.shape() == Shape{2, 3});
      if (from == to) CHECK(y == x);
      const Tensor tx = Tensor::fromVector<double>(values, {2, 3}).cast(from);
      std::vector<double> expected;
      for (double v : tx.toDoubles()) expected.push_back(isInteger(to) ? std::trunc(v) : v);
      CHECK_CLOSE(evaluate(g, y, {{x, tx}}), expected, toleranceFor(f32));
    }
  }
}

TEST_CASE("cast to integers saturates out-of-range values and turns NaN into 0, as the GPU does") {
  const std::vector<float> values{NAN, 3e9f, -3e9f, 1e30f, -INFINITY, -2.7f};
  const int32_t max32 = std::numeric_limits<int32_t>::max(), min32 = std::numeric_limits<int32_t>::min();
  for (DType from : {f32, f64, bf16, f16}) {
    CAPTURE(std::string(dtypeName(from)));
    Graph g;
    const Output x = g.placeholder("x", from, {6});
    const Tensor tx = Tensor::fromVector<float>(values, {6}).cast(from);
    const std::vector<Tensor> out = Session(g).run({cast(x, i32), cast(x, i64)}, {{x, tx}});
    CHECK(out[0].toVector<int32_t>() == std::vector<int32_t>{0, max32, min32, max32, min32, -2});
    const std::vector<int64_t> wide = out[1].toVector<int64_t>();
    CHECK(wide[0] == 0);
    if (from == f32 || from == f64) CHECK(wide[1] == 3000000000);  // 16-bit types round or overflow 3e9
    CHECK(wide[3] == std::numeric_limits<int64_t>::max());
    CHECK(wide[4] == std::numeric_limits<int64_t>::min());
    CHECK(wide[5] == -2);
  }
}

TEST_CASE("cast between floating types passes the gradient; through integers it stops") {
  Graph g;
  Output x = g.placeholder("x", f64, {2, 3});
  const FeedMap feeds{{x, randomTensor(f64, {2, 3}, 24)}};
  // The f32 round trip is linear up to rounding, so a large step keeps the difference accurate.
  GradCheckOptions options;
  options.epsilon = 1e-2;
  options.tolerance = 1e-4;
  CHECK_GRADIENTS(checkGradients(g, cast(cast(x, f32), f64) * x, {x}, feeds, options));
  const std::vector<Grad> grads = gradients(sum(cast(cast(x, i32), f64)), {x});
  CHECK_FALSE(grads[0].valid());
}

// ---- addN, identity, stopGradient, zerosLike, onesLike -------------------------------------

TEST_CASE("addN sums same-shaped tensors") {
  FOR_EACH_FLOAT_DTYPE(dt)
  for (const Shape& shape : {Shape{2, 3}, Shape{}, Shape{0, 2}, Shape{41, 7}}) {
    CAPTURE(shape.str());
    Graph g;
    std::vector<Output> xs;
    FeedMap feeds;
    for (int i = 0; i < 4; ++i) {
      xs.push_back(g.placeholder(fmt::format("x{}", i), dt, shape));
      feeds.push_back({xs.back(), randomTensor(dt, shape, 30 + static_cast<uint64_t>(i))});
    }
    std::vector<double> expected(static_cast<size_t>(shape.numel()), 0.0);
    for (const auto& [x, t] : feeds) {
      for (int64_t i = 0; i < t.numel(); ++i) expected[static_cast<size_t>(i)] += t.at(i);
    }
    const Tensor out = evaluate(g, addN(xs), feeds, 4);
    CHECK(out.shape() == shape);
    CHECK_CLOSE(out, expected, toleranceFor(dt));
  }
}

TEST_CASE("addN of one tensor is that tensor; of none an error") {
  Graph g;
  Output x = g.placeholder("x", f32, {2});
  CHECK(addN({x}) == x);
  CHECK_THROWS_AS(addN({}), weft::Error);
}

TEST_CASE("addN gradient reaches every input") {
  Graph g;
  Output a = g.placeholder("a", f64, {2, 3}), b = g.placeholder("b", f64, {2, 3}), c = g.placeholder("c", f64, {2, 3});
  const FeedMap feeds{
      {a, randomTensor(f64, {2, 3}, 40)}, {b, randomTensor(f64, {2, 3}, 41)}, {c, randomTensor(f64, {2, 3}, 42)}};
  CHECK_GRADIENTS(checkGradients(g, addN({a, b * a, c}), {a, b, c}, feeds));
}

TEST_CASE("addN rejects shape and dtype mismatches") {
  Graph g;
  Output a = g.placeholder("a", f32, {2, 3}), b = g.placeholder("b", f32, {3, 2}), c = g.placeholder("c", f64, {2, 3});
  std::string msg = errorOf([&] { addN({a, b}); });
  CHECK_MESSAGE(contains(msg, "AddN"), msg);
  CHECK_MESSAGE(contains(msg, "[3, 2]"), msg);
  msg = errorOf([&] { addN({a, c}); });
  CHECK_MESSAGE(contains(msg, "AddN"), msg);
}

TEST_CASE("identity copies its input and passes the gradient") {
  FOR_EACH_FLOAT_DTYPE(dt)
  Graph g;
  Output x = g.placeholder("x", dt, {2, 3});
  const Tensor tx = randomTensor(dt, {2, 3}, 43);
  CHECK_CLOSE(evaluate(g, identity(x), {{x, tx}}), tx.toDoubles(), 0.0);

  Graph h;
  Output z = h.placeholder("z", f64, {2, 3});
  CHECK_GRADIENTS(checkGradients(h, identity(z) * z, {z}, {{z, randomTensor(f64, {2, 3}, 44)}}));
}

TEST_CASE("stopGradient is the identity forward with a zero gradient") {
  FOR_EACH_FLOAT_DTYPE(dt)
  Graph g;
  Output x = g.placeholder("x", dt, {2, 3});
  const Tensor tx = randomTensor(dt, {2, 3}, 45);
  CHECK_CLOSE(evaluate(g, stopGradient(x), {{x, tx}}), tx.toDoubles(), 0.0);

  // d/dx sum(stop(x)) = 0, so no gradient reaches x.
  CHECK_FALSE(gradients(sum(stopGradient(x)), {x})[0].valid());
  // d/dx sum(stop(x) * x) = stop(x) = x, not 2x.
  const std::vector<Grad> grads = gradients(sum(stopGradient(x) * x), {x});
  REQUIRE(grads[0].valid());
  CHECK_CLOSE(evaluate(g, toDense(grads[0]), {{x, tx}}), tx.toDoubles(), toleranceFor(dt));
}

TEST_CASE("zerosLike and onesLike fill the input's shape and dtype") {
  for (DType dt : {f32, f64, i32, i64}) {
    for (const Shape& shape : {Shape{2, 3}, Shape{}, Shape{0, 4}}) {
      CAPTURE(std::string(dtypeName(dt)));
      CAPTURE(shape.str());
      Graph g;
      Output x = g.placeholder("x", dt, shape);
      const Tensor tx = Tensor::full(dt, shape, 7);
      const Tensor zeros = evaluate(g, zerosLike(x), {{x, tx}});
      const Tensor ones = evaluate(g, onesLike(x), {{x, tx}});
      CHECK(zeros.dtype() == dt);
      CHECK(ones.dtype() == dt);
      CHECK(zeros.shape() == shape);
      CHECK(ones.shape() == shape);
      CHECK(zeros.toDoubles() == std::vector<double>(static_cast<size_t>(shape.numel()), 0.0));
      CHECK(ones.toDoubles() == std::vector<double>(static_cast<size_t>(shape.numel()), 1.0));
    }
  }
}

TEST_CASE("zerosLike takes an unknown dimension from the feed") {
  Graph g;
  Output x = g.placeholder("x", f32, {-1, 3});
  Output z = zerosLike(x);
  CHECK(z.shape() == Shape{-1, 3});
  CHECK(evaluate(g, z, {{x, randomTensor(f32, {5, 3}, 46)}}).shape() == Shape{5, 3});
  CHECK(evaluate(g, onesLike(x), {{x, randomTensor(f32, {2, 3}, 47)}}).shape() == Shape{2, 3});
}

TEST_CASE("zerosLike and onesLike have no gradient") {
  Graph g;
  Output x = g.placeholder("x", f64, {2});
  CHECK_FALSE(gradients(sum(zerosLike(x) + onesLike(x)), {x})[0].valid());
}

// ---- reduceToLike and broadcastLike --------------------------------------------------------

TEST_CASE("reduceToLike sums over the broadcast axes") {
  FOR_EACH_FLOAT_DTYPE(dt)
  for (const auto& [sx, sl] : std::vector<std::pair<Shape, Shape>>{
           {{2, 3, 4}, {3, 1}}, {{2, 3, 4}, {4}}, {{2, 3, 4}, {1, 3, 4}}, {{2, 3}, {}}, {{2, 3}, {2, 1}},
           {{2, 3}, {1, 1}}, {{0, 3}, {3}}, {{2, 3}, {2, 3}}}) {
    CAPTURE(sx.str());
    CAPTURE(sl.str());
    Graph g;
    Output x = g.placeholder("x", dt, sx), like = g.placeholder("like", dt, sl);
    Output y = reduceToLike(x, like);
    CHECK(y.shape() == sl);
    const Tensor tx = randomTensor(dt, sx, 48);
    std::vector<double> expected(static_cast<size_t>(sl.numel()), 0.0);
    for (int64_t i = 0; i < sx.numel(); ++i) expected[static_cast<size_t>(broadcastIndex(sx, sl, i))] += tx.at(i);
    const Tensor out = evaluate(g, y, {{x, tx}, {like, Tensor::zeros(dt, sl)}});
    CHECK(out.shape() == sl);
    CHECK_CLOSE(out, expected, toleranceFor(dt));
  }
}

TEST_CASE("broadcastLike repeats over the broadcast axes") {
  FOR_EACH_FLOAT_DTYPE(dt)
  for (const auto& [sx, sl] : std::vector<std::pair<Shape, Shape>>{
           {{3, 1}, {2, 3, 4}}, {{4}, {2, 3, 4}}, {{}, {2, 3}}, {{2, 1}, {2, 3}}, {{3}, {0, 3}}, {{1, 37}, {23, 37}}}) {
    CAPTURE(sx.str());
    CAPTURE(sl.str());
    Graph g;
    Output x = g.placeholder("x", dt, sx), like = g.placeholder("like", dt, sl);
    Output y = broadcastLike(x, like);
    CHECK(y.shape() == sl);
    const Tensor tx = randomTensor(dt, sx, 49);
    std::vector<double> expected;
    for (int64_t i = 0; i < sl.numel(); ++i) expected.push_back(tx.at(broadcastIndex(sl, sx, i)));
    const Tensor out = evaluate(g, y, {{x, tx}, {like, Tensor::zeros(dt, sl)}}, 4);
    CHECK(out.shape() == sl);
    CHECK_CLOSE(out, expected, 0.0);
  }
}

TEST_CASE("reduceToLike and broadcastLike gradients match finite differences") {
  Graph g;
  Output x = g.placeholder("x", f64, {2, 3, 2}), like = g.placeholder("like", f64, {3, 1});
  Output small = g.placeholder("small", f64, {3, 1}), big = g.placeholder("big", f64, {2, 3, 2});
  const FeedMap feeds{{x, randomTensor(f64, {2, 3, 2}, 50)},
                      {like, Tensor::zeros(f64, {3, 1})},
                      {small, randomTensor(f64, {3, 1}, 51)},
                      {big, Tensor::zeros(f64, {2, 3, 2})}};
  CHECK_GRADIENTS(checkGradients(g, reduceToLike(x, like), {x}, feeds));
  CHECK_GRADIENTS(checkGradients(g, broadcastLike(small, big), {small}, feeds));
}

TEST_CASE("reduceToLike and broadcastLike reject unrelated shapes") {
  Graph g;
  Output a = g.placeholder("a", f32, {2, 3}), b = g.placeholder("b", f32, {4});
  std::string msg = errorOf([&] { reduceToLike(a, b); });
  CHECK_MESSAGE(contains(msg, "ReduceToLike"), msg);
  CHECK_MESSAGE(contains(msg, "[2, 3]"), msg);
  msg = errorOf([&] { broadcastLike(a, b); });
  CHECK_MESSAGE(contains(msg, "BroadcastLike"), msg);
  CHECK_MESSAGE(contains(msg, "[4]"), msg);
}

// ---- checkNumerics -------------------------------------------------------------------------

TEST_CASE("checkNumerics passes finite values through") {
  FOR_EACH_FLOAT_DTYPE(dt)
  Graph g;
  Output x = g.placeholder("x", dt, {2, 3});
  const Tensor tx = randomTensor(dt, {2, 3}, 52);
  CHECK_CLOSE(evaluate(g, checkNumerics(x, "activations"), {{x, tx}}), tx.toDoubles(), 0.0);
}

TEST_CASE("checkNumerics fails with its message on NaN or Inf") {
  FOR_EACH_FLOAT_DTYPE(dt)
  for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
    CAPTURE(bad);
    Graph g;
    Output x = g.placeholder("x", dt, {3});
    const Tensor tx = Tensor::fromVector<double>({1.0, bad, 2.0}, {3}).cast(dt);
    const std::string msg = errorOf([&] { evaluate(g, checkNumerics(x, "loss went bad"), {{x, tx}}); });
    CHECK_MESSAGE(contains(msg, "loss went bad"), msg);
    CHECK_MESSAGE(contains(msg, "CheckNumerics"), msg);
  }
}

TEST_CASE("checkNumerics passes the gradient") {
  Graph g;
  Output x = g.placeholder("x", f64, {2, 3});
  CHECK_GRADIENTS(checkGradients(g, checkNumerics(x * x, "m"), {x}, {{x, randomTensor(f64, {2, 3}, 53)}}));
}

TEST_CASE("the reference comparison flags NaN where a number is due and accepts equal infinities") {
  const double inf = INFINITY, nan = std::nan("");
  const Tensor t = Tensor::fromVector<double>({1, nan, inf}, {3});
  CHECK(contains(testing::compare(t, {1, 2, inf}, 1e-6), "element 1"));
  CHECK(contains(testing::compare(t, {1, nan, -inf}, 1e-6), "element 2"));
  CHECK(testing::compare(t, {1, nan, inf}, 0.0).empty());
  CHECK(contains(testing::compare(Tensor::fromVector<double>({nan, 5}, {2}), {1, 9}, 1e-6), "element 0"));
}
