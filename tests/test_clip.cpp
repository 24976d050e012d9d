// SquaredNorm, SparseSquaredNorm and clipByGlobalNorm against naive double references.
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "ops/Ops.h"
#include "ops/RowIds.h"

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>

using namespace weft;
using weft::testing::evaluate;
using weft::testing::randomTensor;
using weft::testing::toleranceFor;

namespace {

double refSquaredNorm(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return s;
}

/// The squared norm of the dense tensor that rows `values` (n, width) at `ids` stand for.
double refSparseSquaredNorm(const std::vector<int64_t>& ids, const std::vector<double>& values) {
  const size_t width = ids.empty() ? 0 : values.size() / ids.size();
  std::map<int64_t, std::vector<double>> rows;
  for (size_t k = 0; k < ids.size(); ++k) {
    std::vector<double>& row = rows[ids[k]];
    row.resize(width);
    for (size_t j = 0; j < width; ++j) row[j] += values[k * width + j];
  }
  double s = 0;
  for (const auto& [id, row] : rows) s += refSquaredNorm(row);
  return s;
}

std::vector<double> scaled(std::vector<double> v, double k) {
  for (double& e : v) e *= k;
  return v;
}

}  // namespace

TEST_CASE("squaredNorm sums squares") {
  for (DType dt : {f32, f64}) {
    for (const Shape& shape : {Shape{3, 4}, Shape{}, Shape{1}, Shape{0, 3}, Shape{3, 5000}}) {
      SUBCASE((std::string(dtypeName(dt)) + shape.str()).c_str()) {
        Graph g;
        auto x = g.placeholder("x", dt, shape);
        Tensor xv = randomTensor(dt, shape, 1);
        auto y = squaredNorm(x);
        CHECK(y.shape() == Shape{});
        CHECK(y.dtype() == dt);
        const std::vector<double> expected{refSquaredNorm(xv.toDoubles())};
        CHECK_CLOSE(evaluate(g, y, {{x, xv}}), expected, toleranceFor(dt));
        CHECK_CLOSE(evaluate(g, y, {{x, xv}}, 2), expected, toleranceFor(dt));
      }
    }
  }
}

TEST_CASE("squaredNorm gradient matches finite differences") {
  for (const Shape& shape : {Shape{3, 4}, Shape{}, Shape{5}}) {
    SUBCASE(shape.str().c_str()) {
      Graph g;
      auto x = g.placeholder("x", f64, shape);
      CHECK_GRADIENTS(checkGradients(g, squaredNorm(x), {x}, {{x, randomTensor(f64, shape, 2)}}));
    }
  }
}

TEST_CASE("sparseSquaredNorm sums duplicate rows before squaring") {
  const std::vector<int64_t> ids{3, 0, 3, 7, 0, 3};
  for (DType dt : {f32, f64}) {
    for (DType it : {i32, i64}) {
      SUBCASE((std::string(dtypeName(dt)) + "/" + dtypeName(it)).c_str()) {
        Graph g;
        auto indices = g.placeholder("indices", it, {6});
        auto values = g.placeholder("values", dt, {6, 2, 2});
        Tensor vv = randomTensor(dt, {6, 2, 2}, 3);
        Tensor iv = Tensor::fromVector(ids, {6}).cast(it);
        auto y = sparseSquaredNorm(indices, values);
        CHECK(y.shape() == Shape{});
        const double expected = refSparseSquaredNorm(ids, vv.toDoubles());
        // Duplicates must not count as separate rows.
        CHECK(std::abs(expected - refSquaredNorm(vv.toDoubles())) > 1e-3);
        CHECK_CLOSE(evaluate(g, y, {{indices, iv}, {values, vv}}), (std::vector<double>{expected}), toleranceFor(dt));
      }
    }
  }
  SUBCASE("many rows on two threads") {
    Graph g;
    auto indices = g.placeholder("indices", i64, {4000});
    auto values = g.placeholder("values", f64, {4000, 8});
    Tensor iv = testing::randomInts(i64, {4000}, 0, 300, 4);
    Tensor vv = randomTensor(f64, {4000, 8}, 5);
    const double expected = refSparseSquaredNorm(iv.toVector<int64_t>(), vv.toDoubles());
    CHECK_CLOSE(evaluate(g, sparseSquaredNorm(indices, values), {{indices, iv}, {values, vv}}, 2),
                (std::vector<double>{expected}), toleranceFor(f64));
  }
  SUBCASE("no rows") {
    Graph g;
    auto indices = g.placeholder("indices", i32, {0});
    auto values = g.placeholder("values", f32, {0, 3});
    CHECK_CLOSE(
        evaluate(g, sparseSquaredNorm(indices, values), {{indices, Tensor(i32, {0})}, {values, Tensor(f32, {0, 3})}}),
        (std::vector<double>{0}), 0);
  }
}

