// Softmax, LogSoftmax, SoftmaxCrossEntropy and SparseSoftmaxCrossEntropy: forward against naive
// double references, gradients against finite differences, shape and id errors.
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "ops/Ops.h"

#include <cmath>
#include <string>

using namespace weft;
using weft::testing::evaluate;
using weft::testing::randomInts;
using weft::testing::randomTensor;
using weft::testing::toleranceFor;

namespace {

int64_t lastDim(const Shape& s) { return s[s.rank() - 1]; }

/// log sum exp of row r of x viewed as (rows, width), in double.
double refLogSumExp(const std::vector<double>& x, int64_t r, int64_t width) {
  double m = -INFINITY;
  for (int64_t j = 0; j < width; ++j) m = std::max(m, x[static_cast<size_t>(r * width + j)]);
  double s = 0;
  for (int64_t j = 0; j < width; ++j) s += std::exp(x[static_cast<size_t>(r * width + j)] - m);
  return m + std::log(s);
}

std::vector<double> refSoftmax(const std::vector<double>& x, int64_t width, bool log) {
  std::vector<double> y(x.size());
  if (width == 0) return y;
  const int64_t rows = static_cast<int64_t>(x.size()) / width;
  for (int64_t r = 0; r < rows; ++r) {
    const double lse = refLogSumExp(x, r, width);
    for (int64_t j = 0; j < width; ++j) {
      const size_t i = static_cast<size_t>(r * width + j);
      y[i] = log ? x[i] - lse : std::exp(x[i] - lse);
    }
  }
  return y;
}

std::vector<double> refXent(const std::vector<double>& x, const std::vector<double>& labels, int64_t width) {
  const int64_t rows = static_cast<int64_t>(x.size()) / width;
  std::vector<double> loss(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const double lse = refLogSumExp(x, r, width);
    for (int64_t j = 0; j < width; ++j) {
      const size_t i = static_cast<size_t>(r * width + j);
      loss[static_cast<size_t>(r)] -= labels[i] * (x[i] - lse);
    }
  }
  return loss;
}

std::vector<double> refSparseXent(const std::vector<double>& x, const std::vector<double>& ids, int64_t width,
                                  int64_t ignoreIndex) {
  std::vector<double> loss(ids.size());
  for (size_t r = 0; r < ids.size(); ++r) {
    const auto id = static_cast<int64_t>(ids[r]);
    if (id != ignoreIndex)
      loss[r] =
          refLogSumExp(x, static_cast<int64_t>(r), width) - x[r * static_cast<size_t>(width) + static_cast<size_t>(id)];
  }
  return loss;
}

/// Labels that are a probability distribution per row.
Tensor randomDistribution(DType dtype, const Shape& shape, uint64_t seed) {
  std::vector<double> v = randomTensor(f64, shape, seed, 0.1, 1).toDoubles();
  const int64_t width = lastDim(shape);
  for (size_t r = 0; r * static_cast<size_t>(width) < v.size(); ++r) {
    double s = 0;
    for (int64_t j = 0; j < width; ++j) s += v[r * static_cast<size_t>(width) + static_cast<size_t>(j)];
    for (int64_t j = 0; j < width; ++j) v[r * static_cast<size_t>(width) + static_cast<size_t>(j)] /= s;
  }
  return Tensor::fromVector(v, shape).cast(dtype);
}

}  // namespace

TEST_CASE("softmax and logSoftmax match the reference over the last axis") {
  for (DType dt : {f32, f64}) {
    for (const Shape& shape : {Shape{4, 7}, Shape{2, 3, 5}, Shape{3, 1}, Shape{6}, Shape{0, 4}, Shape{3, 0}}) {
      SUBCASE((std::string(dtypeName(dt)) + shape.str()).c_str()) {
        Graph g;
        auto x = g.placeholder("x", dt, shape);
        Tensor xv = randomTensor(dt, shape, 1, -3, 3);
        CHECK_CLOSE(evaluate(g, softmax(x), {{x, xv}}), refSoftmax(xv.toDoubles(), lastDim(shape), false),
                    toleranceFor(dt));
        CHECK_CLOSE(evaluate(g, logSoftmax(x), {{x, xv}}), refSoftmax(xv.toDoubles(), lastDim(shape), true),
                    toleranceFor(dt));
      }
    }
  }
}

