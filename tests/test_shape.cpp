// Tests of the layout ops (ops/Shape.cpp): reshape, expandDims, squeeze, transpose, concat, split,
// slice, pad and reverseSequence against naive index-arithmetic references, finite-difference
// gradients, and shape and data errors.
#include "ops/Ops.h"
#include "tests/TestUtil.h"

#include <algorithm>
#include <string>
#include <vector>

using namespace weft;
using weft::testing::evaluate;
using weft::testing::randomTensor;
using weft::testing::toleranceFor;

namespace {

std::string str(const std::vector<int64_t>& v) { return Shape(v).str(); }

/// Row-major coordinates of flat index i in shape s.
std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> c(static_cast<size_t>(s.rank()));
  for (int d = s.rank() - 1; d >= 0; --d) {
    c[static_cast<size_t>(d)] = i % s[d];
    i /= s[d];
  }
  return c;
}

int64_t ravel(const std::vector<int64_t>& c, const Shape& s) {
  int64_t i = 0;
  for (int d = 0; d < s.rank(); ++d) i = i * s[d] + c[static_cast<size_t>(d)];
  return i;
}

/// A reference of output shape `out` whose element at coordinates c is f(c).
template <class F>
std::vector<double> byCoords(const Shape& out, F f) {
  std::vector<double> r;
  for (int64_t i = 0; i < out.numel(); ++i) r.push_back(f(unravel(i, out)));
  return r;
}

}  // namespace

// ---- reshape, expandDims, squeeze ----------------------------------------------------------

TEST_CASE("reshape keeps the elements in order and infers one -1 dimension") {
  FOR_EACH_FLOAT_DTYPE(dt)
  struct Case {
    Shape in;
    std::vector<int64_t> target;
    Shape out;
  };
  for (const Case& c :
       {Case{{2, 3, 4}, {6, 4}, {6, 4}}, Case{{2, 3, 4}, {-1, 4}, {6, 4}}, Case{{2, 3, 4}, {4, -1}, {4, 6}},
        Case{{2, 3, 4}, {-1}, {24}}, Case{{2, 3, 4}, {2, -1, 3}, {2, 4, 3}}, Case{{1}, {}, {}},
        Case{{}, {1, 1}, {1, 1}}, Case{{}, {-1}, {1}}, Case{{0, 3}, {-1, 3}, {0, 3}}, Case{{0, 3}, {3, 0}, {3, 0}},
        Case{{6}, {1, 6, 1}, {1, 6, 1}}}) {
    CAPTURE(c.in.str());
    CAPTURE(str(c.target));
    Graph g;
    Output x = g.placeholder("x", dt, c.in);
    Output y = reshape(x, c.target);
    CHECK(y.shape() == c.out);
    const Tensor tx = randomTensor(dt, c.in, 1);
    const Tensor out = evaluate(g, y, {{x, tx}});
    CHECK(out.shape() == c.out);
    CHECK_CLOSE(out, tx.toDoubles(), 0.0);
  }
}

TEST_CASE("a reshape whose input lives on copies every element, in blocks across threads") {
  // 300,007 floats: eighteen 64 KB blocks and a partial one. The input's second reader keeps the
  // reshape from taking over its buffer, so the kernel copies.
  Graph g;
  const Tensor tx = randomTensor(f32, {300007}, 3);
  const Output x = g.placeholder("x", f32, {300007});
  const Output y = reshape(x, {-1, 1});
  const Output alsoX = -x;
  Session s(g, SessionOptions{.threads = 2});
  const auto out = s.run({y, alsoX}, {{x, tx}});
  CHECK(out[0].shape() == Shape{300007, 1});
  CHECK(out[0].toDoubles() == tx.toDoubles());
}

TEST_CASE("reshape of an input with an unknown dimension") {
  Graph g;
  Output x = g.placeholder("x", f32, {-1, 4});
  Output y = reshape(x, {-1, 2});
  CHECK(y.shape() == Shape{-1, 2});
  const Tensor tx = randomTensor(f32, {3, 4}, 2);
  const Tensor out = evaluate(g, y, {{x, tx}});
  CHECK(out.shape() == Shape{6, 2});
  CHECK_CLOSE(out, tx.toDoubles(), 0.0);
}

