// Tests of conv2d, maxPool2d, avgPool2d and globalAvgPool: forward against naive double loops,
// gradients against finite differences, shape errors.
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "ops/Ops.h"

#include <algorithm>
#include <cmath>
#include <limits>

using namespace weft;
using weft::testing::evaluate;
using weft::testing::randomTensor;
using weft::testing::toleranceFor;

namespace {

/// Reads element (a, b, c, d) of an NCHW tensor held as doubles.
struct Nchw {
  std::vector<double> v;
  Shape s;
  double operator()(int64_t a, int64_t b, int64_t c, int64_t d) const {
    return v[static_cast<size_t>(((a * s[1] + b) * s[2] + c) * s[3] + d)];
  }
};
Nchw nchw(const Tensor& t) { return {t.toDoubles(), t.shape()}; }

std::vector<double> referenceConv(const Tensor& xt, const Tensor& ft, const Conv2dOptions& o) {
  const Nchw x = nchw(xt), f = nchw(ft);
  const int64_t n = x.s[0], c = x.s[1], h = x.s[2], w = x.s[3], oc = f.s[0], kh = f.s[2], kw = f.s[3];
  const int64_t oh = (h + 2 * o.padding[0] - o.dilation[0] * (kh - 1) - 1) / o.stride[0] + 1;
  const int64_t ow = (w + 2 * o.padding[1] - o.dilation[1] * (kw - 1) - 1) / o.stride[1] + 1;
  std::vector<double> out;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t q = 0; q < oc; ++q)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          double acc = 0;
          for (int64_t ch = 0; ch < c; ++ch)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t iy = oy * o.stride[0] - o.padding[0] + i * o.dilation[0];
                const int64_t ix = ox * o.stride[1] - o.padding[1] + j * o.dilation[1];
                if (iy >= 0 && iy < h && ix >= 0 && ix < w) acc += x(b, ch, iy, ix) * f(q, ch, i, j);
              }
          out.push_back(acc);
        }
  return out;
}

enum class Pool { Max, Avg };

std::vector<double> referencePool(const Tensor& xt, Pool kind, std::vector<int64_t> k, std::vector<int64_t> s,
                                  std::vector<int64_t> p) {
  const Nchw x = nchw(xt);
  const int64_t h = x.s[2], w = x.s[3];
  const int64_t oh = (h + 2 * p[0] - k[0]) / s[0] + 1, ow = (w + 2 * p[1] - k[1]) / s[1] + 1;
  std::vector<double> out;
  for (int64_t b = 0; b < x.s[0]; ++b)
    for (int64_t ch = 0; ch < x.s[1]; ++ch)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          double best = -std::numeric_limits<double>::infinity(), total = 0;
          int count = 0;
          for (int64_t i = 0; i < k[0]; ++i)
            for (int64_t j = 0; j < k[1]; ++j) {
              const int64_t iy = oy * s[0] - p[0] + i, ix = ox * s[1] - p[1] + j;
              if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
              best = std::max(best, x(b, ch, iy, ix));
              total += x(b, ch, iy, ix);
              ++count;
            }
          out.push_back(kind == Pool::Max ? best : total / count);
        }
  return out;
}

struct ConvCase {
  Shape x, filter;
  Conv2dOptions options;
};

void checkConvForward(DType dtype, const ConvCase& cc, int threads = 1) {
  Graph g;
  auto x = g.placeholder("x", dtype, cc.x);
  auto f = g.placeholder("f", dtype, cc.filter);
  auto y = conv2d(x, f, cc.options);
  const Tensor xv = randomTensor(dtype, cc.x, 1), fv = randomTensor(dtype, cc.filter, 2);
  const Tensor out = evaluate(g, y, {{x, xv}, {f, fv}}, threads);
  CHECK(out.shape() == y.shape());
  CHECK_CLOSE(out, referenceConv(xv, fv, cc.options), toleranceFor(dtype));
}

