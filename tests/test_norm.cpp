// Tests of batchNormTrain and batchNormInference: forward against double loops, gradients
// against finite differences (2-D and 4-D inputs), shape errors.
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "core/Session.h"
#include "ops/Ops.h"

#include <cmath>

using namespace weft;
using weft::testing::evaluate;
using weft::testing::randomTensor;
using weft::testing::toleranceFor;

namespace {

/// x (N, C, S...) seen as (N, C, S) in double.
struct Channels {
  std::vector<double> v;
  int64_t n, c, s;
  double operator()(int64_t i, int64_t ch, int64_t j) const { return v[static_cast<size_t>((i * c + ch) * s + j)]; }
};
Channels channels(const Tensor& t) {
  int64_t s = 1;
  for (int i = 2; i < t.rank(); ++i) s *= t.shape()[i];
  return {t.toDoubles(), t.shape()[0], t.shape()[1], s};
}

struct Stats {
  std::vector<double> mean, var;
};

Stats referenceStats(const Channels& x) {
  Stats st{std::vector<double>(static_cast<size_t>(x.c), 0.0), std::vector<double>(static_cast<size_t>(x.c), 0.0)};
  const double m = static_cast<double>(x.n * x.s);
  for (int64_t ch = 0; ch < x.c; ++ch) {
    double total = 0, sq = 0;
    for (int64_t i = 0; i < x.n; ++i)
      for (int64_t j = 0; j < x.s; ++j) total += x(i, ch, j);
    const double mean = total / m;
    for (int64_t i = 0; i < x.n; ++i)
      for (int64_t j = 0; j < x.s; ++j) sq += (x(i, ch, j) - mean) * (x(i, ch, j) - mean);
    st.mean[static_cast<size_t>(ch)] = mean;
    st.var[static_cast<size_t>(ch)] = sq / m;
  }
  return st;
}

std::vector<double> referenceNormalise(const Channels& x, const std::vector<double>& gamma,
                                       const std::vector<double>& beta, const Stats& st, double eps) {
  std::vector<double> out(x.v.size());
  for (int64_t i = 0; i < x.n; ++i)
    for (int64_t ch = 0; ch < x.c; ++ch)
      for (int64_t j = 0; j < x.s; ++j) {
        const size_t k = static_cast<size_t>(ch);
        out[static_cast<size_t>((i * x.c + ch) * x.s + j)] =
            gamma[k] * (x(i, ch, j) - st.mean[k]) / std::sqrt(st.var[k] + eps) + beta[k];
      }
  return out;
}

const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s{{6, 4}, {3, 2, 4, 5}, {2, 3, 1, 1}, {1, 3, 2, 2}, {4, 1}};
  return s;
}

/// Placeholders and random values for x, gamma, beta (and mean, var for inference).
struct BatchNormFixture {
  Graph g;
  Output x, gamma, beta, mean, var;
  FeedMap feeds;

  BatchNormFixture(DType dtype, const Shape& xs, bool inference = false) {
    const Shape cs{xs[1]};
    x = g.placeholder("x", dtype, xs);
    gamma = g.placeholder("gamma", dtype, cs);
    beta = g.placeholder("beta", dtype, cs);
    feeds = {{x, randomTensor(dtype, xs, 1, -2, 3)}, {gamma, randomTensor(dtype, cs, 2, 0.5, 1.5)},
             {beta, randomTensor(dtype, cs, 3)}};
    if (inference) {
      mean = g.placeholder("mean", dtype, cs);
      var = g.placeholder("var", dtype, cs);
      feeds.push_back({mean, randomTensor(dtype, cs, 4)});
      feeds.push_back({var, randomTensor(dtype, cs, 5, 0.2, 2)});
    }
  }
  Tensor feed(int i) const { return feeds[static_cast<size_t>(i)].second; }
};

}  // namespace

TEST_CASE("batchNormTrain normalises with batch statistics") {
  for (DType dtype : {f32, f64}) {
    for (const Shape& xs : shapes()) {
      SUBCASE((std::string(dtypeName(dtype)) + " " + xs.str()).c_str()) {
        BatchNormFixture f(dtype, xs);
        const BatchNormOutputs out = batchNormTrain(f.x, f.gamma, f.beta, 1e-3);
        Session s(f.g, {.threads = 2});
        const auto values = s.run({out.y, out.batchMean, out.batchVar}, f.feeds);
        const Channels x = channels(f.feed(0));
        const Stats st = referenceStats(x);
        const double tol = toleranceFor(dtype);
        CHECK_CLOSE(values[0], referenceNormalise(x, f.feed(1).toDoubles(), f.feed(2).toDoubles(), st, 1e-3), tol);
        CHECK_CLOSE(values[1], st.mean, tol);
        CHECK_CLOSE(values[2], st.var, tol);
        CHECK(values[0].shape() == xs);
        CHECK(values[1].shape() == Shape{xs[1]});
      }
    }
  }
}