TEST_CASE("softmax is stable for large logits") {
  for (DType dt : {f32, f64}) {
    SUBCASE(dtypeName(dt)) {
      Graph g;
      auto x = g.placeholder("x", dt, {2, 3});
      Tensor xv = Tensor::fromVector<double>({1000, 1001, 1002, -1000, -1001, -1003}, {2, 3}).cast(dt);
      Tensor y = evaluate(g, softmax(x), {{x, xv}});
      Tensor ly = evaluate(g, logSoftmax(x), {{x, xv}});
      CHECK_CLOSE(y, refSoftmax(xv.toDoubles(), 3, false), toleranceFor(dt));
      CHECK_CLOSE(ly, refSoftmax(xv.toDoubles(), 3, true), toleranceFor(dt));
    }
  }
}

TEST_CASE("softmax takes unknown dimensions at build time") {
  Graph g;
  auto x = g.placeholder("x", f32, {-1, 5});
  auto y = softmax(x);
  CHECK(y.shape() == Shape{-1, 5});
  auto loss = softmaxCrossEntropy(x, g.placeholder("labels", f32, {-1, 5}));
  CHECK(loss.shape() == Shape{-1});
  auto sparse = sparseSoftmaxCrossEntropy(x, g.placeholder("ids", i64, {-1}));
  CHECK(sparse.shape() == Shape{-1});
  Tensor xv = randomTensor(f32, {3, 5}, 2);
  CHECK_CLOSE(evaluate(g, y, {{x, xv}}), refSoftmax(xv.toDoubles(), 5, false), toleranceFor(f32));
}

TEST_CASE("softmaxCrossEntropy matches the reference") {
  for (DType dt : {f32, f64}) {
    for (const Shape& shape : {Shape{4, 6}, Shape{2, 3, 4}, Shape{5, 1}, Shape{0, 3}}) {
      SUBCASE((std::string(dtypeName(dt)) + shape.str()).c_str()) {
        Graph g;
        auto x = g.placeholder("x", dt, shape);
        auto labels = g.placeholder("labels", dt, shape);
        auto loss = softmaxCrossEntropy(x, labels);
        CHECK(loss.shape().rank() == shape.rank() - 1);
        Tensor xv = randomTensor(dt, shape, 3, -2, 2);
        Tensor lv = randomDistribution(dt, shape, 4);
        Tensor got = evaluate(g, loss, {{x, xv}, {labels, lv}});
        CHECK(got.shape().rank() == shape.rank() - 1);
        CHECK_CLOSE(got, refXent(xv.toDoubles(), lv.toDoubles(), lastDim(shape)), toleranceFor(dt));
      }
    }
  }
}