const std::vector<ConvCase>& convCases() {
  static const std::vector<ConvCase> cases{
      {{2, 3, 5, 6}, {4, 3, 3, 3}, {}},
      {{2, 2, 7, 6}, {3, 2, 3, 2}, {{2, 1}, {1, 2}, {1, 1}}},
      {{1, 2, 7, 7}, {2, 2, 3, 3}, {{1, 2}, {2, 1}, {2, 3}}},
      {{3, 4, 4, 5}, {5, 4, 1, 1}, {}},              // pointwise: no im2col
      {{2, 3, 4, 4}, {2, 3, 1, 1}, {{2, 2}, {0, 0}, {1, 1}}},  // strided 1x1
      {{1, 1, 1, 1}, {1, 1, 1, 1}, {}},
      {{1, 1, 1, 1}, {2, 1, 3, 3}, {{1, 1}, {1, 1}, {1, 1}}},  // all taps but the centre are padding
      // Direct 3x3 kernels: 11 filters are channel blocks of 8, 2 and 1; 37 columns span tiles.
      {{2, 7, 9, 37}, {11, 7, 3, 3}, {{1, 1}, {1, 1}, {1, 1}}},
      {{1, 3, 6, 5}, {19, 3, 3, 3}, {{1, 1}, {2, 0}, {1, 1}}},  // uneven padding, 2 and 0
      {{2, 5, 9, 10}, {11, 5, 3, 3}, {{2, 2}, {1, 1}, {1, 1}}},  // stride 2: odd and even sizes
      {{1, 2, 8, 7}, {3, 2, 3, 3}, {{2, 2}, {0, 2}, {1, 1}}},
      // Winograd (float, channels in 16s): output sizes that are not multiples of 4 end in partial
      // tiles; 32 and 64 filters take the wider product tiles; a batch of 8x8 planes fills a group
      // of 8 images and a rest.
      {{2, 16, 9, 7}, {32, 16, 3, 3}, {{1, 1}, {1, 1}, {1, 1}}},
      {{3, 32, 6, 6}, {64, 32, 3, 3}, {{1, 1}, {0, 2}, {1, 1}}},
      {{1, 16, 5, 4}, {16, 16, 3, 3}, {{1, 1}, {2, 1}, {1, 1}}},
      {{10, 16, 8, 8}, {16, 16, 3, 3}, {{1, 1}, {1, 1}, {1, 1}}},
      {{2, 64, 17, 19}, {64, 64, 3, 3}, {{1, 1}, {1, 1}, {1, 1}}},  // 2 x 25 tiles: bands of 32 and 18
  };
  return cases;
}

Conv2dOptions options(std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> dilation) {
  return {std::move(stride), std::move(padding), std::move(dilation)};
}

}  // namespace

TEST_CASE("conv2d matches a direct convolution") {
  for (DType dtype : {f32, f64}) {
    SUBCASE(dtypeName(dtype)) {
      for (const ConvCase& cc : convCases()) checkConvForward(dtype, cc);
    }
  }
}

TEST_CASE("conv2d splits images across threads") {
  checkConvForward(f32, {{5, 3, 6, 6}, {4, 3, 3, 3}, options({1, 1}, {1, 1}, {1, 1})}, 3);
}

TEST_CASE("conv2d gradients across threads match one thread") {
  Graph g;
  auto x = g.placeholder("x", f64, {5, 2, 5, 5});
  auto f = g.placeholder("f", f64, {3, 2, 3, 3});
  auto y = conv2d(x, f, options({2, 1}, {1, 1}, {1, 1}));
  const auto grads = gradients(sum(y * y), {x, f});
  const FeedMap feeds{{x, randomTensor(f64, {5, 2, 5, 5}, 3)}, {f, randomTensor(f64, {3, 2, 3, 3}, 4)}};
  for (const Grad& grad : grads) {
    const Tensor one = evaluate(g, grad.dense, feeds, 1), many = evaluate(g, grad.dense, feeds, 3);
    CHECK_CLOSE(many, one.toDoubles(), 1e-12);
  }
}