TEST_CASE("reshape, expandDims and squeeze gradients match finite differences") {
  Graph g;
  Output x = g.placeholder("x", f64, {2, 3}), u = g.placeholder("u", f64, {1, 3, 1});
  const FeedMap feeds{{x, randomTensor(f64, {2, 3}, 3)}, {u, randomTensor(f64, {1, 3, 1}, 4)}};
  CHECK_GRADIENTS(checkGradients(g, reshape(x, {3, -1}), {x}, feeds));
  CHECK_GRADIENTS(checkGradients(g, reshape(x, {6}) * reshape(x, {6}), {x}, feeds));
  CHECK_GRADIENTS(checkGradients(g, expandDims(x, 1), {x}, feeds));
  CHECK_GRADIENTS(checkGradients(g, expandDims(x, -1), {x}, feeds));
  CHECK_GRADIENTS(checkGradients(g, squeeze(u, {0, 2}), {u}, feeds));
  CHECK_GRADIENTS(checkGradients(g, squeeze(u, {-1}), {u}, feeds));
}

TEST_CASE("reshape gradient takes an unknown dimension from the run-time input") {
  Graph g;
  Output x = g.placeholder("x", f64, {-1, 4});
  CHECK_GRADIENTS(checkGradients(g, reshape(x, {-1, 2}), {x}, {{x, randomTensor(f64, {3, 4}, 5)}}));
}

TEST_CASE("reshape rejects an incompatible element count and bad targets") {
  Graph g;
  Output x = g.placeholder("x", f32, {2, 3});
  std::string msg = errorOf([&] { reshape(x, {4}); });
  CHECK_MESSAGE(contains(msg, "Reshape"), msg);
  CHECK_MESSAGE(contains(msg, "6"), msg);
  CHECK_MESSAGE(contains(msg, "[4]"), msg);
  msg = errorOf([&] { reshape(x, {4, -1}); });
  CHECK_MESSAGE(contains(msg, "Reshape"), msg);
  msg = errorOf([&] { reshape(x, {-1, -1}); });
  CHECK_MESSAGE(contains(msg, "Reshape"), msg);
  msg = errorOf([&] { reshape(x, {-2, -3}); });
  CHECK_MESSAGE(contains(msg, "Reshape"), msg);
}

TEST_CASE("expandDims inserts a size-1 axis at any position") {
  FOR_EACH_FLOAT_DTYPE(dt)
  struct Case {
    Shape in;
    int64_t axis;
    Shape out;
  };
  for (const Case& c :
       {Case{{2, 3}, 0, {1, 2, 3}}, Case{{2, 3}, 1, {2, 1, 3}}, Case{{2, 3}, 2, {2, 3, 1}}, Case{{2, 3}, -1, {2, 3, 1}},
        Case{{2, 3}, -3, {1, 2, 3}}, Case{{}, 0, {1}}, Case{{0}, 0, {1, 0}}}) {
    CAPTURE(c.in.str());
    CAPTURE(c.axis);
    Graph g;
    Output x = g.placeholder("x", dt, c.in);
    Output y = expandDims(x, c.axis);
    CHECK(y.shape() == c.out);
    const Tensor tx = randomTensor(dt, c.in, 6);
    const Tensor out = evaluate(g, y, {{x, tx}});
    CHECK(out.shape() == c.out);
    CHECK_CLOSE(out, tx.toDoubles(), 0.0);
  }
}

TEST_CASE("squeeze removes the named size-1 axes") {
  FOR_EACH_FLOAT_DTYPE(dt)
  struct Case {
    Shape in;
    std::vector<int64_t> axes;
    Shape out;
  };
  for (const Case& c : {Case{{1, 2, 1, 3}, {0}, {2, 1, 3}}, Case{{1, 2, 1, 3}, {2}, {1, 2, 3}},
                        Case{{1, 2, 1, 3}, {0, 2}, {2, 3}}, Case{{1, 2, 1, 3}, {-2}, {1, 2, 3}},
                        Case{{1, 1}, {0, 1}, {}}, Case{{1, 0}, {0}, {0}}}) {
    CAPTURE(c.in.str());
    CAPTURE(str(c.axes));
    Graph g;
    Output x = g.placeholder("x", dt, c.in);
    Output y = squeeze(x, c.axes);
    CHECK(y.shape() == c.out);
    const Tensor tx = randomTensor(dt, c.in, 7);
    const Tensor out = evaluate(g, y, {{x, tx}});
    CHECK(out.shape() == c.out);
    CHECK_CLOSE(out, tx.toDoubles(), 0.0);
  }
}