TEST_CASE("batchNormTrain keeps the variance accurate under a large mean") {
  Graph g;
  auto x = g.placeholder("x", f32, {4, 1});
  auto gamma = g.constant(Tensor::full(f32, {1}, 1.0));
  auto beta = g.constant(Tensor::full(f32, {1}, 0.0));
  const BatchNormOutputs out = batchNormTrain(x, gamma, beta, 0.0);
  const Tensor xv = Tensor::fromVector<float>({1e4f + 1, 1e4f - 1, 1e4f + 1, 1e4f - 1}, {4, 1});
  const Tensor var = evaluate(g, out.batchVar, {{x, xv}});
  CHECK_CLOSE(var, std::vector<double>{1.0}, 1e-5);
}

TEST_CASE("batchNormTrain with an empty channel axis") {
  BatchNormFixture f(f32, {3, 0, 2});
  const BatchNormOutputs out = batchNormTrain(f.x, f.gamma, f.beta, 1e-5);
  Session s(f.g);
  const auto values = s.run({out.y, out.batchMean}, f.feeds);
  CHECK(values[0].numel() == 0);
  CHECK(values[1].numel() == 0);
}

TEST_CASE("batchNormTrain gradients match finite differences") {
  for (const Shape& xs : {Shape{5, 3}, Shape{2, 2, 3, 2}, Shape{3, 2, 1, 2}}) {
    SUBCASE(xs.str().c_str()) {
      BatchNormFixture f(f64, xs);
      const BatchNormOutputs out = batchNormTrain(f.x, f.gamma, f.beta, 1e-3);
      CHECK_GRADIENTS(checkGradients(f.g, out.y, {f.x, f.gamma, f.beta}, f.feeds));
    }
  }
}

TEST_CASE("batchNormTrain gradients through the batch statistics") {
  BatchNormFixture f(f64, {3, 2, 2, 2});
  const BatchNormOutputs out = batchNormTrain(f.x, f.gamma, f.beta, 1e-3);
  SUBCASE("mean only") { CHECK_GRADIENTS(checkGradients(f.g, out.batchMean, {f.x}, f.feeds)); }
  SUBCASE("variance only") { CHECK_GRADIENTS(checkGradients(f.g, out.batchVar, {f.x}, f.feeds)); }
  SUBCASE("output and variance") {
    Output loss = sum(out.y * out.y * f.x) + sum(out.batchVar * out.batchMean);
    CHECK_GRADIENTS(checkGradients(f.g, loss, {f.x, f.gamma, f.beta}, f.feeds));
  }
}

TEST_CASE("batchNormInference normalises with given statistics") {
  for (DType dtype : {f32, f64}) {
    for (const Shape& xs : shapes()) {
      SUBCASE((std::string(dtypeName(dtype)) + " " + xs.str()).c_str()) {
        BatchNormFixture f(dtype, xs, true);
        Output y = batchNormInference(f.x, f.gamma, f.beta, f.mean, f.var, 1e-2);
        const Stats st{f.feed(3).toDoubles(), f.feed(4).toDoubles()};
        const auto expected =
            referenceNormalise(channels(f.feed(0)), f.feed(1).toDoubles(), f.feed(2).toDoubles(), st, 1e-2);
        CHECK_CLOSE(evaluate(f.g, y, f.feeds, 2), expected, toleranceFor(dtype));
      }
    }
  }
}

TEST_CASE("batchNormInference gradients match finite differences") {
  for (const Shape& xs : {Shape{4, 3}, Shape{2, 2, 2, 3}}) {
    SUBCASE(xs.str().c_str()) {
      BatchNormFixture f(f64, xs, true);
      Output y = batchNormInference(f.x, f.gamma, f.beta, f.mean, f.var, 1e-2);
      CHECK_GRADIENTS(checkGradients(f.g, y, {f.x, f.gamma, f.beta, f.mean, f.var}, f.feeds));
    }
  }
}

TEST_CASE("batch norm infers shapes with unknown dimensions") {
  Graph g;
  auto x = g.placeholder("x", f32, {-1, -1, 4});
  auto gamma = g.placeholder("gamma", f32, {3});
  const BatchNormOutputs out = batchNormTrain(x, gamma, gamma, 1e-5);
  CHECK(out.y.shape() == Shape{-1, -1, 4});
  CHECK(out.batchMean.shape() == Shape{3});
  CHECK(out.batchVar.shape() == Shape{3});
}