TEST_CASE("groupRowsById groups positions by ascending id, each group in the order its rows came") {
  // The sums of duplicate rows (clipping, sparse updates, the servers) add in this order.
  const auto reference = [](const std::vector<int64_t>& ids) {
    std::map<int64_t, std::vector<int64_t>> positions;
    for (size_t k = 0; k < ids.size(); ++k) positions[ids[k]].push_back(static_cast<int64_t>(k));
    return positions;
  };
  const auto check = [&](const std::vector<int64_t>& ids) {
    const RowGroups groups = groupRowsById(ids);
    const auto expected = reference(ids);
    REQUIRE(groups.count() == static_cast<int64_t>(expected.size()));
    int64_t g = 0;
    for (const auto& [id, positions] : expected) {
      CAPTURE(id);
      const std::vector<int64_t> got(groups.order.begin() + groups.begin(g), groups.order.begin() + groups.end(g));
      CHECK(got == positions);
      ++g;
    }
  };
  std::mt19937_64 random(7);
  const auto draw = [&](size_t n, int64_t low, int64_t high) {
    std::vector<int64_t> ids(n);
    for (int64_t& id : ids) id = std::uniform_int_distribution<int64_t>(low, high)(random);
    return ids;
  };
  SUBCASE("few") { check({3, 0, 3, 7, 0, 3}); }
  SUBCASE("none and one") {
    check({});
    check({5});
  }
  SUBCASE("many duplicates within one digit") { check(draw(5000, 0, 300)); }
  SUBCASE("ids spanning several digits") { check(draw(5000, 0, int64_t{1} << 40)); }
  SUBCASE("negative ids and the whole int64 range") {
    std::vector<int64_t> ids = draw(3000, -1000, 1000);
    for (int64_t extreme : {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), int64_t{-1}})
      ids.insert(ids.begin() + 17, {extreme, extreme});
    check(ids);
  }
  SUBCASE("one id throughout") { check(std::vector<int64_t>(1000, 42)); }
}

TEST_CASE("sparseSquaredNorm has no gradient") {
  Graph g;
  auto indices = g.placeholder("indices", i64, {2});
  auto values = g.placeholder("values", f64, {2, 3});
  CHECK_FALSE(gradients(sparseSquaredNorm(indices, values), {values})[0].valid());
}

TEST_CASE("norm shape errors name the op") {
  Graph g;
  CHECK(contains(errorOf([&] { squaredNorm(g.placeholder("i", i32, {3})); }), "SquaredNorm"));
  auto values = g.placeholder("values", f32, {4, 3});
  const std::string floatIds = errorOf([&] { sparseSquaredNorm(g.placeholder("f", f32, {4}), values); });
  CHECK(contains(floatIds, "SparseSquaredNorm"));
  CHECK(contains(floatIds, "i32 or i64"));
  CHECK(contains(errorOf([&] { sparseSquaredNorm(g.placeholder("m", i64, {4, 1}), values); }), "rank 2"));
  CHECK(contains(errorOf([&] { sparseSquaredNorm(g.placeholder("n", i64, {5}), values); }), "5 indices for 4 rows"));
  CHECK(contains(errorOf([&] { sparseSquaredNorm(g.placeholder("s", i64, {4}), g.placeholder("v", f32, {})); }),
                 "SparseSquaredNorm"));
  // Unknown sizes wait for run time.
  auto y = sparseSquaredNorm(g.placeholder("u", i64, {-1}), g.placeholder("vu", f32, {-1, 3}));
  CHECK(y.shape() == Shape{});
}