TEST_CASE("conv2d with empty dimensions") {
  SUBCASE("no images") {
    checkConvForward(f32, {{0, 2, 4, 4}, {3, 2, 3, 3}, {}});
  }
  SUBCASE("no input channels gives zeros") {
    checkConvForward(f64, {{2, 0, 4, 4}, {3, 0, 3, 3}, {}});
  }
  SUBCASE("no filters") {
    checkConvForward(f64, {{2, 2, 4, 4}, {0, 2, 3, 3}, {}});
  }
  SUBCASE("gradients with no input channels") {
    Graph g;
    auto x = g.placeholder("x", f64, {2, 0, 3, 3});
    auto f = g.placeholder("f", f64, {2, 0, 2, 2});
    const auto grads = gradients(sum(conv2d(x, f)), {x, f});
    const FeedMap feeds{{x, Tensor::zeros(f64, {2, 0, 3, 3})}, {f, Tensor::zeros(f64, {2, 0, 2, 2})}};
    CHECK(evaluate(g, grads[0].dense, feeds).numel() == 0);
    CHECK(evaluate(g, grads[1].dense, feeds).numel() == 0);
  }
}

TEST_CASE("conv2d gradients match finite differences") {
  const std::vector<ConvCase> cases{
      {{2, 2, 4, 4}, {2, 2, 3, 3}, {}},
      {{1, 2, 5, 4}, {2, 2, 2, 3}, options({2, 1}, {1, 1}, {1, 1})},
      {{1, 1, 6, 6}, {2, 1, 2, 2}, options({1, 2}, {1, 0}, {2, 2})},
      {{2, 3, 3, 3}, {2, 3, 1, 1}, {}},
      // Direct 3x3 kernels: 19 filters are more than one vector of output channels.
      {{2, 4, 5, 7}, {19, 4, 3, 3}, options({1, 1}, {1, 2}, {1, 1})},
      {{2, 3, 7, 8}, {17, 3, 3, 3}, options({2, 2}, {1, 0}, {1, 1})},  // direct at stride 2
      {{1, 2, 6, 5}, {3, 2, 3, 3}, options({2, 2}, {2, 1}, {1, 1})},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SUBCASE(("case " + std::to_string(i)).c_str()) {
      const ConvCase& cc = cases[i];
      Graph g;
      auto x = g.placeholder("x", f64, cc.x);
      auto f = g.placeholder("f", f64, cc.filter);
      auto y = conv2d(x, f, cc.options);
      const FeedMap feeds{{x, randomTensor(f64, cc.x, 5)}, {f, randomTensor(f64, cc.filter, 6)}};
      CHECK_GRADIENTS(checkGradients(g, y, {x, f}, feeds));
    }
  }
}

TEST_CASE("conv2d infers shapes with unknown dimensions") {
  Graph g;
  auto x = g.placeholder("x", f32, {-1, 3, -1, 9});
  auto f = g.placeholder("f", f32, {8, 3, 3, 3});
  auto y = conv2d(x, f, options({2, 2}, {1, 1}, {1, 1}));
  CHECK(y.shape() == Shape{-1, 8, -1, 5});
}

TEST_CASE("conv2d rejects bad shapes and options") {
  Graph g;
  auto x = g.placeholder("x", f32, {2, 3, 5, 5});
  auto f = g.placeholder("f", f32, {4, 3, 3, 3});
  auto check = [](auto&& build, const char* fragment) {
    CHECK_THROWS_WITH_AS(build(), doctest::Contains(fragment), weft::Error);
    CHECK_THROWS_WITH_AS(build(), doctest::Contains("Conv2D"), weft::Error);
  };
  check([&] { conv2d(x, g.placeholder("f2", f32, {4, 2, 3, 3})); }, "channels");
  check([&] { conv2d(x, g.placeholder("f3", f32, {4, 3, 7, 3})); }, "larger than the padded input");
  check([&] { conv2d(x, f, options({1, 1}, {0, 0}, {3, 1})); }, "larger than the padded input");
  check([&] { conv2d(x, f, options({0, 1}, {0, 0}, {1, 1})); }, "strides must be >= 1");
  check([&] { conv2d(x, f, options({1, 1}, {0, 0}, {1, -1})); }, "dilation must be >= 1");
  check([&] { conv2d(x, f, options({1, 1}, {-1, 0}, {1, 1})); }, "padding must be >= 0");
  check([&] { conv2d(x, f, options({1}, {0, 0}, {1, 1})); }, "needs 2 values");
  check([&] { conv2d(g.placeholder("x3", f32, {3, 5, 5}), f); }, "rank 4");
  check([&] { conv2d(x, g.placeholder("f4", f32, {3, 3, 3})); }, "rank 4");
  check([&] { conv2d(x, g.placeholder("f5", f64, {4, 3, 3, 3})); }, "same dtype");
}