TEST_CASE("expandDims and squeeze reject bad axes") {
  Graph g;
  Output x = g.placeholder("x", f32, {2, 1});
  std::string msg = errorOf([&] { expandDims(x, 3); });
  CHECK_MESSAGE(contains(msg, "ExpandDims"), msg);
  msg = errorOf([&] { expandDims(x, -4); });
  CHECK_MESSAGE(contains(msg, "ExpandDims"), msg);
  msg = errorOf([&] { squeeze(x, {0}); });
  CHECK_MESSAGE(contains(msg, "Squeeze"), msg);
  CHECK_MESSAGE(contains(msg, "size 2"), msg);
  msg = errorOf([&] { squeeze(x, {2}); });
  CHECK_MESSAGE(contains(msg, "Squeeze"), msg);
}

// ---- transpose -----------------------------------------------------------------------------

TEST_CASE("transpose permutes axes") {
  FOR_EACH_FLOAT_DTYPE(dt)
  struct Case {
    Shape in;
    std::vector<int64_t> perm;
  };
  std::vector<Case> cases;
  std::vector<int64_t> perm3{0, 1, 2};
  do cases.push_back({{2, 3, 4}, perm3});
  while (std::next_permutation(perm3.begin(), perm3.end()));
  for (const Case& c : {Case{{3, 5}, {1, 0}}, Case{{3, 5}, {0, 1}}, Case{{4}, {0}}, Case{{}, {}},
                        Case{{2, 3, 1, 2}, {3, 1, 0, 2}}, Case{{2, 1, 3, 2}, {2, 0, 3, 1}}, Case{{0, 3}, {1, 0}},
                        Case{{1, 4}, {1, 0}}, Case{{33, 47}, {1, 0}}, Case{{5, 31, 7}, {2, 0, 1}}}) {
    cases.push_back(c);
  }
  for (const Case& c : cases) {
    CAPTURE(c.in.str());
    CAPTURE(str(c.perm));
    Graph g;
    Output x = g.placeholder("x", dt, c.in);
    Output y = transpose(x, c.perm);
    std::vector<int64_t> outDims;
    for (int64_t p : c.perm) outDims.push_back(c.in[static_cast<int>(p)]);
    const Shape outShape(outDims);
    CHECK(y.shape() == outShape);
    const Tensor tx = randomTensor(dt, c.in, 8);
    const Tensor out = evaluate(g, y, {{x, tx}}, 4);
    CHECK(out.shape() == outShape);
    // out[c] = x[c'] with c'[perm[i]] = c[i]
    CHECK_CLOSE(out, byCoords(outShape, [&](const std::vector<int64_t>& oc) {
                  std::vector<int64_t> ic(oc.size());
                  for (size_t i = 0; i < oc.size(); ++i) ic[static_cast<size_t>(c.perm[i])] = oc[i];
                  return tx.at(ravel(ic, c.in));
                }),
                0.0);
  }
}

TEST_CASE("transpose gradients match finite differences") {
  Graph g;
  Output x = g.placeholder("x", f64, {2, 3, 2});
  const FeedMap feeds{{x, randomTensor(f64, {2, 3, 2}, 9)}};
  for (const std::vector<int64_t>& perm : {std::vector<int64_t>{2, 0, 1}, std::vector<int64_t>{1, 2, 0},
                                           std::vector<int64_t>{0, 2, 1}}) {
    CAPTURE(str(perm));
    CHECK_GRADIENTS(checkGradients(g, transpose(x, perm), {x}, feeds));
  }
}

TEST_CASE("transpose rejects invalid permutations") {
  Graph g;
  Output x = g.placeholder("x", f32, {2, 3, 4});
  for (const std::vector<int64_t>& perm : {std::vector<int64_t>{0, 1}, std::vector<int64_t>{0, 0, 1},
                                           std::vector<int64_t>{0, 1, 3}}) {
    CAPTURE(str(perm));
    const std::string msg = errorOf([&] { transpose(x, perm); });
    CHECK_MESSAGE(contains(msg, "Transpose"), msg);
  }
}