TEST_CASE("sparseSoftmaxCrossEntropy matches the reference, ignoring ignoreIndex") {
  for (DType dt : {f32, f64}) {
    for (DType it : {i32, i64}) {
      SUBCASE((std::string(dtypeName(dt)) + "/" + dtypeName(it)).c_str()) {
        const int64_t n = 6, c = 5;
        Graph g;
        auto x = g.placeholder("x", dt, {n, c});
        auto ids = g.placeholder("ids", it, {n});
        Tensor xv = randomTensor(dt, {n, c}, 5, -2, 2);
        std::vector<double> idv = randomInts(i64, {n}, 0, c, 6).toDoubles();
        idv[2] = -100;
        Tensor idt = Tensor::fromVector<double>(idv, {n}).cast(it);
        Tensor got = evaluate(g, sparseSoftmaxCrossEntropy(x, ids), {{x, xv}, {ids, idt}});
        CHECK(got.at(2) == 0);
        CHECK_CLOSE(got, refSparseXent(xv.toDoubles(), idv, c, -100), toleranceFor(dt));
      }
    }
  }
  SUBCASE("custom ignore index and one class") {
    Graph g;
    auto x = g.placeholder("x", f64, {3, 1});
    auto ids = g.placeholder("ids", i64, {3});
    Tensor xv = randomTensor(f64, {3, 1}, 7);
    Tensor idt = Tensor::fromVector<int64_t>({0, 7, 0}, {3});
    Tensor got = evaluate(g, sparseSoftmaxCrossEntropy(x, ids, 7), {{x, xv}, {ids, idt}});
    CHECK_CLOSE(got, (std::vector<double>{0, 0, 0}), toleranceFor(f64));
  }
  SUBCASE("empty batch") {
    Graph g;
    auto x = g.placeholder("x", f32, {0, 4});
    auto ids = g.placeholder("ids", i32, {0});
    Tensor got = evaluate(g, sparseSoftmaxCrossEntropy(x, ids), {{x, Tensor(f32, {0, 4})}, {ids, Tensor(i32, {0})}});
    CHECK(got.shape() == Shape{0});
  }
}

TEST_CASE("softmax and logSoftmax gradients match finite differences") {
  for (const Shape& shape : {Shape{3, 4}, Shape{2, 2, 3}, Shape{4, 1}}) {
    SUBCASE(shape.str().c_str()) {
      Graph g;
      auto x = g.placeholder("x", f64, shape);
      const FeedMap feeds{{x, randomTensor(f64, shape, 8, -2, 2)}};
      CHECK_GRADIENTS(checkGradients(g, softmax(x), {x}, feeds));
      CHECK_GRADIENTS(checkGradients(g, logSoftmax(x), {x}, feeds));
    }
  }
}

TEST_CASE("softmaxCrossEntropy gradients match finite differences") {
  for (const Shape& shape : {Shape{3, 4}, Shape{2, 2, 3}, Shape{2, 1}}) {
    SUBCASE(shape.str().c_str()) {
      Graph g;
      auto x = g.placeholder("x", f64, shape);
      auto labels = g.placeholder("labels", f64, shape);
      // Labels that do not sum to 1 check the general gradient probs * sum(labels) - labels.
      const FeedMap feeds{{x, randomTensor(f64, shape, 9, -2, 2)}, {labels, randomTensor(f64, shape, 10, 0, 1)}};
      CHECK_GRADIENTS(checkGradients(g, softmaxCrossEntropy(x, labels), {x, labels}, feeds));
    }
  }
}

TEST_CASE("sparseSoftmaxCrossEntropy gradient matches finite differences, zero for ignored rows") {
  for (DType it : {i32, i64}) {
    SUBCASE(dtypeName(it)) {
      Graph g;
      auto x = g.placeholder("x", f64, {4, 3});
      auto ids = g.placeholder("ids", it, {4});
      Tensor xv = randomTensor(f64, {4, 3}, 11, -2, 2);
      Tensor idt = Tensor::fromVector<int64_t>({2, -1, 0, 1}, {4}).cast(it);
      auto loss = sparseSoftmaxCrossEntropy(x, ids, -1);
      CHECK_GRADIENTS(checkGradients(g, loss, {x}, {{x, xv}, {ids, idt}}));

      // The fused backward: (softmax - onehot) * dy per row, nothing for the ignored row.
      auto dx = toDense(gradients(sum(loss), {x})[0]);
      Tensor got = evaluate(g, dx, {{x, xv}, {ids, idt}});
      std::vector<double> expected = refSoftmax(xv.toDoubles(), 3, false);
      const std::vector<int64_t> idv{2, -1, 0, 1};
      for (size_t r = 0; r < 4; ++r) {
        for (size_t j = 0; j < 3; ++j) {
          double& e = expected[r * 3 + j];
          e = idv[r] < 0 ? 0 : e - (static_cast<int64_t>(j) == idv[r] ? 1 : 0);
        }
      }
      CHECK_CLOSE(got, expected, toleranceFor(f64));
    }
  }
}