TEST_CASE("batch norm rejects bad shapes") {
  Graph g;
  auto x = g.placeholder("x", f32, {4, 3, 2, 2});
  auto c3 = g.placeholder("c3", f32, {3});
  auto check = [](auto&& build, const char* fragment, const char* op) {
    CHECK_THROWS_WITH_AS(build(), doctest::Contains(fragment), weft::Error);
    CHECK_THROWS_WITH_AS(build(), doctest::Contains(op), weft::Error);
  };
  check([&] { batchNormTrain(x, g.placeholder("g4", f32, {4}), c3, 1e-5); },
        "has 4 values but the input has 3 channels", "BatchNormTrain");
  check([&] { batchNormTrain(x, g.placeholder("g2d", f32, {1, 3}), c3, 1e-5); }, "one value per channel",
        "BatchNormTrain");
  check([&] { batchNormTrain(x, c3, g.placeholder("b2", f32, {2}), 1e-5); }, "channels", "BatchNormTrain");
  check([&] { batchNormTrain(g.placeholder("x1", f32, {3}), c3, c3, 1e-5); }, "rank >= 2", "BatchNormTrain");
  check([&] { batchNormTrain(x, g.placeholder("g64", f64, {3}), c3, 1e-5); }, "same dtype", "BatchNormTrain");
  check([&] { batchNormTrain(x, c3, c3, -1.0); }, "epsilon", "BatchNormTrain");
  check([&] { batchNormInference(x, g.placeholder("g5", f32, {5}), c3, c3, c3, 1e-5); }, "channels",
        "BatchNormInference");
  check([&] { batchNormInference(x, c3, c3, c3, g.placeholder("v2", f32, {2}), 1e-5); }, "channels",
        "BatchNormInference");
}

TEST_CASE("batch norm from the summed moments of a split batch equals batch norm of the whole") {
  // The ops the distribution layer uses when workers share a batch: each half computes its
  // moments, the sums finish the normalisation and the gradient.
  const Shape whole{4, 3, 2, 5}, half{2, 3, 2, 5};
  const Tensor xv = randomTensor(f64, whole, 31, -2, 3), dyv = randomTensor(f64, whole, 32);
  const Tensor gv = randomTensor(f64, {3}, 33, 0.5, 1.5), bv = randomTensor(f64, {3}, 34);
  const double eps = 1e-3;
  Graph g;
  Output x = g.placeholder("x", f64, whole), dy = g.placeholder("dy", f64, whole);
  Output parts[2][2];  // [half][x, dy]
  for (int h = 0; h < 2; ++h) {
    parts[h][0] = g.placeholder(std::string("x") + std::to_string(h), f64, half);
    parts[h][1] = g.placeholder(std::string("dy") + std::to_string(h), f64, half);
  }
  Output gamma = g.constant(gv), beta = g.constant(bv);
  const BatchNormOutputs reference = batchNormTrain(x, gamma, beta, eps);
  const std::vector<Grad> referenceGrads = gradients(sum(reference.y * dy), {x, gamma, beta});

  const Output total = batchNormMoments(parts[0][0]) + batchNormMoments(parts[1][0]);
  std::vector<Node*> forward, local;
  for (int h = 0; h < 2; ++h) {
    forward.push_back(g.addNode("BatchNormFromMoments", {parts[h][0], gamma, beta, total}, {{"epsilon", eps}}));
    local.push_back(g.addNode("BatchNormGradMoments",
                              {parts[h][1], parts[h][0], forward[h]->output(1), forward[h]->output(3)}));
  }
  const Output gradTotal = local[0]->output(0) + local[1]->output(0);
  std::vector<Node*> backward;
  for (int h = 0; h < 2; ++h) {
    backward.push_back(g.addNode("BatchNormGradFromMoments",
                                 {parts[h][1], parts[h][0], gamma, forward[h]->output(1), forward[h]->output(3),
                                  local[h]->output(0), gradTotal, total}));
  }

  // The halves are the first and second two images of x and dy.
  auto halfOf = [&](const Tensor& t, int h) {
    const std::vector<double> v = t.toDoubles();
    const size_t n = v.size() / 2;
    return Tensor::fromVector<double>({v.begin() + h * n, v.begin() + (h + 1) * n}, half);
  };
  FeedMap feeds{{x, xv}, {dy, dyv}};
  for (int h = 0; h < 2; ++h) {
    feeds.emplace_back(parts[h][0], halfOf(xv, h));
    feeds.emplace_back(parts[h][1], halfOf(dyv, h));
  }
  Session s(g);
  const auto ref = s.run({reference.y, reference.batchMean, reference.batchVar, referenceGrads[0].dense,
                          referenceGrads[1].dense, referenceGrads[2].dense},
                         feeds);
  std::vector<double> gammaGrad(3, 0.0), betaGrad(3, 0.0);
  for (int h = 0; h < 2; ++h) {
    CAPTURE(h);
    const auto got = s.run({forward[h]->output(0), forward[h]->output(1), forward[h]->output(2), backward[h]->output(0),
                            backward[h]->output(1), backward[h]->output(2)},
                           feeds);
    CHECK_CLOSE(got[0], halfOf(ref[0], h).toDoubles(), 1e-12);
    CHECK_CLOSE(got[1], ref[1].toDoubles(), 1e-12);
    CHECK_CLOSE(got[2], ref[2].toDoubles(), 1e-12);
    CHECK_CLOSE(got[3], halfOf(ref[3], h).toDoubles(), 1e-10);
    for (size_t k = 0; k < 3; ++k) {
      gammaGrad[k] += got[4].toDoubles()[k];
      betaGrad[k] += got[5].toDoubles()[k];
    }
  }
  // Each half's gamma and beta gradients are its part: they add up to the whole's.
  CHECK_CLOSE(ref[4], gammaGrad, 1e-10);
  CHECK_CLOSE(ref[5], betaGrad, 1e-10);
}