// ---- concat and split ----------------------------------------------------------------------

TEST_CASE("concat joins tensors along an axis") {
  FOR_EACH_FLOAT_DTYPE(dt)
  struct Case {
    std::vector<Shape> ins;
    int64_t axis;
  };
  for (const Case& c : {Case{{{1, 3, 2}, {2, 3, 2}, {3, 3, 2}}, 0}, Case{{{2, 1, 2}, {2, 3, 2}, {2, 2, 2}}, 1},
                        Case{{{2, 3, 1}, {2, 3, 3}}, 2}, Case{{{2, 3, 1}, {2, 3, 3}}, -1}, Case{{{4}, {0}, {2}}, 0},
                        Case{{{2, 0}, {2, 3}, {2, 1}}, 1}, Case{{{0, 2}, {0, 2}}, 0}, Case{{{20, 30}, {20, 17}}, 1}}) {
    CAPTURE(c.ins.size());
    CAPTURE(c.ins[0].str());
    CAPTURE(c.axis);
    Graph g;
    std::vector<Output> xs;
    std::vector<Tensor> ts;
    FeedMap feeds;
    for (size_t i = 0; i < c.ins.size(); ++i) {
      xs.push_back(g.placeholder(fmt::format("x{}", i), dt, c.ins[i]));
      ts.push_back(randomTensor(dt, c.ins[i], 10 + i));
      feeds.push_back({xs.back(), ts.back()});
    }
    const int axis = static_cast<int>(c.axis < 0 ? c.axis + c.ins[0].rank() : c.axis);
    Shape outShape = c.ins[0];
    outShape[axis] = 0;
    for (const Shape& s : c.ins) outShape[axis] += s[axis];
    Output y = concat(xs, c.axis);
    CHECK(y.shape() == outShape);
    const Tensor out = evaluate(g, y, feeds, 4);
    CHECK(out.shape() == outShape);
    CHECK_CLOSE(out, byCoords(outShape, [&](std::vector<int64_t> oc) {
                  size_t piece = 0;
                  while (oc[static_cast<size_t>(axis)] >= c.ins[piece][axis])
                    oc[static_cast<size_t>(axis)] -= c.ins[piece++][axis];
                  return ts[piece].at(ravel(oc, c.ins[piece]));
                }),
                0.0);
  }
}

TEST_CASE("concat of one tensor is that tensor; of none an error") {
  Graph g;
  Output x = g.placeholder("x", f32, {2});
  CHECK(concat({x}, 0) == x);
  CHECK_THROWS_AS(concat({}, 0), weft::Error);
}

TEST_CASE("concat with unknown dimensions") {
  Graph g;
  Output a = g.placeholder("a", f32, {-1, 3}), b = g.placeholder("b", f32, {2, 3}),
         c = g.placeholder("c", f32, {-1, 2});
  CHECK(concat({a, b}, 0).shape() == Shape{-1, 3});
  CHECK(concat({a, c}, 1).shape() == Shape{-1, 5});
  CHECK(concat({a, b}, 1).shape() == Shape{2, 6});
  const Tensor ta = randomTensor(f32, {4, 3}, 13), tc = randomTensor(f32, {4, 2}, 14);
  const Tensor out = evaluate(g, concat({a, c}, 1), {{a, ta}, {c, tc}});
  CHECK(out.shape() == Shape{4, 5});
  CHECK(out.at(5 + 3) == tc.at(2));
}

TEST_CASE("concat gradients match finite differences") {
  Graph g;
  Output a = g.placeholder("a", f64, {2, 1, 2}), b = g.placeholder("b", f64, {2, 3, 2}),
         e = g.placeholder("e", f64, {2, 0, 2});
  const FeedMap feeds{
      {a, randomTensor(f64, {2, 1, 2}, 15)}, {b, randomTensor(f64, {2, 3, 2}, 16)}, {e, Tensor::zeros(f64, {2, 0, 2})}};
  CHECK_GRADIENTS(checkGradients(g, concat({a, b, e, a}, 1), {a, b}, feeds));
  CHECK_GRADIENTS(checkGradients(g, concat({b, b}, 0), {b}, feeds));
  CHECK_GRADIENTS(checkGradients(g, concat({b, a}, -2), {a, b}, feeds));
  CHECK_GRADIENTS(checkGradients(g, concat({b, a * b}, -1), {a, b}, feeds));
}