TEST_CASE("softmax shape errors name the op") {
  Graph g;
  auto s = g.placeholder("s", f32, {});
  auto ints = g.placeholder("ints", i32, {2, 3});
  const std::string scalarError = errorOf([&] { softmax(s); });
  CHECK(contains(scalarError, "Softmax"));
  CHECK(contains(scalarError, "rank"));
  CHECK(contains(errorOf([&] { logSoftmax(ints); }), "LogSoftmax"));
  CHECK_THROWS_AS(softmax(ints), weft::Error);
}

TEST_CASE("cross-entropy shape errors name the op") {
  Graph g;
  auto x = g.placeholder("x", f32, {4, 3});
  SUBCASE("dense labels") {
    const std::string wrongShape = errorOf([&] { softmaxCrossEntropy(x, g.placeholder("l", f32, {4, 2})); });
    CHECK(contains(wrongShape, "SoftmaxCrossEntropy"));
    CHECK(contains(wrongShape, "labels"));
    CHECK(contains(errorOf([&] { softmaxCrossEntropy(x, g.placeholder("l64", f64, {4, 3})); }), "SoftmaxCrossEntropy"));
    auto empty = g.placeholder("e", f32, {4, 0});
    CHECK(contains(errorOf([&] { softmaxCrossEntropy(empty, empty); }), "no classes"));
  }
  SUBCASE("sparse ids") {
    const std::string rank3 =
        errorOf([&] { sparseSoftmaxCrossEntropy(g.placeholder("x3", f32, {2, 3, 4}), g.placeholder("i", i64, {2})); });
    CHECK(contains(rank3, "SparseSoftmaxCrossEntropy"));
    CHECK(contains(rank3, "(N, C)"));
    CHECK(contains(errorOf([&] { sparseSoftmaxCrossEntropy(x, g.placeholder("f", f32, {4})); }), "i32 or i64"));
    CHECK(contains(errorOf([&] { sparseSoftmaxCrossEntropy(x, g.placeholder("i5", i64, {5})); }), "5 ids for 4 rows"));
    CHECK(contains(errorOf([&] {
                     sparseSoftmaxCrossEntropy(x, g.placeholder("i2", i64, {4, 1}));
                   }),
                   "SparseSoftmaxCrossEntropy"));
  }
}

TEST_CASE("sparseSoftmaxCrossEntropy rejects out-of-range ids at run time") {
  Graph g;
  auto x = g.placeholder("x", f32, {3, 4});
  auto ids = g.placeholder("ids", i32, {3});
  auto loss = sparseSoftmaxCrossEntropy(x, ids);
  Tensor xv = randomTensor(f32, {3, 4}, 12);
  SUBCASE("too large") {
    const std::string e = errorOf([&] {
      evaluate(g, loss, {{x, xv}, {ids, Tensor::fromVector<int32_t>({0, 4, 1}, {3})}});
    });
    CHECK(contains(e, "SparseSoftmaxCrossEntropy"));
    CHECK(contains(e, "id 4 at position 1"));
  }
  SUBCASE("negative") {
    const std::string e = errorOf([&] {
      evaluate(g, loss, {{x, xv}, {ids, Tensor::fromVector<int32_t>({0, 1, -1}, {3})}});
    });
    CHECK(contains(e, "id -1 at position 2"));
  }
  SUBCASE("unknown batch size mismatched at run time") {
    Graph h;
    auto xu = h.placeholder("x", f32, {-1, 4});
    auto iu = h.placeholder("ids", i32, {-1});
    auto lu = sparseSoftmaxCrossEntropy(xu, iu);
    CHECK_THROWS_AS(evaluate(h, lu, {{xu, xv}, {iu, Tensor::fromVector<int32_t>({0, 1}, {2})}}), weft::Error);
  }
}

