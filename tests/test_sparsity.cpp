// How a sparse variable is synchronised under --arch auto, from its measured alpha: the
// sparsity-aware paper's Table 3 bytes per machine, the measurement of alpha on a graph's sparse
// gradients, and TouchedRows, which turns a densely summed gradient back into exactly the rows
// some worker touched.
#include "tests/TestUtil.h"

#include "dist/collective/CollectiveOps.h"
#include "dist/Sparsity.h"
#include "ops/Ops.h"
#include "optim/Optimizer.h"

using namespace weft;
using namespace weft::dist;

TEST_CASE("on one machine nothing crosses between machines either way") {
  const SyncBytes b = sparseSyncBytes(0.9, 1000, 40, {1.0});
  CHECK(b.servers == 0);
  CHECK(b.allReduce == 0);
}

TEST_CASE("a variable on one server: the busiest machine moves Table 3's 2 alpha w (N - 1)") {
  // N = 4, w = 1000: the serving machine moves 2 * 0.5 * 1000 * 3 = 3000; the others 2 * 0.5 * 1000.
  const SyncBytes b = sparseSyncBytes(0.5, 1000, 0, {1, 0, 0, 0});
  CHECK(b.servers == doctest::Approx(3000));
  // AllReduce: 4 w (N - 1) / N = 3000, a tie, which keeps the servers.
  CHECK(b.allReduce == doctest::Approx(3000));
  CHECK(sparseSyncBytes(0.9, 1000, 0, {1, 0, 0, 0}).servers == doctest::Approx(5400));
}

TEST_CASE("spread evenly over every machine, the servers move 4 alpha w (N - 1) / N, less than AllReduce") {
  for (const double alpha : {0.1, 0.5, 0.99}) {
    const SyncBytes b = sparseSyncBytes(alpha, 1000, 0, {0.25, 0.25, 0.25, 0.25});
    CHECK(b.servers == doctest::Approx(4 * alpha * 1000 * 3 / 4));
    CHECK(b.servers < b.allReduce);
  }
}

TEST_CASE("the summed counts add to AllReduce's bytes") {
  CHECK(sparseSyncBytes(0.5, 1000, 200, {1, 0}).allReduce == doctest::Approx(4 * 1200 * 1 / 2.0));
}

TEST_CASE("with the variable on one of N machines, AllReduce moves fewer bytes exactly when alpha > 2 / N") {
  for (const int n : {3, 4, 8, 16}) {
    std::vector<double> shares(static_cast<size_t>(n), 0.0);
    shares[0] = 1;
    const double threshold = 2.0 / n;
    const SyncBytes above = sparseSyncBytes(threshold * 1.01, 4096, 0, shares);
    const SyncBytes below = sparseSyncBytes(threshold * 0.99, 4096, 0, shares);
    CAPTURE(n);
    CHECK(above.allReduce < above.servers);
    CHECK(below.allReduce > below.servers);
  }
}

TEST_CASE("measureSparsity averages the fraction of rows each feed's ids touch, repeats counted once") {
  Graph g;
  const Output ids = g.placeholder("ids", i32, {-1});
  const Output table = g.variable("table", f32, {10, 3}, Initializer::constant(1));
  const Output dense = g.variable("dense", f32, {3}, Initializer::constant(1));
  optim::SGD(0.1).minimize(sum(square(gather(table, ids))) + sum(dense));
  const std::vector<FeedMap> feeds{{{ids, Tensor::fromVector<int32_t>({1, 1, 2, 3}, {4})}},   // 3 of 10 rows
                                   {{ids, Tensor::fromVector<int32_t>({0, 9, 8, 7, 6, 5, 5}, {7})}}};  // 6 of 10
  const std::map<std::string, double> alpha = measureSparsity(g, feeds);
  REQUIRE(alpha.size() == 1);  // the dense variable has no alpha
  CHECK(alpha.at("table") == doctest::Approx((0.3 + 0.6) / 2));
}

TEST_CASE("TouchedRows gives the counted rows with their values, and every other row adds zero to the first") {
  Graph g;
  const Output rows = g.constant(Tensor::fromVector<float>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}));
  const Output counts = g.constant(Tensor::fromVector<float>({0, 2, 0, 0.5f}, {4}));
  const auto [ids, values] = touchedRows(rows, counts, i64);
  Session s(g);
  const std::vector<Tensor> got = s.run({ids, values});
  CHECK(got[0].toVector<int64_t>() == std::vector<int64_t>{1, 1, 1, 3});
  CHECK(got[1].toVector<float>() == std::vector<float>{0, 0, 3, 4, 0, 0, 7, 8});
  // Summed by id, as a sparse update sums them: rows 1 and 3 exactly, nothing else.
  const std::vector<float> summed = s.run({unsortedSegmentSum(values, ids, 4)})[0].toVector<float>();
  CHECK(summed == std::vector<float>{0, 0, 3, 4, 0, 0, 7, 8});
}

TEST_CASE("TouchedRows refuses rows that no worker touched, naming the op") {
  Graph g;
  const Output rows = g.constant(Tensor::zeros(f32, {3, 2}));
  const auto [ids, values] = touchedRows(rows, g.constant(Tensor::zeros(f32, {3})), i32);
  Session s(g);
  CHECK(contains(errorOf([&] { s.run({ids}); }), "no row of [3, 2] was touched by any worker"));
}