TEST_CASE("concat rejects mismatched ranks, dimensions, dtypes and axes") {
  Graph g;
  Output a = g.placeholder("a", f32, {2, 3}), r3 = g.placeholder("r3", f32, {2, 3, 1}),
         b = g.placeholder("b", f32, {4, 2});
  Output d = g.placeholder("d", f64, {2, 3}), s = g.placeholder("s", f32, {});
  std::string msg = errorOf([&] { concat({a, r3}, 0); });
  CHECK_MESSAGE(contains(msg, "Concat"), msg);
  CHECK_MESSAGE(contains(msg, "rank"), msg);
  msg = errorOf([&] { concat({a, b}, 0); });
  CHECK_MESSAGE(contains(msg, "Concat"), msg);
  msg = errorOf([&] { concat({a, d}, 0); });
  CHECK_MESSAGE(contains(msg, "Concat"), msg);
  msg = errorOf([&] { concat({s, s}, 0); });
  CHECK_MESSAGE(contains(msg, "Concat"), msg);
  msg = errorOf([&] { concat({a, a}, 2); });
  CHECK_MESSAGE(contains(msg, "Concat"), msg);
}

TEST_CASE("split cuts an axis into pieces, one size may be -1") {
  FOR_EACH_FLOAT_DTYPE(dt)
  struct Case {
    Shape in;
    std::vector<int64_t> sizes;
    int64_t axis;
    std::vector<int64_t> resolved;
  };
  for (const Case& c :
       {Case{{2, 6, 3}, {1, -1, 2}, 1, {1, 3, 2}}, Case{{2, 6, 3}, {1, 2}, -1, {1, 2}},
        Case{{2, 6, 3}, {1, 1}, 0, {1, 1}}, Case{{2, 6, 3}, {0, 6}, 1, {0, 6}}, Case{{2, 6, 3}, {-1}, 1, {6}},
        Case{{5}, {2, -1, 3}, 0, {2, 0, 3}}, Case{{0, 4}, {3, 1}, 1, {3, 1}}}) {
    CAPTURE(c.in.str());
    CAPTURE(str(c.sizes));
    CAPTURE(c.axis);
    Graph g;
    Output x = g.placeholder("x", dt, c.in);
    const std::vector<Output> pieces = split(x, c.sizes, c.axis);
    REQUIRE(pieces.size() == c.resolved.size());
    const int axis = static_cast<int>(c.axis < 0 ? c.axis + c.in.rank() : c.axis);
    const Tensor tx = randomTensor(dt, c.in, 17);
    int64_t offset = 0;
    for (size_t p = 0; p < pieces.size(); ++p) {
      CAPTURE(p);
      Shape ps = c.in;
      ps[axis] = c.resolved[p];
      CHECK(pieces[p].shape() == ps);
      const Tensor out = evaluate(g, pieces[p], {{x, tx}});
      CHECK(out.shape() == ps);
      CHECK_CLOSE(out, byCoords(ps, [&](std::vector<int64_t> oc) {
                    oc[static_cast<size_t>(axis)] += offset;
                    return tx.at(ravel(oc, c.in));
                  }),
                  0.0);
      offset += c.resolved[p];
    }
  }
}

TEST_CASE("split gradients match finite differences, including unused pieces") {
  Graph g;
  Output x = g.placeholder("x", f64, {2, 5});
  const FeedMap feeds{{x, randomTensor(f64, {2, 5}, 18)}};
  const std::vector<Output> p = split(x, {2, -1, 1}, 1);
  CHECK_GRADIENTS(checkGradients(g, concat({p[2] * 2.0, p[0], p[1] * p[1]}, 1), {x}, feeds));
  CHECK_GRADIENTS(checkGradients(g, p[1], {x}, feeds));
}

TEST_CASE("split rejects sizes that do not fit the axis") {
  Graph g;
  Output x = g.placeholder("x", f32, {2, 6});
  std::string msg = errorOf([&] { split(x, {2, 3}, 1); });
  CHECK_MESSAGE(contains(msg, "Split"), msg);
  CHECK_MESSAGE(contains(msg, "6"), msg);
  msg = errorOf([&] { split(x, {-1, -1}, 1); });
  CHECK_MESSAGE(contains(msg, "Split"), msg);
  msg = errorOf([&] { split(x, {4, 3, -1}, 1); });
  CHECK_MESSAGE(contains(msg, "Split"), msg);
  msg = errorOf([&] { split(x, {1, 1}, 2); });
  CHECK_MESSAGE(contains(msg, "Split"), msg);
}

