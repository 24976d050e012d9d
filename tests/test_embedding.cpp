// Tests of the row gathers and scatters (ops/Embedding.cpp): gather, scatterAdd and
// unsortedSegmentSum against naive references, duplicate ids, the sparse gradient of a gathered
// table, finite-difference gradients, and shape and id errors.
#include "autodiff/Gradients.h"
#include "ops/Ops.h"
#include "tests/TestUtil.h"

#include <functional>
#include <string>
#include <vector>

using namespace weft;
using weft::testing::evaluate;
using weft::testing::randomInts;
using weft::testing::randomTensor;
using weft::testing::toleranceFor;

namespace {

Tensor idTensor(const std::vector<int64_t>& ids, Shape shape, DType dtype) {
  return Tensor::fromVector<int64_t>(ids, std::move(shape)).cast(dtype);
}

/// Elements per row of a tensor whose first axis indexes rows.
int64_t rowWidth(const Shape& s) {
  int64_t n = 1;
  for (int d = 1; d < s.rank(); ++d) n *= s[d];
  return n;
}

/// out[i, ...] = params[ids[i], ...]
std::vector<double> gatherReference(const Tensor& params, const Tensor& ids) {
  const int64_t width = rowWidth(params.shape());
  std::vector<double> out;
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const auto row = static_cast<int64_t>(ids.at(i));
    for (int64_t j = 0; j < width; ++j) out.push_back(params.at(row * width + j));
  }
  return out;
}

/// base[ids[i], ...] += rows[i, ...]
std::vector<double> scatterReference(std::vector<double> base, const Tensor& ids, const Tensor& rows, int64_t width) {
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const auto row = static_cast<int64_t>(ids.at(i));
    for (int64_t j = 0; j < width; ++j) base[static_cast<size_t>(row * width + j)] += rows.at(i * width + j);
  }
  return base;
}

}  // namespace

// ---- gather --------------------------------------------------------------------------------

TEST_CASE("gather picks rows of params at ids of any rank") {
  FOR_EACH_FLOAT_DTYPE(dt)
  struct Case {
    Shape params, ids, out;
  };
  for (DType idType : {i32, i64}) {
    for (const Case& c : {Case{{5, 3}, {4}, {4, 3}}, Case{{5, 3}, {2, 3}, {2, 3, 3}}, Case{{5}, {4}, {4}},
                          Case{{4, 2, 3}, {2, 2}, {2, 2, 2, 3}}, Case{{5, 3}, {}, {3}}, Case{{5, 3}, {0}, {0, 3}},
                          Case{{5, 0}, {3}, {3, 0}}, Case{{1, 2}, {3}, {3, 2}}, Case{{50, 64}, {200}, {200, 64}}}) {
      CAPTURE(std::string(dtypeName(idType)));
      CAPTURE(c.params.str());
      CAPTURE(c.ids.str());
      Graph g;
      Output params = g.placeholder("params", dt, c.params), ids = g.placeholder("ids", idType, c.ids);
      Output y = gather(params, ids);
      CHECK(y.shape() == c.out);
      CHECK(y.dtype() == dt);
      const Tensor tp = randomTensor(dt, c.params, 1);
      // Few distinct ids relative to the count, so duplicates occur.
      const Tensor ti = randomInts(idType, c.ids, 0, c.params[0], 2);
      const Tensor out = evaluate(g, y, {{params, tp}, {ids, ti}}, 4);
      CHECK(out.shape() == c.out);
      CHECK_CLOSE(out, gatherReference(tp, ti), 0.0);
    }
  }
}

TEST_CASE("gather gradient matches finite differences, with duplicate ids") {
  for (const Shape& idShape : {Shape{5}, Shape{2, 3}}) {
    CAPTURE(idShape.str());
    Graph g;
    Output params = g.placeholder("params", f64, {4, 3});
    const std::vector<int64_t> idValues = idShape.rank() == 1 ? std::vector<int64_t>{2, 0, 2, 3, 2}
                                                              : std::vector<int64_t>{1, 1, 3, 0, 1, 3};
    Output ids = g.constant(idTensor(idValues, idShape, i32));
    CHECK_GRADIENTS(checkGradients(g, gather(params, ids), {params}, {{params, randomTensor(f64, {4, 3}, 3)}}));
  }
}