// ---- pooling -------------------------------------------------------------------------------

namespace {

struct PoolCase {
  Shape x;
  std::vector<int64_t> k, s, p;
};

const std::vector<PoolCase>& poolCases() {
  static const std::vector<PoolCase> cases{
      {{2, 3, 4, 4}, {2, 2}, {2, 2}, {0, 0}},
      {{1, 2, 5, 6}, {3, 3}, {2, 2}, {1, 1}},
      {{2, 1, 5, 4}, {3, 2}, {1, 2}, {2, 1}},
      {{1, 1, 1, 1}, {1, 1}, {1, 1}, {0, 0}},
      {{1, 2, 3, 3}, {3, 3}, {1, 1}, {0, 0}},
      {{0, 2, 4, 4}, {2, 2}, {2, 2}, {0, 0}},
  };
  return cases;
}

Output pool(Pool kind, Output x, const PoolCase& pc) {
  return kind == Pool::Max ? maxPool2d(x, pc.k, pc.s, pc.p) : avgPool2d(x, pc.k, pc.s, pc.p);
}

}  // namespace

TEST_CASE("pooling matches direct loops") {
  for (Pool kind : {Pool::Max, Pool::Avg}) {
    for (DType dtype : {f32, f64}) {
      SUBCASE((std::string(kind == Pool::Max ? "max " : "avg ") + dtypeName(dtype)).c_str()) {
        for (const PoolCase& pc : poolCases()) {
          Graph g;
          auto x = g.placeholder("x", dtype, pc.x);
          auto y = pool(kind, x, pc);
          const Tensor xv = randomTensor(dtype, pc.x, 11);
          const Tensor out = evaluate(g, y, {{x, xv}}, 2);
          CHECK(out.shape() == y.shape());
          CHECK_CLOSE(out, referencePool(xv, kind, pc.k, pc.s, pc.p), toleranceFor(dtype));
        }
      }
    }
  }
}

TEST_CASE("max pooling never picks padding") {
  Graph g;
  auto x = g.placeholder("x", f32, {1, 1, 2, 2});
  const Tensor out = evaluate(g, maxPool2d(x, {2, 2}, {1, 1}, {1, 1}),
                              {{x, Tensor::fromVector<float>({-4, -3, -2, -1}, {1, 1, 2, 2})}});
  CHECK_CLOSE(out, (std::vector<double>{-4, -3, -3, -2, -1, -1, -2, -1, -1}), 0.0);
}

TEST_CASE("average pooling counts only in-bounds elements") {
  Graph g;
  auto x = g.placeholder("x", f64, {1, 1, 2, 2});
  const Tensor out = evaluate(g, avgPool2d(x, {2, 2}, {2, 2}, {1, 1}),
                              {{x, Tensor::fromVector<double>({1, 2, 3, 4}, {1, 1, 2, 2})}});
  CHECK_CLOSE(out, (std::vector<double>{1, 2, 3, 4}), 0.0);
}

TEST_CASE("pooling gradients match finite differences") {
  const std::vector<PoolCase> cases{
      {{1, 2, 4, 4}, {2, 2}, {2, 2}, {0, 0}},
      {{2, 1, 5, 4}, {3, 2}, {2, 1}, {1, 1}},
      {{1, 1, 3, 3}, {2, 2}, {1, 1}, {1, 1}},  // overlapping windows
  };
  for (Pool kind : {Pool::Max, Pool::Avg}) {
    for (size_t i = 0; i < cases.size(); ++i) {
      SUBCASE((std::string(kind == Pool::Max ? "max " : "avg ") + std::to_string(i)).c_str()) {
        Graph g;
        auto x = g.placeholder("x", f64, cases[i].x);
        auto y = pool(kind, x, cases[i]);
        CHECK_GRADIENTS(checkGradients(g, y, {x}, {{x, randomTensor(f64, cases[i].x, 12)}}));
      }
    }
  }
}