// ---- slice and pad -------------------------------------------------------------------------

TEST_CASE("slice takes a box, size -1 running to the end of the axis") {
  FOR_EACH_FLOAT_DTYPE(dt)
  struct Case {
    Shape in;
    std::vector<int64_t> begin, size;
    Shape out;
  };
  for (const Case& c :
       {Case{{3, 4, 5}, {1, 0, 2}, {2, -1, 3}, {2, 4, 3}}, Case{{3, 4, 5}, {0, 0, 0}, {-1, -1, -1}, {3, 4, 5}},
        Case{{3, 4, 5}, {2, 3, 4}, {1, 1, 1}, {1, 1, 1}}, Case{{3, 4, 5}, {3, 0, 0}, {0, -1, -1}, {0, 4, 5}},
        Case{{3, 4, 5}, {0, 1, 5}, {-1, 2, -1}, {3, 2, 0}}, Case{{6}, {2}, {3}, {3}}, Case{{}, {}, {}, {}},
        Case{{30, 40}, {3, 5}, {20, -1}, {20, 35}}}) {
    CAPTURE(c.in.str());
    CAPTURE(str(c.begin));
    CAPTURE(str(c.size));
    Graph g;
    Output x = g.placeholder("x", dt, c.in);
    Output y = slice(x, c.begin, c.size);
    CHECK(y.shape() == c.out);
    const Tensor tx = randomTensor(dt, c.in, 19);
    const Tensor out = evaluate(g, y, {{x, tx}}, 4);
    CHECK(out.shape() == c.out);
    CHECK_CLOSE(out, byCoords(c.out, [&](std::vector<int64_t> oc) {
                  for (size_t d = 0; d < oc.size(); ++d) oc[d] += c.begin[d];
                  return tx.at(ravel(oc, c.in));
                }),
                0.0);
  }
}

TEST_CASE("slice gradients match finite differences") {
  Graph g;
  Output x = g.placeholder("x", f64, {3, 4});
  const FeedMap feeds{{x, randomTensor(f64, {3, 4}, 20)}};
  CHECK_GRADIENTS(checkGradients(g, slice(x, {1, 1}, {-1, 2}), {x}, feeds));
  CHECK_GRADIENTS(checkGradients(g, slice(x, {0, 3}, {3, 1}) * slice(x, {0, 0}, {3, 1}), {x}, feeds));
}

TEST_CASE("slice rejects boxes outside the input") {
  Graph g;
  Output x = g.placeholder("x", f32, {3, 4});
  for (const auto& [begin, size] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{2, 0}, {2, 4}}, {{0, 2}, {1, 3}}, {{-1, 0}, {1, 1}}, {{0}, {1}}, {{0, 0}, {1, -2}}}) {
    CAPTURE(str(begin));
    CAPTURE(str(size));
    const std::string msg = errorOf([&] { slice(x, begin, size); });
    CHECK_MESSAGE(contains(msg, "Slice"), msg);
  }
}

TEST_CASE("slice rejects a begin past the end when the size is -1") {
  Graph g;
  Output x = g.placeholder("x", f32, {3, 4});
  const std::string msg = errorOf([&] { slice(x, {0, 5}, {1, -1}); });
  CHECK_MESSAGE(contains(msg, "Slice"), msg);
  CHECK_MESSAGE(contains(msg, "out of range"), msg);
}