TEST_CASE("gather gradient for params of rank 1 and 3") {
  Graph g;
  Output vec = g.placeholder("vec", f64, {4}), cube = g.placeholder("cube", f64, {3, 2, 2});
  Output ids = g.constant(idTensor({2, 0, 2}, {3}, i64)), ids2 = g.constant(idTensor({1, 1, 0, 2}, {2, 2}, i32));
  const FeedMap feeds{{vec, randomTensor(f64, {4}, 31)}, {cube, randomTensor(f64, {3, 2, 2}, 32)}};
  CHECK_GRADIENTS(checkGradients(g, gather(vec, ids), {vec}, feeds));
  CHECK_GRADIENTS(checkGradients(g, gather(vec, ids2), {vec}, feeds));
  CHECK_GRADIENTS(checkGradients(g, gather(cube, ids2), {cube}, feeds));
}

TEST_CASE("gather gives a variable table a sparse gradient and records a sparse link") {
  FOR_EACH_FLOAT_DTYPE(dt)
  Graph g;
  const Tensor table0 = randomTensor(dt, {5, 3}, 4);
  Output table = g.variable("table", dt, {5, 3}, Initializer::fromTensor(table0));
  const Tensor idValues = idTensor({3, 1, 3, 0}, {2, 2}, i64);
  Output ids = g.constant(idValues);
  const Tensor weights = randomTensor(dt, {2, 2, 3}, 5);
  Output loss = sum(gather(table, ids) * g.constant(weights));

  const std::vector<Grad> grads = gradients(loss, {table});
  REQUIRE(grads.size() == 1);
  CHECK(grads[0].isSparse());
  CHECK(grads[0].denseShape == Shape{5, 3});

  const GradientLink* link = nullptr;
  for (const GradientLink& l : g.gradientLinks()) {
    if (l.variable == table.node()) link = &l;
  }
  REQUIRE(link != nullptr);
  CHECK(link->sparse);
  CHECK(link->indices.valid());
  CHECK(link->values.valid());
  CHECK(link->denseShape == Shape{5, 3});

  Session s(g, {1, false});
  const std::vector<Tensor> got = s.run({grads[0].indices, grads[0].values, toDense(grads[0])});
  // One index and one row of the output gradient (the weights) per gathered id.
  CHECK(got[0].toDoubles() == idValues.toDoubles());
  CHECK(got[1].shape() == Shape{4, 3});
  CHECK_CLOSE(got[1], weights.toDoubles(), toleranceFor(dt));
  const std::vector<double> dense = scatterReference(std::vector<double>(15, 0.0), idValues, weights, 3);
  CHECK_CLOSE(got[2], dense, toleranceFor(dt));
}

TEST_CASE("two gathers from one table keep its gradient sparse") {
  Graph g;
  const Tensor table0 = randomTensor(f64, {4, 2}, 6);
  Output table = g.variable("table", f64, {4, 2}, Initializer::fromTensor(table0));
  const Tensor ids1 = idTensor({0, 2}, {2}, i32), ids2 = idTensor({2, 3, 2}, {3}, i64);
  const Tensor w1 = randomTensor(f64, {2, 2}, 7), w2 = randomTensor(f64, {3, 2}, 8);
  Output loss = sum(gather(table, g.constant(ids1)) * g.constant(w1)) + sum(gather(table, g.constant(ids2)) * g.constant(w2));
  const std::vector<Grad> grads = gradients(loss, {table});
  CHECK(grads[0].isSparse());
  std::vector<double> dense = scatterReference(std::vector<double>(8, 0.0), ids1, w1, 2);
  dense = scatterReference(dense, ids2, w2, 2);
  Session s(g, {1, false});
  CHECK_CLOSE(s.run({toDense(grads[0])})[0], dense, 1e-12);
}

// A table whose row count is unknown until run time gets a dense gradient shaped like it.
TEST_CASE("gather gradient for params with an unknown first dimension") {
  Graph g;
  Output params = g.placeholder("params", f64, {-1, 3});
  Output ids = g.constant(idTensor({1, 0, 1}, {3}, i32));
  GradCheckReport report;
  CHECK_NOTHROW(report = checkGradients(g, gather(params, ids), {params}, {{params, randomTensor(f64, {2, 3}, 30)}}));
  CHECK_MESSAGE(report.ok, report.detail);
  CHECK_NOTHROW(gradients(sum(gather(tanh(params), ids)), {params}));
}