// ---- penalizeMatches -----------------------------------------------------------------------

namespace {

/// x (rows, width) less `penalty` where rowIds[r] == columnIds[c], subtracted in f32.
std::vector<double> refPenalized(const std::vector<double>& x, const std::vector<int64_t>& rowIds,
                                 const std::vector<int64_t>& columnIds, double penalty) {
  std::vector<double> y = x;
  const size_t width = columnIds.size();
  for (size_t r = 0; r < rowIds.size(); ++r) {
    for (size_t c = 0; c < width; ++c) {
      double& v = y[r * width + c];
      if (rowIds[r] == columnIds[c]) v = static_cast<double>(static_cast<float>(v) - static_cast<float>(penalty));
    }
  }
  return y;
}

template <class I>
Tensor idTensor(const std::vector<int64_t>& ids) {
  return Tensor::fromVector(std::vector<I>(ids.begin(), ids.end()), {static_cast<int64_t>(ids.size())});
}

}  // namespace

TEST_CASE("penalizeMatches subtracts the penalty exactly where a row's id equals a column's id") {
  // Repeated ids among the columns (7 twice) and the rows (3 twice), rows with no match, an id
  // only one side has.
  const std::vector<int64_t> rowIds{3, 7, 0, 3, 9, 5}, columnIds{7, 3, 1, 7, 5, 2, 8};
  const Shape shape{6, 7};
  for (const DType idType : {i32, i64}) {
    const std::string ids = dtypeName(idType);
    CAPTURE(ids);
    const Tensor rows = idType == i32 ? idTensor<int32_t>(rowIds) : idTensor<int64_t>(rowIds);
    const Tensor columns = idType == i32 ? idTensor<int32_t>(columnIds) : idTensor<int64_t>(columnIds);
    const Tensor xv = randomTensor(f32, shape, 21);
    const std::vector<double> want = refPenalized(xv.toDoubles(), rowIds, columnIds, 1000.0);
    Graph g;
    const Output x = g.placeholder("x", f32, shape);
    const Output r = g.placeholder("r", idType, {-1}), c = g.placeholder("c", idType, {-1});
    const FeedMap feeds{{x, xv}, {r, rows}, {c, columns}};
    // Over a fed tensor, which it copies, and in place over a product of its own.
    CHECK_CLOSE(evaluate(g, penalizeMatches(x, r, c, 1000.0), feeds), want, 0.0);
    std::vector<double> twice = xv.toDoubles();
    for (double& v : twice) v *= 2;
    CHECK_CLOSE(evaluate(g, penalizeMatches(x * 2.0, r, c, 1000.0), feeds),
                refPenalized(twice, rowIds, columnIds, 1000.0), 0.0);
  }
}

TEST_CASE("penalizeMatches passes the gradient through unchanged") {
  Graph g;
  const Output x = g.placeholder("x", f64, {3, 4});
  const Output r = g.constant(idTensor<int32_t>({1, 2, 1})), c = g.constant(idTensor<int32_t>({2, 1, 0, 1}));
  const FeedMap feeds{{x, randomTensor(f64, {3, 4}, 22)}};
  CHECK_GRADIENTS(checkGradients(g, square(penalizeMatches(x, r, c, 3.0)), {x}, feeds));
}