TEST_CASE("max pooling sends the gradient of a tie to the first maximum") {
  Graph g;
  auto x = g.placeholder("x", f64, {1, 1, 2, 3});
  auto y = maxPool2d(x, {2, 2}, {1, 1});  // windows: columns {0, 1} and {1, 2}
  const auto grads = gradients(sum(y), {x});
  const Tensor dx = evaluate(g, grads[0].dense, {{x, Tensor::fromVector<double>({1, 5, 5, 0, 5, 2}, {1, 1, 2, 3})}});
  CHECK_CLOSE(dx, (std::vector<double>{0, 2, 0, 0, 0, 0}), 0.0);
}

TEST_CASE("pooling rejects bad shapes and options") {
  Graph g;
  auto x = g.placeholder("x", f32, {1, 2, 4, 4});
  auto check = [](auto&& build, const char* fragment, const char* op) {
    CHECK_THROWS_WITH_AS(build(), doctest::Contains(fragment), weft::Error);
    CHECK_THROWS_WITH_AS(build(), doctest::Contains(op), weft::Error);
  };
  check([&] { maxPool2d(x, {5, 2}, {1, 1}); }, "larger than the padded input", "MaxPool2D");
  check([&] { avgPool2d(x, {2, 2}, {0, 1}); }, "strides must be >= 1", "AvgPool2D");
  check([&] { maxPool2d(x, {0, 2}, {1, 1}); }, "kernel must be >= 1", "MaxPool2D");
  check([&] { avgPool2d(x, {2, 2}, {1, 1}, {2, 0}); }, "smaller than the kernel", "AvgPool2D");
  check([&] { maxPool2d(x, {2, 2, 2}, {1, 1}); }, "needs 2 values", "MaxPool2D");
  check([&] { maxPool2d(g.placeholder("x3", f32, {2, 4, 4}), {2, 2}, {1, 1}); }, "rank 4", "MaxPool2D");
  check([&] { avgPool2d(g.placeholder("xi", i32, {1, 1, 4, 4}), {2, 2}, {1, 1}); }, "floating point", "AvgPool2D");
}

TEST_CASE("globalAvgPool averages each plane") {
  for (DType dtype : {f32, f64}) {
    SUBCASE(dtypeName(dtype)) {
      Graph g;
      auto x = g.placeholder("x", dtype, {2, 3, 4, 5});
      auto y = globalAvgPool(x);
      CHECK(y.shape() == Shape{2, 3});
      const Tensor xv = randomTensor(dtype, {2, 3, 4, 5}, 13);
      const Nchw xs = nchw(xv);
      std::vector<double> expected;
      for (int64_t n = 0; n < 2; ++n)
        for (int64_t c = 0; c < 3; ++c) {
          double total = 0;
          for (int64_t i = 0; i < 4; ++i)
            for (int64_t j = 0; j < 5; ++j) total += xs(n, c, i, j);
          expected.push_back(total / 20);
        }
      CHECK_CLOSE(evaluate(g, y, {{x, xv}}), expected, toleranceFor(dtype));
    }
  }
  SUBCASE("gradient") {
    Graph g;
    auto x = g.placeholder("x", f64, {2, 2, 2, 3});
    CHECK_GRADIENTS(checkGradients(g, globalAvgPool(x), {x}, {{x, randomTensor(f64, {2, 2, 2, 3}, 14)}}));
  }
  SUBCASE("rank error") {
    Graph g;
    CHECK_THROWS_WITH_AS(globalAvgPool(g.placeholder("x", f32, {2, 3, 4})), doctest::Contains("globalAvgPool"),
                         weft::Error);
  }
}