TEST_CASE("gather fails at run time on an id out of range, naming the id and its position") {
  for (DType idType : {i32, i64}) {
    CAPTURE(std::string(dtypeName(idType)));
    Graph g;
    Output params = g.placeholder("params", f32, {5, 3}), ids = g.placeholder("ids", idType, {3});
    Output y = gather(params, ids);
    const Tensor tp = randomTensor(f32, {5, 3}, 9);
    std::string msg = errorOf([&] { evaluate(g, y, {{params, tp}, {ids, idTensor({0, 7, 1}, {3}, idType)}}); });
    CHECK_MESSAGE(contains(msg, "Gather"), msg);
    CHECK_MESSAGE(contains(msg, "id 7"), msg);
    CHECK_MESSAGE(contains(msg, "position 1"), msg);
    CHECK_MESSAGE(contains(msg, "[0, 5)"), msg);
    msg = errorOf([&] { evaluate(g, y, {{params, tp}, {ids, idTensor({0, 1, -1}, {3}, idType)}}); });
    CHECK_MESSAGE(contains(msg, "id -1"), msg);
    msg = errorOf([&] { evaluate(g, y, {{params, tp}, {ids, idTensor({5, 1, 1}, {3}, idType)}}); });
    CHECK_MESSAGE(contains(msg, "id 5"), msg);
  }
}

TEST_CASE("gather rejects non-integer ids and scalar params") {
  Graph g;
  Output params = g.placeholder("params", f32, {5, 3}), fids = g.placeholder("fids", f32, {2});
  Output scalar = g.placeholder("scalar", f32, {}), ids = g.placeholder("ids", i32, {2});
  std::string msg = errorOf([&] { gather(params, fids); });
  CHECK_MESSAGE(contains(msg, "Gather"), msg);
  CHECK_MESSAGE(contains(msg, "f32"), msg);
  msg = errorOf([&] { gather(scalar, ids); });
  CHECK_MESSAGE(contains(msg, "Gather"), msg);
}

// ---- scatterAdd ----------------------------------------------------------------------------

TEST_CASE("scatterAdd adds update rows at ids, accumulating duplicates") {
  FOR_EACH_FLOAT_DTYPE(dt)
  struct Case {
    Shape x;
    std::vector<int64_t> ids;
  };
  for (DType idType : {i32, i64}) {
    for (const Case& c : {Case{{5, 3}, {1, 3, 1, 1}}, Case{{5}, {4, 0, 4}}, Case{{3, 2, 2}, {2, 2}}, Case{{5, 3}, {}},
                          Case{{1, 4}, {0, 0, 0}}}) {
      CAPTURE(std::string(dtypeName(idType)));
      CAPTURE(c.x.str());
      CAPTURE(c.ids.size());
      Graph g;
      const auto n = static_cast<int64_t>(c.ids.size());
      Shape us = c.x;
      us[0] = n;
      Output x = g.placeholder("x", dt, c.x), ids = g.placeholder("ids", idType, {n}), updates = g.placeholder("u", dt, us);
      Output y = scatterAdd(x, ids, updates);
      CHECK(y.shape() == c.x);
      const Tensor tx = randomTensor(dt, c.x, 10), tu = randomTensor(dt, us, 11), ti = idTensor(c.ids, {n}, idType);
      const Tensor out = evaluate(g, y, {{x, tx}, {ids, ti}, {updates, tu}});
      CHECK(out.shape() == c.x);
      CHECK_CLOSE(out, scatterReference(tx.toDoubles(), ti, tu, rowWidth(c.x)), toleranceFor(dt));
    }
  }
}

TEST_CASE("scatterAdd on many rows with several threads") {
  FOR_EACH_FLOAT_DTYPE(dt)
  Graph g;
  Output x = g.placeholder("x", dt, {20, 70}), ids = g.placeholder("ids", i64, {100}), updates = g.placeholder("u", dt, {100, 70});
  const Tensor tx = randomTensor(dt, {20, 70}, 12), tu = randomTensor(dt, {100, 70}, 13), ti = randomInts(i64, {100}, 0, 20, 14);
  const Tensor out = evaluate(g, scatterAdd(x, ids, updates), {{x, tx}, {ids, ti}, {updates, tu}}, 4);
  CHECK_CLOSE(out, scatterReference(tx.toDoubles(), ti, tu, 70), toleranceFor(dt));
}

