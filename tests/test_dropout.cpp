// Dropout: drop rate, exact scaling of kept values, reproducibility across sessions, fresh masks
// on successive runs, data-parallel replicas drawing their part of the whole batch's mask, the
// mask gradient and the rate check.
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "ops/Ops.h"

#include <cmath>
#include <string>

using namespace weft;
using weft::testing::randomTensor;


TEST_CASE("dropout drops about rate of the elements and scales the rest exactly") {
  for (DType dt : {f32, f64}) {
    for (double rate : {0.0, 0.25, 0.7}) {
      SUBCASE((std::string(dtypeName(dt)) + " rate " + std::to_string(rate)).c_str()) {
        const int64_t n = 100000;
        Graph g;
        auto x = g.placeholder("x", dt, {100, n / 100});
        auto y = dropout(x, rate, 42);
        Output mask(y.node(), 1);
        CHECK(mask.type().str() == x.type().str());
        Tensor xv = randomTensor(dt, {100, n / 100}, 1, 0.5, 2);  // never 0, so drops are visible
        Session s(g, {2});
        auto out = s.run({y, mask}, {{x, xv}});
        const std::vector<double> xs = xv.toDoubles(), ys = out[0].toDoubles(), ms = out[1].toDoubles();
        // Scaling in x's dtype, as the kernel does.
        const double keep =
            dt == f32 ? static_cast<double>(static_cast<float>(1.0 / (1.0 - rate))) : 1.0 / (1.0 - rate);
        int64_t dropped = 0;
        bool exact = true;
        for (size_t i = 0; i < xs.size(); ++i) {
          if (ms[i] == 0) {
            ++dropped;
            exact = exact && ys[i] == 0;
          } else {
            const double expected =
                dt == f32 ? static_cast<double>(static_cast<float>(xs[i]) * static_cast<float>(keep)) : xs[i] * keep;
            exact = exact && ms[i] == keep && ys[i] == expected;
          }
        }
        CHECK(exact);
        // Binomial standard deviation is at most 0.0016 here; allow 5 of them.
        CHECK(std::abs(static_cast<double>(dropped) / static_cast<double>(n) - rate) < 0.008);
      }
    }
  }
}

TEST_CASE("dropout is reproducible from the seed and draws a new mask every run") {
  auto build = [](Graph& g, uint64_t seed) {
    auto x = g.placeholder("x", f32, {50, 40});
    return std::make_pair(x, dropout(x, 0.5, seed));
  };
  Tensor xv = randomTensor(f32, {50, 40}, 2, 0.5, 1);
  Graph g1, g2, g3;
  auto [x1, y1] = build(g1, 7);
  auto [x2, y2] = build(g2, 7);
  auto [x3, y3] = build(g3, 8);
  Session s1(g1), s2(g2, {2}), s3(g3);
  const Tensor first = s1.run({y1}, {{x1, xv}})[0];
  const Tensor second = s1.run({y1}, {{x1, xv}})[0];
  const Tensor replayFirst = s2.run({y2}, {{x2, xv}})[0];
  const Tensor replaySecond = s2.run({y2}, {{x2, xv}})[0];
  const Tensor otherSeed = s3.run({y3}, {{x3, xv}})[0];
  CHECK(first.toDoubles() == replayFirst.toDoubles());
  CHECK(second.toDoubles() == replaySecond.toDoubles());
  CHECK(first.toDoubles() != second.toDoubles());
  CHECK(first.toDoubles() != otherSeed.toDoubles());
}