TEST_CASE("convolution gradients do not depend on the thread count") {
  struct Case {
    const char* name;
    std::vector<int64_t> stride;
    int64_t channels;
  };
  for (const Case& c : {Case{"im2col", {2, 1}, 3}, Case{"direct 3x3", {1, 1}, 3},
                        Case{"direct 3x3, stride 2", {2, 2}, 3}, Case{"Winograd", {1, 1}, 16}}) {
    SUBCASE(c.name) {
      const Shape xs{12, c.channels, 9, 9}, fs{16, c.channels, 3, 3};
      Graph g;
      Output x = g.placeholder("x", f32, xs);
      Output f = g.placeholder("f", f32, fs);
      Output y = conv2d(x, f, options(c.stride, {1, 1}, {1, 1}));
      const std::vector<Grad> grads = gradients(sum(y * y), {x, f});
      const FeedMap feeds{{x, randomTensor(f32, xs, 1)}, {f, randomTensor(f32, fs, 2)}};
      Session one(g, {1, false}), two(g, {2, false});
      const auto a = one.run({grads[0].dense, grads[1].dense}, feeds);
      const auto b = two.run({grads[0].dense, grads[1].dense}, feeds);
      CHECK(a[0].toDoubles() == b[0].toDoubles());
      CHECK(a[1].toDoubles() == b[1].toDoubles());
    }
  }
}

TEST_CASE("conv2d float gradients match the double computation") {
  // The direct kernels transpose float gradients in 16 x 16 register blocks: 19 filters and 63
  // positions per plane leave both a full block and ragged edges. Float convolutions with
  // channels in 16s run on the Winograd kernels, double ones on the direct kernels.
  // The Winograd cases: 25 images of 6 tiles run in groups of 8 (the last image alone), each
  // group in bands of 32 and 16 tiles that cross images, with padding (0, 2), which the input
  // gradient sweeps with (2, 0); two images of 25 tiles in bands of 32 and 18; uneven padding with
  // partial tiles.
  struct Case {
    const char* name;
    Shape x, filter;
    std::vector<int64_t> stride, padding;
  };
  for (const Case& c : {Case{"stride 1", {3, 5, 9, 7}, {19, 5, 3, 3}, {1, 1}, {1, 1}},
                        Case{"stride 2", {3, 5, 9, 7}, {19, 5, 3, 3}, {2, 2}, {1, 1}},
                        Case{"Winograd", {3, 16, 9, 7}, {32, 16, 3, 3}, {1, 1}, {1, 1}},
                        Case{"Winograd, groups and bands", {25, 64, 9, 7}, {64, 64, 3, 3}, {1, 1}, {0, 2}},
                        Case{"Winograd, bands", {2, 64, 17, 19}, {64, 64, 3, 3}, {1, 1}, {1, 1}},
                        Case{"Winograd, uneven padding", {2, 16, 6, 5}, {16, 16, 3, 3}, {1, 1}, {2, 0}}}) {
    SUBCASE(c.name) {
      const Tensor x64 = randomTensor(f64, c.x, 21), f64v = randomTensor(f64, c.filter, 22);
      std::vector<std::vector<double>> results;
      for (DType dtype : {f32, f64}) {
        Graph g;
        Output x = g.placeholder("x", dtype, c.x), f = g.placeholder("f", dtype, c.filter);
        Output y = conv2d(x, f, options(c.stride, c.padding, {1, 1}));
        const std::vector<Grad> grads = gradients(sum(y * y), {x, f});
        const FeedMap feeds{{x, x64.cast(dtype)}, {f, f64v.cast(dtype)}};
        for (const Grad& grad : grads) results.push_back(evaluate(g, grad.dense, feeds, 2).toDoubles());
      }
      // A float sum of hundreds of terms errs relative to its terms, not to a total that cancels
      // to near zero: each value is held within 1e-5 of the largest of its gradient.
      for (size_t i = 0; i < 2; ++i) {
        const std::vector<double>&actual = results[i], &expected = results[i + 2];
        REQUIRE(actual.size() == expected.size());
        double scale = 0;
        for (double e : expected) scale = std::max(scale, std::fabs(e));
        for (size_t k = 0; k < actual.size(); ++k) CHECK(std::fabs(actual[k] - expected[k]) <= 1e-5 * scale);
      }
    }
  }
}