TEST_CASE("scatterAdd gradients match finite differences, with duplicate ids") {
  Graph g;
  Output x = g.placeholder("x", f64, {4, 2}), updates = g.placeholder("u", f64, {5, 2});
  Output ids = g.constant(idTensor({1, 3, 1, 0, 1}, {5}, i64));
  const FeedMap feeds{{x, randomTensor(f64, {4, 2}, 15)}, {updates, randomTensor(f64, {5, 2}, 16)}};
  CHECK_GRADIENTS(checkGradients(g, scatterAdd(x, ids, updates), {x, updates}, feeds));
  CHECK_GRADIENTS(checkGradients(g, scatterAdd(x * x, ids, updates * updates), {x, updates}, feeds));
}

TEST_CASE("scatterAdd fails at run time on an id out of range") {
  Graph g;
  Output x = g.placeholder("x", f32, {3, 2}), ids = g.placeholder("ids", i32, {2}), updates = g.placeholder("u", f32, {2, 2});
  const std::string msg = errorOf([&] {
    evaluate(g, scatterAdd(x, ids, updates),
             {{x, randomTensor(f32, {3, 2}, 17)}, {ids, idTensor({2, 3}, {2}, i32)}, {updates, randomTensor(f32, {2, 2}, 18)}});
  });
  CHECK_MESSAGE(contains(msg, "ScatterAdd"), msg);
  CHECK_MESSAGE(contains(msg, "id 3"), msg);
  CHECK_MESSAGE(contains(msg, "position 1"), msg);
}

TEST_CASE("scatterAdd rejects mismatched shapes and dtypes") {
  Graph g;
  Output x = g.placeholder("x", f32, {5, 3}), ids = g.placeholder("ids", i32, {4});
  Output wideRows = g.placeholder("wide", f32, {4, 2}), fewRows = g.placeholder("few", f32, {3, 3});
  Output doubles = g.placeholder("doubles", f64, {4, 3}), fids = g.placeholder("fids", f32, {4});
  Output ids2 = g.placeholder("ids2", i32, {4, 1}), good = g.placeholder("good", f32, {4, 3});
  for (const auto& f : std::vector<std::function<void()>>{
           [&] { scatterAdd(x, ids, wideRows); }, [&] { scatterAdd(x, ids, fewRows); }, [&] { scatterAdd(x, ids, doubles); },
           [&] { scatterAdd(x, fids, good); }, [&] { scatterAdd(x, ids2, good); }}) {
    const std::string msg = errorOf(f);
    CHECK_MESSAGE(contains(msg, "ScatterAdd"), msg);
  }
}

// ---- unsortedSegmentSum --------------------------------------------------------------------

TEST_CASE("unsortedSegmentSum sums rows by segment id, empty segments giving zeros") {
  FOR_EACH_FLOAT_DTYPE(dt)
  struct Case {
    Shape data, ids;
    std::vector<int64_t> idValues;
    int64_t numSegments;
  };
  for (DType idType : {i32, i64}) {
    for (const Case& c : {Case{{6, 3}, {6}, {0, 2, 0, 4, 2, 2}, 5}, Case{{2, 3, 2}, {2, 3}, {1, 0, 1, 1, 3, 0}, 4},
                          Case{{4}, {4}, {1, 1, 1, 1}, 2}, Case{{0, 3}, {0}, {}, 2}, Case{{0, 3}, {0}, {}, 0},
                          Case{{3, 2}, {3}, {0, 0, 0}, 1}}) {
      CAPTURE(std::string(dtypeName(idType)));
      CAPTURE(c.data.str());
      CAPTURE(c.ids.str());
      Graph g;
      Output data = g.placeholder("data", dt, c.data), ids = g.placeholder("ids", idType, c.ids);
      Output y = unsortedSegmentSum(data, ids, c.numSegments);
      std::vector<int64_t> outDims{c.numSegments};
      for (int d = c.ids.rank(); d < c.data.rank(); ++d) outDims.push_back(c.data[d]);
      const Shape outShape(outDims);
      CHECK(y.shape() == outShape);
      const Tensor td = randomTensor(dt, c.data, 19), ti = idTensor(c.idValues, c.ids, idType);
      const std::vector<double> expected =
          scatterReference(std::vector<double>(static_cast<size_t>(outShape.numel()), 0.0), ti, td, rowWidth(outShape));
      const Tensor out = evaluate(g, y, {{data, td}, {ids, ti}});
      CHECK(out.shape() == outShape);
      CHECK_CLOSE(out, expected, toleranceFor(dt));
    }
  }
}

