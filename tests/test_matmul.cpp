// Tests of matmul and batchMatmul (ops/MatMul.cpp): every transpose combination against a naive
// double reference, empty and size-1 dimensions, finite-difference gradients and shape errors.
#include "ops/Ops.h"
#include "tests/TestUtil.h"

#include <functional>
#include <string>
#include <vector>

using namespace weft;
using weft::testing::evaluate;
using weft::testing::randomTensor;
using weft::testing::toleranceFor;

namespace {

/// The stored shape of an (rows x cols) operand, swapped when it is used transposed.
Shape operandShape(std::vector<int64_t> batch, int64_t rows, int64_t cols, bool transposed) {
  batch.push_back(transposed ? cols : rows);
  batch.push_back(transposed ? rows : cols);
  return Shape(std::move(batch));
}

/// out[b, i, j] = sum_k op(a)[b, i, k] op(b)[b, k, j], with batch the product of leading dims.
std::vector<double> matmulReference(const Tensor& a, const Tensor& b, int64_t batch, int64_t m, int64_t n, int64_t k,
                                    bool ta, bool tb) {
  std::vector<double> out(static_cast<size_t>(batch * m * n), 0.0);
  for (int64_t p = 0; p < batch; ++p) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t q = 0; q < k; ++q) {
          const double av = a.at(p * m * k + (ta ? q * m + i : i * k + q));
          const double bv = b.at(p * k * n + (tb ? j * k + q : q * n + j));
          acc += av * bv;
        }
        out[static_cast<size_t>((p * m + i) * n + j)] = acc;
      }
    }
  }
  return out;
}

struct Dims {
  int64_t m, n, k;
};

const std::vector<std::pair<bool, bool>> kTransposes = {{false, false}, {false, true}, {true, false}, {true, true}};

}  // namespace

TEST_CASE("matmul matches a naive reference for every transpose combination") {
  FOR_EACH_FLOAT_DTYPE(dt)
  for (const auto& [ta, tb] : kTransposes) {
    // Small, size-1, empty and large enough to be split across threads (both by rows and columns).
    for (const Dims& d : {Dims{3, 5, 4}, Dims{1, 1, 1}, Dims{1, 4, 3}, Dims{4, 1, 3}, Dims{3, 2, 1}, Dims{0, 3, 2},
                          Dims{3, 0, 2}, Dims{2, 3, 0}, Dims{70, 33, 19}, Dims{17, 80, 23}}) {
      CAPTURE(ta);
      CAPTURE(tb);
      CAPTURE(d.m);
      CAPTURE(d.n);
      CAPTURE(d.k);
      Graph g;
      const Shape sa = operandShape({}, d.m, d.k, ta), sb = operandShape({}, d.k, d.n, tb);
      Output a = g.placeholder("a", dt, sa), b = g.placeholder("b", dt, sb);
      Output y = matmul(a, b, ta, tb);
      CHECK(y.shape() == Shape{d.m, d.n});
      CHECK(y.dtype() == dt);
      const Tensor tA = randomTensor(dt, sa, 1), tB = randomTensor(dt, sb, 2);
      const Tensor out = evaluate(g, y, {{a, tA}, {b, tB}}, 4);
      CHECK(out.shape() == Shape{d.m, d.n});
      CHECK_CLOSE(out, matmulReference(tA, tB, 1, d.m, d.n, d.k, ta, tb), toleranceFor(dt));
    }
  }
}

TEST_CASE("matmul with an unknown batch dimension") {
  Graph g;
  Output a = g.placeholder("a", f32, {-1, 4}), b = g.placeholder("b", f32, {4, 2});
  Output y = matmul(a, b);
  CHECK(y.shape() == Shape{-1, 2});
  const Tensor tA = randomTensor(f32, {5, 4}, 3), tB = randomTensor(f32, {4, 2}, 4);
  const Tensor out = evaluate(g, y, {{a, tA}, {b, tB}});
  CHECK(out.shape() == Shape{5, 2});
  CHECK_CLOSE(out, matmulReference(tA, tB, 1, 5, 2, 4, false, false), toleranceFor(f32));
}

TEST_CASE("matmul gradients match finite differences for every transpose combination") {
  for (const auto& [ta, tb] : kTransposes) {
    for (const Dims& d : {Dims{2, 4, 3}, Dims{1, 3, 1}}) {
      CAPTURE(ta);
      CAPTURE(tb);
      CAPTURE(d.m);
      Graph g;
      const Shape sa = operandShape({}, d.m, d.k, ta), sb = operandShape({}, d.k, d.n, tb);
      Output a = g.placeholder("a", f64, sa), b = g.placeholder("b", f64, sb);
      const FeedMap feeds{{a, randomTensor(f64, sa, 5)}, {b, randomTensor(f64, sb, 6)}};
      CHECK_GRADIENTS(checkGradients(g, matmul(a, b, ta, tb), {a, b}, feeds));
    }
  }
}

TEST_CASE("matmul gradient through a product of the same matrix") {
  Graph g;
  Output a = g.placeholder("a", f64, {3, 3});
  CHECK_GRADIENTS(checkGradients(g, matmul(a, a, false, true), {a}, {{a, randomTensor(f64, {3, 3}, 7)}}));
}