TEST_CASE("penalizeMatches rejects ids that do not fit the logits") {
  Graph g;
  const Output x = g.placeholder("x", f32, {4, 5});
  const Output r4 = g.placeholder("r4", i32, {4}), c5 = g.placeholder("c5", i32, {5});
  CHECK(contains(errorOf([&] { penalizeMatches(x, g.placeholder("r3", i32, {3}), c5, 1.0); }),
                 "row ids [3] and column ids [5] do not match logits [4, 5]"));
  CHECK(contains(errorOf([&] { penalizeMatches(x, r4, g.placeholder("c5l", i64, {5}), 1.0); }), "PenalizeMatches"));
  CHECK(contains(errorOf([&] { penalizeMatches(x, g.placeholder("rf", f32, {4}), c5, 1.0); }), "i32 or i64"));
  CHECK(contains(errorOf([&] { penalizeMatches(g.placeholder("x3", f32, {4, 5, 1}), r4, c5, 1.0); }),
                 "needs logits (N, C)"));
}

// ---- sampledSoftmaxCrossEntropy ------------------------------------------------------------

TEST_CASE("sampledSoftmaxCrossEntropy is -log softmax of the row with the true logit in front") {
  FOR_EACH_FLOAT_DTYPE(dt)
  for (const int64_t samples : {int64_t{0}, int64_t{1}, int64_t{9}, int64_t{700}}) {
    CAPTURE(samples);
    // Logits far apart (their exp overflows unless the row's maximum is taken out first), and in
    // row 2 every candidate pushed out by a penalty.
    const Tensor trueLogits = randomTensor(dt, {5}, 24, -60, 60), sampled = randomTensor(dt, {5, samples}, 23, -60, 60);
    Graph g;
    const Output t = g.placeholder("t", dt, {-1}), s = g.placeholder("s", dt, {-1, samples});
    const Output rowIds = g.constant(idTensor<int32_t>({0, 1, 2, 3, 4}));
    const Output columnIds = g.constant(idTensor<int32_t>(std::vector<int64_t>(static_cast<size_t>(samples), 2)));
    const Output loss = sampledSoftmaxCrossEntropy(t, penalizeMatches(s, rowIds, columnIds, 1e9));
    std::vector<double> want;
    const std::vector<double> tv = trueLogits.toDoubles(), sv = sampled.toDoubles();
    for (int64_t r = 0; r < 5; ++r) {
      std::vector<double> row{tv[static_cast<size_t>(r)]};
      for (int64_t j = 0; j < samples; ++j)
        row.push_back(sv[static_cast<size_t>(r * samples + j)] - (r == 2 ? 1e9 : 0));
      want.push_back(refLogSumExp(row, 0, samples + 1) - row[0]);
    }
    CHECK_CLOSE(evaluate(g, loss, {{t, trueLogits}, {s, sampled}}), want, toleranceFor(dt));
  }
}

TEST_CASE("sampledSoftmaxCrossEntropy gradients match finite differences") {
  Graph g;
  const Output t = g.placeholder("t", f64, {4}), s = g.placeholder("s", f64, {4, 6});
  const FeedMap feeds{{t, randomTensor(f64, {4}, 25, -2, 2)}, {s, randomTensor(f64, {4, 6}, 26, -2, 2)}};
  // A weighted sum, so that every row's gradient is scaled differently.
  const Output weights = g.constant(randomTensor(f64, {4}, 27, 0.5, 2));
  CHECK_GRADIENTS(checkGradients(g, sum(sampledSoftmaxCrossEntropy(t, s) * weights), {t, s}, feeds));
}

TEST_CASE("sampledSoftmaxCrossEntropy rejects logits that do not fit together") {
  Graph g;
  const Output s = g.placeholder("s", f32, {4, 5});
  CHECK(contains(errorOf([&] { sampledSoftmaxCrossEntropy(g.placeholder("t3", f32, {3}), s); }),
                 "3 true logits for 4 rows of sampled logits"));
  CHECK(contains(errorOf([&] { sampledSoftmaxCrossEntropy(g.placeholder("t41", f32, {4, 1}), s); }),
                 "needs true logits (N) and sampled logits (N, S)"));
  CHECK(contains(errorOf([&] { sampledSoftmaxCrossEntropy(g.placeholder("t64", f64, {4}), s); }),
                 "SampledSoftmaxCrossEntropy"));
}