TEST_CASE("unsortedSegmentSum on many rows with several threads") {
  Graph g;
  Output data = g.placeholder("data", f64, {300, 40}), ids = g.placeholder("ids", i32, {300});
  const Tensor td = randomTensor(f64, {300, 40}, 20), ti = randomInts(i32, {300}, 0, 7, 21);
  const Tensor out = evaluate(g, unsortedSegmentSum(data, ids, 7), {{data, td}, {ids, ti}}, 4);
  CHECK_CLOSE(out, scatterReference(std::vector<double>(7 * 40, 0.0), ti, td, 40), toleranceFor(f64));
}

TEST_CASE("unsortedSegmentSum gradient matches finite differences") {
  Graph g;
  Output data = g.placeholder("data", f64, {5, 2}), data3 = g.placeholder("data3", f64, {2, 2, 2});
  Output ids = g.constant(idTensor({2, 0, 2, 2, 3}, {5}, i64)), ids2 = g.constant(idTensor({1, 0, 1, 1}, {2, 2}, i32));
  const FeedMap feeds{{data, randomTensor(f64, {5, 2}, 22)}, {data3, randomTensor(f64, {2, 2, 2}, 23)}};
  CHECK_GRADIENTS(checkGradients(g, unsortedSegmentSum(data, ids, 4), {data}, feeds));
  CHECK_GRADIENTS(checkGradients(g, unsortedSegmentSum(data3, ids2, 3), {data3}, feeds));
}

TEST_CASE("unsortedSegmentSum fails at run time on a segment id out of range") {
  Graph g;
  Output data = g.placeholder("data", f32, {3, 2}), ids = g.placeholder("ids", i64, {3});
  Output y = unsortedSegmentSum(data, ids, 4);
  const Tensor td = randomTensor(f32, {3, 2}, 24);
  std::string msg = errorOf([&] { evaluate(g, y, {{data, td}, {ids, idTensor({0, 4, 1}, {3}, i64)}}); });
  CHECK_MESSAGE(contains(msg, "UnsortedSegmentSum"), msg);
  CHECK_MESSAGE(contains(msg, "segment id 4"), msg);
  CHECK_MESSAGE(contains(msg, "position 1"), msg);
  msg = errorOf([&] { evaluate(g, y, {{data, td}, {ids, idTensor({0, 1, -2}, {3}, i64)}}); });
  CHECK_MESSAGE(contains(msg, "segment id -2"), msg);
}

TEST_CASE("unsortedSegmentSum rejects bad segment ids and counts") {
  Graph g;
  Output data = g.placeholder("data", f32, {4, 3}), ids = g.placeholder("ids", i32, {4});
  Output wrong = g.placeholder("wrong", i32, {3}), fids = g.placeholder("fids", f32, {4}), deep = g.placeholder("deep", i32, {4, 3, 1});
  std::string msg = errorOf([&] { unsortedSegmentSum(data, ids, -1); });
  CHECK_MESSAGE(contains(msg, "UnsortedSegmentSum"), msg);
  CHECK_MESSAGE(contains(msg, "-1"), msg);
  msg = errorOf([&] { unsortedSegmentSum(data, wrong, 2); });
  CHECK_MESSAGE(contains(msg, "UnsortedSegmentSum"), msg);
  msg = errorOf([&] { unsortedSegmentSum(data, fids, 2); });
  CHECK_MESSAGE(contains(msg, "UnsortedSegmentSum"), msg);
  msg = errorOf([&] { unsortedSegmentSum(data, deep, 2); });
  CHECK_MESSAGE(contains(msg, "UnsortedSegmentSum"), msg);
}