TEST_CASE("batchMatmul matches a naive reference for every transpose combination") {
  FOR_EACH_FLOAT_DTYPE(dt)
  for (const auto& [ta, tb] : kTransposes) {
    for (const std::vector<int64_t>& batch : {std::vector<int64_t>{2}, std::vector<int64_t>{2, 3},
                                              std::vector<int64_t>{1}, std::vector<int64_t>{0}}) {
      for (const Dims& d : {Dims{3, 5, 4}, Dims{1, 1, 2}, Dims{2, 3, 0}, Dims{40, 35, 6}}) {
        CAPTURE(ta);
        CAPTURE(tb);
        CAPTURE(batch.size());
        CAPTURE(batch[0]);
        CAPTURE(d.m);
        Graph g;
        const Shape sa = operandShape(batch, d.m, d.k, ta), sb = operandShape(batch, d.k, d.n, tb);
        Output a = g.placeholder("a", dt, sa), b = g.placeholder("b", dt, sb);
        Output y = batchMatmul(a, b, ta, tb);
        std::vector<int64_t> expectedShape = batch;
        expectedShape.push_back(d.m);
        expectedShape.push_back(d.n);
        CHECK(y.shape() == Shape(expectedShape));
        int64_t count = 1;
        for (int64_t v : batch) count *= v;
        const Tensor tA = randomTensor(dt, sa, 8), tB = randomTensor(dt, sb, 9);
        const Tensor out = evaluate(g, y, {{a, tA}, {b, tB}}, 4);
        CHECK(out.shape() == Shape(expectedShape));
        CHECK_CLOSE(out, matmulReference(tA, tB, count, d.m, d.n, d.k, ta, tb), toleranceFor(dt));
      }
    }
  }
}

TEST_CASE("batchMatmul gradients match finite differences for every transpose combination") {
  for (const auto& [ta, tb] : kTransposes) {
    for (const std::vector<int64_t>& batch : {std::vector<int64_t>{2}, std::vector<int64_t>{2, 1}}) {
      CAPTURE(ta);
      CAPTURE(tb);
      CAPTURE(batch.size());
      Graph g;
      const Shape sa = operandShape(batch, 2, 3, ta), sb = operandShape(batch, 3, 2, tb);
      Output a = g.placeholder("a", f64, sa), b = g.placeholder("b", f64, sb);
      const FeedMap feeds{{a, randomTensor(f64, sa, 10)}, {b, randomTensor(f64, sb, 11)}};
      CHECK_GRADIENTS(checkGradients(g, batchMatmul(a, b, ta, tb), {a, b}, feeds));
    }
  }
}

TEST_CASE("matmul rejects mismatched inner dimensions, naming the op and the sizes") {
  for (const auto& [ta, tb] : kTransposes) {
    CAPTURE(ta);
    CAPTURE(tb);
    Graph g;
    Output a = g.placeholder("a", f32, operandShape({}, 2, 3, ta)),
           b = g.placeholder("b", f32, operandShape({}, 4, 5, tb));
    const std::string msg = errorOf([&] { matmul(a, b, ta, tb); });
    CHECK_MESSAGE(contains(msg, "MatMul"), msg);
    CHECK_MESSAGE(contains(msg, "inner"), msg);
    CHECK_MESSAGE(contains(msg, "3"), msg);
    CHECK_MESSAGE(contains(msg, "4"), msg);
  }
}

TEST_CASE("matmul rejects non-matrices, mixed dtypes and integers") {
  Graph g;
  Output v = g.placeholder("v", f32, {3}), m = g.placeholder("m", f32, {3, 2}), m64 = g.placeholder("m64", f64, {2, 3});
  Output b3 = g.placeholder("b3", f32, {2, 3, 2}), ints = g.placeholder("ints", i32, {2, 2});
  for (const auto& f : std::vector<std::function<void()>>{[&] { matmul(v, m); }, [&] { matmul(b3, m); },
                                                          [&] { matmul(m64, m); }, [&] { matmul(ints, ints); }}) {
    const std::string msg = errorOf(f);
    CHECK_MESSAGE(contains(msg, "MatMul"), msg);
  }
}

TEST_CASE("batchMatmul rejects mismatched batch dimensions, ranks and inner dimensions") {
  Graph g;
  Output a = g.placeholder("a", f32, {2, 3, 4}), b = g.placeholder("b", f32, {3, 4, 5});
  Output c = g.placeholder("c", f32, {2, 5, 5}), m = g.placeholder("m", f32, {3, 4});
  Output r4 = g.placeholder("r4", f32, {1, 2, 4, 5});
  std::string msg = errorOf([&] { batchMatmul(a, b); });
  CHECK_MESSAGE(contains(msg, "BatchMatMul"), msg);
  CHECK_MESSAGE(contains(msg, "batch"), msg);
  msg = errorOf([&] { batchMatmul(a, c); });
  CHECK_MESSAGE(contains(msg, "BatchMatMul"), msg);
  CHECK_MESSAGE(contains(msg, "inner"), msg);
  msg = errorOf([&] { batchMatmul(m, m); });
  CHECK_MESSAGE(contains(msg, "BatchMatMul"), msg);
  msg = errorOf([&] { batchMatmul(a, r4); });
  CHECK_MESSAGE(contains(msg, "BatchMatMul"), msg);
}