TEST_CASE("pad surrounds the input with a constant") {
  FOR_EACH_FLOAT_DTYPE(dt)
  struct Case {
    Shape in;
    std::vector<int64_t> paddings;
    double value;
  };
  for (const Case& c : {Case{{2, 3}, {1, 0, 2, 1}, 0.0}, Case{{2, 3}, {0, 0, 0, 0}, 0.0},
                        Case{{2, 3}, {2, 1, 0, 3}, -1.5}, Case{{0, 2}, {1, 1, 0, 0}, 4.0}, Case{{3}, {0, 2}, 7.0},
                        Case{{2, 1, 2}, {0, 1, 1, 1, 1, 0}, 0.5}, Case{{}, {}, 3.0}}) {
    CAPTURE(c.in.str());
    CAPTURE(str(c.paddings));
    Graph g;
    Output x = g.placeholder("x", dt, c.in);
    Output y = pad(x, c.paddings, c.value);
    std::vector<int64_t> outDims;
    for (int d = 0; d < c.in.rank(); ++d) outDims.push_back(c.in[d] + c.paddings[2 * d] + c.paddings[2 * d + 1]);
    const Shape outShape(outDims);
    CHECK(y.shape() == outShape);
    const Tensor tx = randomTensor(dt, c.in, 21);
    const Tensor out = evaluate(g, y, {{x, tx}});
    CHECK(out.shape() == outShape);
    CHECK_CLOSE(out, byCoords(outShape, [&](std::vector<int64_t> oc) {
                  for (size_t d = 0; d < oc.size(); ++d) {
                    oc[d] -= c.paddings[2 * d];
                    if (oc[d] < 0 || oc[d] >= c.in[static_cast<int>(d)]) return c.value;
                  }
                  return tx.at(ravel(oc, c.in));
                }),
                toleranceFor(dt));
  }
}

TEST_CASE("pad gradients match finite differences") {
  Graph g;
  Output x = g.placeholder("x", f64, {2, 3});
  CHECK_GRADIENTS(checkGradients(g, pad(x, {1, 0, 2, 1}, 0.5), {x}, {{x, randomTensor(f64, {2, 3}, 22)}}));
}

TEST_CASE("pad rejects a wrong number of paddings and negative ones") {
  Graph g;
  Output x = g.placeholder("x", f32, {2, 3});
  std::string msg = errorOf([&] { pad(x, {1, 1}); });
  CHECK_MESSAGE(contains(msg, "Pad"), msg);
  msg = errorOf([&] { pad(x, {0, 0, -1, 0}); });
  CHECK_MESSAGE(contains(msg, "Pad"), msg);
}

TEST_CASE("layout op gradients with an unknown dimension use the run-time shape") {
  Graph g;
  Output x = g.placeholder("x", f64, {-1, 4});
  const FeedMap feeds{{x, randomTensor(f64, {3, 4}, 27)}};
  const std::vector<Output> pieces = split(x, {1, -1}, 1);
  const std::vector<std::pair<const char*, Output>> cases = {
      {"concat rows", concat({x, x * x}, 0)},
      {"concat columns", concat({x, x * x}, 1)},
      {"split", concat({pieces[1], pieces[0] * 3.0}, 1)},
      {"slice", slice(x, {1, 1}, {-1, 2})},
      {"pad", pad(x, {1, 0, 0, 2}, 1.0)},
      {"transpose", transpose(x, {1, 0})},
      {"expandDims/squeeze", squeeze(expandDims(x, 1) * 2.0, {1})},
  };
  for (const auto& [name, y] : cases) {
    CAPTURE(std::string(name));
    CHECK_GRADIENTS(checkGradients(g, y, {x}, feeds));
  }
}

TEST_CASE("shape ops move integer tensors too") {
  Graph g;
  Output x = g.constant(Tensor::fromVector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3}));
  CHECK(evaluate(g, transpose(x, {1, 0})).toDoubles() == std::vector<double>{1, 4, 2, 5, 3, 6});
  CHECK(evaluate(g, concat({x, x}, 0)).toDoubles() == std::vector<double>{1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6});
  CHECK(evaluate(g, slice(x, {1, 1}, {1, -1})).toDoubles() == std::vector<double>{5, 6});
  CHECK(evaluate(g, pad(x, {0, 0, 1, 0}, 9)).toDoubles() == std::vector<double>{9, 1, 2, 3, 9, 4, 5, 6});
  CHECK(evaluate(g, reshape(x, {3, 2})).dtype() == i32);
}

// ---- reverseSequence -----------------------------------------------------------------------