TEST_CASE("clipByGlobalNorm scales dense gradients") {
  for (DType dt : {f32, f64}) {
    SUBCASE(dtypeName(dt)) {
      Graph g;
      auto a = g.placeholder("a", dt, {3, 2});
      auto b = g.placeholder("b", dt, {4});
      Tensor av = randomTensor(dt, {3, 2}, 6), bv = randomTensor(dt, {4}, 7);
      const double norm = std::sqrt(refSquaredNorm(av.toDoubles()) + refSquaredNorm(bv.toDoubles()));
      const double clip = norm / 3;
      auto [clipped, globalNorm] = clipByGlobalNorm({Grad(a), Grad(), Grad(b)}, clip);
      REQUIRE(clipped.size() == 3);
      CHECK_FALSE(clipped[1].valid());
      Session s(g);
      auto out = s.run({clipped[0].dense, clipped[2].dense, globalNorm}, {{a, av}, {b, bv}});
      CHECK_CLOSE(out[0], scaled(av.toDoubles(), clip / norm), toleranceFor(dt));
      CHECK_CLOSE(out[1], scaled(bv.toDoubles(), clip / norm), toleranceFor(dt));
      CHECK_CLOSE(out[2], (std::vector<double>{norm}), toleranceFor(dt));
    }
  }
}

TEST_CASE("clipByGlobalNorm counts sparse gradients by their dense value") {
  Graph g;
  auto dense = g.placeholder("dense", f64, {2, 3});
  auto indices = g.placeholder("indices", i32, {4});
  auto values = g.placeholder("values", f64, {4, 3});
  Tensor dv = randomTensor(f64, {2, 3}, 8), vv = randomTensor(f64, {4, 3}, 9);
  const std::vector<int64_t> ids{1, 4, 1, 1};
  Tensor iv = Tensor::fromVector(ids, {4}).cast(i32);
  const double norm = std::sqrt(refSquaredNorm(dv.toDoubles()) + refSparseSquaredNorm(ids, vv.toDoubles()));
  const double clip = 0.5;
  REQUIRE(norm > clip);
  auto [clipped, globalNorm] = clipByGlobalNorm({Grad(dense), Grad::sparse(indices, values, {6, 3})}, clip);
  REQUIRE(clipped[1].isSparse());
  CHECK(clipped[1].indices == indices);
  CHECK(clipped[1].denseShape == Shape{6, 3});
  Session s(g);
  auto out = s.run({clipped[0].dense, clipped[1].values, globalNorm}, {{dense, dv}, {indices, iv}, {values, vv}});
  CHECK_CLOSE(out[0], scaled(dv.toDoubles(), clip / norm), toleranceFor(f64));
  CHECK_CLOSE(out[1], scaled(vv.toDoubles(), clip / norm), toleranceFor(f64));
  CHECK_CLOSE(out[2], (std::vector<double>{norm}), toleranceFor(f64));
}

TEST_CASE("clipByGlobalNorm leaves gradients below the threshold unchanged") {
  Graph g;
  auto a = g.placeholder("a", f32, {5});
  auto indices = g.placeholder("indices", i64, {2});
  auto values = g.placeholder("values", f32, {2, 2});
  Tensor av = randomTensor(f32, {5}, 10), vv = randomTensor(f32, {2, 2}, 11);
  Tensor iv = Tensor::fromVector<int64_t>({0, 0}, {2});
  auto [clipped, globalNorm] = clipByGlobalNorm({Grad(a), Grad::sparse(indices, values, {3, 2})}, 100.0);
  Session s(g);
  auto out = s.run({clipped[0].dense, clipped[1].values, globalNorm}, {{a, av}, {indices, iv}, {values, vv}});
  CHECK_CLOSE(out[0], av.toDoubles(), 0);
  CHECK_CLOSE(out[1], vv.toDoubles(), 0);
  const double norm = std::sqrt(refSquaredNorm(av.toDoubles()) + refSparseSquaredNorm({0, 0}, vv.toDoubles()));
  CHECK_CLOSE(out[2], (std::vector<double>{norm}), toleranceFor(f32));
}

TEST_CASE("clipByGlobalNorm rejects a non-positive norm and no gradients") {
  Graph g;
  auto a = g.placeholder("a", f32, {2});
  CHECK_THROWS_AS(clipByGlobalNorm({Grad(a)}, 0.0), weft::Error);
  CHECK_THROWS_AS(clipByGlobalNorm({Grad()}, 1.0), weft::Error);
}