TEST_CASE("each data-parallel replica draws its part of the mask one session draws for the total batch") {
  const int64_t rows = 12, cols = 7, parts = 3, part = rows / parts;
  Tensor whole = randomTensor(f32, {rows, cols}, 4, 0.5, 1);
  auto maskOf = [&](const Tensor& x, int replica) {
    Graph g;
    auto in = g.placeholder("x", f32, {-1, cols});
    Output mask(dropout(in, 0.5, 9).node(), 1);
    Session s(g, {1, false, replica});
    s.run({mask}, {{in, x}});  // the second run's mask: steps are keyed too
    return s.run({mask}, {{in, x}})[0].toDoubles();
  };
  const std::vector<double> total = maskOf(whole, 0);
  for (int r = 0; r < parts; ++r) {
    CAPTURE(r);
    Tensor mine(f32, {part, cols});
    const std::vector<double> all = whole.toDoubles();
    for (int64_t i = 0; i < part * cols; ++i)
      mine.data<float>()[i] = static_cast<float>(all[static_cast<size_t>(r * part * cols + i)]);
    const std::vector<double> expected(total.begin() + r * part * cols, total.begin() + (r + 1) * part * cols);
    CHECK(maskOf(mine, r) == expected);
  }
}

TEST_CASE("runs that draw no random numbers (evaluation) leave the masks of later runs alone") {
  auto build = [](Graph& g) {
    auto x = g.placeholder("x", f32, {30, 20});
    return std::make_pair(x, Output(dropout(x, 0.5, 5).node(), 1));
  };
  const Tensor xv = randomTensor(f32, {30, 20}, 3, 0.5, 1);
  Graph g1, g2;
  auto [x1, mask1] = build(g1);
  auto [x2, mask2] = build(g2);
  const Output evaluation = sum(x2 * 2.0);  // no random op
  Session plain(g1, {1}), evaluated(g2, {1});
  plain.run({mask1}, {{x1, xv}});
  evaluated.run({mask2}, {{x2, xv}});
  evaluated.run({evaluation}, {{x2, xv}});
  CHECK(evaluated.step() == 1);
  CHECK(plain.run({mask1}, {{x1, xv}})[0].toDoubles() == evaluated.run({mask2}, {{x2, xv}})[0].toDoubles());
}

TEST_CASE("two dropout ops with the same seed draw different masks") {
  Graph g;
  auto x = g.placeholder("x", f64, {30, 30});
  auto a = dropout(x, 0.5, 3), b = dropout(x, 0.5, 3);
  auto out = Session(g).run({a, b}, {{x, randomTensor(f64, {30, 30}, 3, 0.5, 1)}});
  CHECK(out[0].toDoubles() != out[1].toDoubles());
}

TEST_CASE("dropout gradient is dy * mask") {
  for (DType dt : {f32, f64}) {
    SUBCASE(dtypeName(dt)) {
      Graph g;
      auto x = g.placeholder("x", dt, {6, 7});
      auto w = g.placeholder("w", dt, {6, 7});
      auto y = dropout(x, 0.4, 11);
      Output mask(y.node(), 1);
      auto dx = toDense(gradients(sum(w * y), {x})[0]);
      Tensor wv = randomTensor(dt, {6, 7}, 4);
      Session s(g);
      // Mask and gradient come from the same run, so from the same draw.
      auto out = s.run({mask, dx}, {{x, randomTensor(dt, {6, 7}, 5)}, {w, wv}});
      std::vector<double> expected = wv.toDoubles();
      const std::vector<double> ms = out[0].toDoubles();
      for (size_t i = 0; i < expected.size(); ++i) expected[i] *= ms[i];
      CHECK_CLOSE(out[1], expected, testing::toleranceFor(dt));
    }
  }
}

TEST_CASE("dropout of an empty tensor is empty") {
  Graph g;
  auto x = g.placeholder("x", f32, {0, 5});
  CHECK(testing::evaluate(g, dropout(x, 0.5, 1), {{x, Tensor(f32, {0, 5})}}).shape() == Shape{0, 5});
}

TEST_CASE("dropout rejects a rate outside [0, 1) and integer inputs at build time") {
  Graph g;
  auto x = g.placeholder("x", f32, {-1, 3});
  for (double rate : {1.0, -0.1, 1.5}) {
    const std::string e = errorOf([&] { dropout(x, rate, 1); });
    CHECK(contains(e, "Dropout"));
    CHECK(contains(e, "[0, 1)"));
  }
  CHECK(contains(errorOf([&] { dropout(g.placeholder("i", i32, {3}), 0.5, 1); }), "Dropout"));
}