TEST_CASE("reverseSequence reverses each sequence's first lengths[b] steps") {
  FOR_EACH_FLOAT_DTYPE(dt)
  struct Case {
    Shape in;
    int64_t seqAxis, batchAxis;
    std::vector<int32_t> lengths;
  };
  for (DType lengthType : {i32, i64}) {
    for (const Case& c :
         {Case{{3, 4, 2}, 1, 0, {4, 2, 0}}, Case{{4, 3, 2}, 0, 1, {1, 4, 3}}, Case{{3, 5}, 1, 0, {5, 3, 1}},
          Case{{2, 2, 4}, 2, 0, {3, 4}}, Case{{2, 0, 2}, 1, 0, {0, 0}}}) {
      CAPTURE(std::string(dtypeName(lengthType)));
      CAPTURE(c.in.str());
      CAPTURE(c.seqAxis);
      Graph g;
      Output x = g.placeholder("x", dt, c.in);
      Output lengths = g.placeholder("lengths", lengthType, {static_cast<int64_t>(c.lengths.size())});
      Output y = reverseSequence(x, lengths, c.seqAxis, c.batchAxis);
      CHECK(y.shape() == c.in);
      const Tensor tx = randomTensor(dt, c.in, 23);
      const Tensor tl =
          Tensor::fromVector<int32_t>(c.lengths, {static_cast<int64_t>(c.lengths.size())}).cast(lengthType);
      const Tensor out = evaluate(g, y, {{x, tx}, {lengths, tl}}, 4);
      CHECK_CLOSE(out, byCoords(c.in, [&](std::vector<int64_t> oc) {
                    const auto s = static_cast<size_t>(c.seqAxis);
                    const int64_t len = c.lengths[static_cast<size_t>(oc[static_cast<size_t>(c.batchAxis)])];
                    if (oc[s] < len) oc[s] = len - 1 - oc[s];
                    return tx.at(ravel(oc, c.in));
                  }),
                  0.0);
    }
  }
}

TEST_CASE("reverseSequence gradient matches finite differences") {
  Graph g;
  Output x = g.placeholder("x", f64, {3, 4, 2});
  Output lengths = g.constant(Tensor::fromVector<int64_t>({4, 2, 0}, {3}));
  CHECK_GRADIENTS(checkGradients(g, reverseSequence(x, lengths, 1, 0), {x}, {{x, randomTensor(f64, {3, 4, 2}, 24)}}));
  Graph h;
  Output z = h.placeholder("z", f64, {4, 2, 1});
  Output zl = h.constant(Tensor::fromVector<int32_t>({3, 1}, {2}));
  CHECK_GRADIENTS(checkGradients(h, reverseSequence(z, zl, 0, 1), {z}, {{z, randomTensor(f64, {4, 2, 1}, 25)}}));
}

TEST_CASE("reverseSequence rejects bad axes and lengths") {
  Graph g;
  Output x = g.placeholder("x", f32, {3, 4});
  Output l3 = g.placeholder("l3", i32, {3}), l2 = g.placeholder("l2", i32, {2}), lf = g.placeholder("lf", f32, {3});
  std::string msg = errorOf([&] { reverseSequence(x, l3, 0, 0); });
  CHECK_MESSAGE(contains(msg, "ReverseSequence"), msg);
  msg = errorOf([&] { reverseSequence(x, l2, 1, 0); });
  CHECK_MESSAGE(contains(msg, "ReverseSequence"), msg);
  msg = errorOf([&] { reverseSequence(x, lf, 1, 0); });
  CHECK_MESSAGE(contains(msg, "ReverseSequence"), msg);
  msg = errorOf([&] { reverseSequence(x, l3, 2, 0); });
  CHECK_MESSAGE(contains(msg, "ReverseSequence"), msg);

  // A length beyond the sequence is a data error, reported at run time with its value.
  Output y = reverseSequence(x, l3, 1, 0);
  msg = errorOf([&] {
    evaluate(g, y, {{x, randomTensor(f32, {3, 4}, 26)}, {l3, Tensor::fromVector<int32_t>({1, 5, 2}, {3})}});
  });
  CHECK_MESSAGE(contains(msg, "ReverseSequence"), msg);
  CHECK_MESSAGE(contains(msg, "5"), msg);
  msg = errorOf([&] {
    evaluate(g, y, {{x, randomTensor(f32, {3, 4}, 26)}, {l3, Tensor::fromVector<int32_t>({1, -1, 2}, {3})}});
  });
  CHECK_MESSAGE(contains(msg, "-1"), msg);
}
