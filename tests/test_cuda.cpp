// The CUDA backend against the CPU: every op with a CUDA kernel gives the CPU's values on random
// inputs (within a tolerance by dtype), gradients pass finite-difference checks on the GPU, data
// errors found by kernels name their op, the caching allocator stops reaching the device after
// the first step, a training step on the GPU matches the same step on the CPU, and mixed
// precision (16-bit casts, products, convolutions, loss scaling) follows the CPU.
// These need a GPU: without one the binary reports why and exits as skipped (see gpu_main.cpp).
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "core/Trace.h"
#include "data/Dataset.h"
#include "dist/amp/AmpRuntime.h"
#include "models/AmpModels.h"
#include "models/ResNet.h"
#include "models/ZooModel.h"
#include "nn/Layers.h"
#include "ops/Ops.h"
#include "optim/Optimizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <utility>

using namespace weft;
using testing::randomInts;
using testing::randomTensor;

namespace {

using testing::Computation;
using Build = std::function<Computation(Graph&)>;

/// Builds the computation twice, on the CPU and on cuda:0, runs both and compares each output.
void checkParity(const Build& build, double tol) { CHECK(testing::compareDevices(build, "cuda:0", tol) == ""); }

/// A placeholder fed with seeded random values.
Output input(Graph& g, FeedMap& feeds, const std::string& name, DType dtype, const Shape& shape, uint64_t seed,
             double lo = -1, double hi = 1) {
  Output x = g.placeholder(name, dtype, shape);
  feeds.emplace_back(x, isFloating(dtype)
                            ? randomTensor(dtype, shape, seed, lo, hi)
                            : randomInts(dtype, shape, static_cast<int64_t>(lo), static_cast<int64_t>(hi), seed));
  return x;
}

double tolFor(DType dt) { return isFloating(dt) ? testing::toleranceFor(dt) : 0; }

/// A classifier's training step, as a builder makes it.
struct Classifier {
  Output x, labels, loss;
  Node* step = nullptr;
};

/// A classifier built twice, on the CPU and on cuda:0, trained side by side on the same batches.
struct SideBySide {
  Graph onCpu, onGpu;
  Classifier cpuModel, gpuModel;
  std::unique_ptr<Session> cpuSession, gpuSession;

  explicit SideBySide(const std::function<Classifier(Graph&)>& build) : cpuModel(build(onCpu)) {
    {
      auto placed = onGpu.onDevice("cuda:0");
      gpuModel = build(onGpu);
    }
    cpuSession = std::make_unique<Session>(onCpu);
    gpuSession = std::make_unique<Session>(onGpu);
  }
  /// One training step on each device; returns the (CPU, GPU) losses.
  std::pair<double, double> step(const Tensor& x, const Tensor& labels) {
    auto run = [&](Session& s, const Classifier& m) {
      return s.run({m.loss}, {{m.x, x}, {m.labels, labels}}, {m.step})[0].item();
    };
    return {run(*cpuSession, cpuModel), run(*gpuSession, gpuModel)};
  }
};

}  // namespace

TEST_CASE("binary ops match the CPU, with and without broadcasting") {
  using BinaryOp = Output (*)(Output, Output);
  const std::vector<std::pair<const char*, BinaryOp>> ops{
      {"add", add}, {"sub", sub}, {"mul", mul}, {"div", div}, {"maximum", maximum}, {"minimum", minimum},
      {"pow", pow}, {"less", less}, {"lessEqual", lessEqual}, {"greater", greater},
      {"greaterEqual", greaterEqual}, {"equal", equal}, {"notEqual", notEqual}};
  const std::vector<std::pair<Shape, Shape>> shapes{
      {{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{2, 1, 4}, {3, 1}}, {{5}, {}}, {{}, {2, 3}}, {{1, 70, 33}, {70, 1}}};
  for (DType dt : {f32, f64}) {
    for (const auto& [name, op] : ops) {
      for (const auto& [sa, sb] : shapes) {
        CAPTURE(name);
        CAPTURE(dtypeName(dt));
        CAPTURE(sa.str());
        CAPTURE(sb.str());
        const bool positive = std::string(name) == "pow" || std::string(name) == "div";
        checkParity([&, op = op](Graph& g) {
          Computation c;
          Output a = input(g, c.feeds, "a", dt, sa, 1, positive ? 0.5 : -2, 2);
          Output b = input(g, c.feeds, "b", dt, sb, 2, positive ? 0.5 : -2, 2);
          c.outputs = {op(a, b)};
          return c;
        }, tolFor(dt));
      }
    }
  }
}

TEST_CASE("integer arithmetic matches the CPU exactly") {
  for (DType dt : {i32, i64}) {
    CAPTURE(dtypeName(dt));
    checkParity([&](Graph& g) {
      Computation c;
      Output a = input(g, c.feeds, "a", dt, {6, 5}, 3, -50, 50);
      Output b = input(g, c.feeds, "b", dt, {5}, 4, 1, 9);
      c.outputs = {a + b, a - b, a * b, a / b, maximum(a, b), equal(a, b)};
      return c;
    }, 0);
  }
}

TEST_CASE("unary ops match the CPU") {
  using UnaryOp = Output (*)(Output);
  const std::vector<std::pair<const char*, UnaryOp>> ops{
      {"neg", neg}, {"exp", exp}, {"tanh", tanh}, {"sigmoid", sigmoid}, {"relu", relu}, {"abs", abs},
      {"square", square}, {"sign", sign}, {"sin", sin}, {"cos", cos}};
  const std::vector<std::pair<const char*, UnaryOp>> positiveOps{
      {"log", log}, {"sqrt", sqrt}, {"rsqrt", rsqrt}, {"reciprocal", reciprocal}};
  for (DType dt : {f32, f64}) {
    for (const auto& [name, op] : ops) {
      CAPTURE(name);
      checkParity([&, op = op](Graph& g) {
        Computation c;
        c.outputs = {op(input(g, c.feeds, "x", dt, {7, 300}, 5, -3, 3))};
        return c;
      }, tolFor(dt));
    }
    for (const auto& [name, op] : positiveOps) {
      CAPTURE(name);
      checkParity([&, op = op](Graph& g) {
        Computation c;
        c.outputs = {op(input(g, c.feeds, "x", dt, {7, 300}, 6, 0.1, 4))};
        return c;
      }, tolFor(dt));
    }
  }
}

TEST_CASE("where, cast, addN, fills and copies match the CPU") {
  checkParity([](Graph& g) {
    Computation c;
    Output x = input(g, c.feeds, "x", f32, {4, 6}, 7);
    Output y = input(g, c.feeds, "y", f32, {6}, 8);
    Output k = input(g, c.feeds, "k", i64, {4, 6}, 9, -5, 5);
    c.outputs = {where(greater(x, y), x, y),  cast(x, f64),       cast(k, f32), cast(x * 10.0, i32),
                 addN({x, x * 2.0, x + 1.0}), zerosLike(x),       onesLike(k),  identity(x),
                 reshape(x, {3, 8}),          broadcastLike(y, x)};
    return c;
  }, 1e-6);
}

TEST_CASE("reductions match the CPU over every axis pattern") {
  const std::vector<std::vector<int64_t>> axesList{{}, {0}, {1}, {2}, {-1}, {0, 2}, {0, 1}, {1, 2}};
  for (DType dt : {f32, f64, i64}) {
    for (const auto& axes : axesList) {
      for (bool keep : {false, true}) {
        CAPTURE(dtypeName(dt));
        CAPTURE(axes.size());
        CAPTURE(keep);
        checkParity([&](Graph& g) {
          Computation c;
          Output x = input(g, c.feeds, "x", dt, {3, 40, 5}, 10, -9, 9);
          c.outputs = {sum(x, axes, keep), max(x, axes, keep)};
          if (isFloating(dt)) c.outputs.push_back(mean(x, axes, keep));
          return c;
        }, tolFor(dt) * 10);
      }
    }
  }
}

TEST_CASE("a reduction over a million elements matches the CPU") {
  checkParity([](Graph& g) {
    Computation c;
    Output x = input(g, c.feeds, "x", f64, {1000, 1000}, 11);
    c.outputs = {sum(x), sum(x, {0}), mean(x, {1}), max(x)};
    return c;
  }, 1e-9);
}

TEST_CASE("argmax matches the CPU on every axis") {
  for (int64_t axis : {0, 1, -1}) {
    CAPTURE(axis);
    checkParity([&](Graph& g) {
      Computation c;
      c.outputs = {argmax(input(g, c.feeds, "x", f32, {6, 33, 4}, 12), axis)};
      return c;
    }, 0);
  }
}

TEST_CASE("matrix products match the CPU for every transpose and in batches") {
  // 16-bit products accumulate in f32 and round once; the CPU rounds its f32 product the same
  // way, so they differ by summation order within one rounding of the result.
  for (DType dt : {f32, f64, bf16, f16}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        CAPTURE(dtypeName(dt));
        CAPTURE(ta);
        CAPTURE(tb);
        checkParity([&](Graph& g) {
          Computation c;
          auto in = [&](const std::string& name, const Shape& shape, uint64_t seed) {
            return isHalfPrecision(dt) ? cast(input(g, c.feeds, name, f32, shape, seed), dt)
                                       : input(g, c.feeds, name, dt, shape, seed);
          };
          const int64_t m = 37, k = 19, n = 45;
          Output a = in("a", ta ? Shape{k, m} : Shape{m, k}, 13);
          Output b = in("b", tb ? Shape{n, k} : Shape{k, n}, 14);
          Output ba = in("ba", ta ? Shape{3, k, m} : Shape{3, m, k}, 15);
          Output bb = in("bb", tb ? Shape{3, n, k} : Shape{3, k, n}, 16);
          c.outputs = {matmul(a, b, ta, tb), batchMatmul(ba, bb, ta, tb)};
          return c;
        }, dt == bf16 ? 1.0 / 128 : dt == f16 ? 1.0 / 512 : tolFor(dt));
      }
    }
  }
}

TEST_CASE("softmax, log-softmax and sparse cross-entropy match the CPU") {
  for (int64_t width : {1, 7, 1000, 5000}) {
    CAPTURE(width);
    checkParity([&](Graph& g) {
      Computation c;
      Output x = input(g, c.feeds, "x", f32, {9, width}, 17, -5, 5);
      Output ids = g.placeholder("ids", i64, {9});
      std::vector<int64_t> labels;
      for (int64_t i = 0; i < 9; ++i) labels.push_back(i == 4 ? -100 : (i * 31) % width);
      c.feeds.emplace_back(ids, Tensor::fromVector<int64_t>(labels, {9}));
      Output loss = sparseSoftmaxCrossEntropy(x, ids, -100);
      c.outputs = {softmax(x), logSoftmax(x), loss, gradients(sum(loss * loss), {x})[0].dense};
      return c;
    }, 1e-5);
  }
}

TEST_CASE("the sampled softmax's cross-entropy and its gradients match the CPU") {
  for (int64_t samples : {1, 7, 1000}) {
    CAPTURE(samples);
    checkParity([&](Graph& g) {
      Computation c;
      Output t = input(g, c.feeds, "t", f32, {9}, 21, -5, 5);
      Output s = input(g, c.feeds, "s", f32, {9, samples}, 22, -5, 5);
      Output loss = sampledSoftmaxCrossEntropy(t, s);
      const auto grads = gradients(sum(loss * loss), {t, s});
      c.outputs = {loss, grads[0].dense, grads[1].dense};
      return c;
    }, 1e-5);
  }
}

TEST_CASE("penalizeMatches matches the CPU, in place and over a live input") {
  for (DType idType : {i32, i64}) {
    CAPTURE(dtypeName(idType));
    checkParity([&](Graph& g) {
      Computation c;
      Output x = input(g, c.feeds, "x", f32, {40, 300}, 18, -5, 5);
      Output rows = input(g, c.feeds, "rows", idType, {40}, 19, 0, 50);
      Output columns = input(g, c.feeds, "columns", idType, {300}, 20, 0, 50);
      c.outputs = {penalizeMatches(x, rows, columns, 1e9), penalizeMatches(x * 2.0, rows, columns, 3.0), x};
      return c;
    }, 1e-6);
  }
}

TEST_CASE("shape ops and their gradients match the CPU") {
  for (DType dt : {f32, f64, i64}) {
    CAPTURE(dtypeName(dt));
    checkParity([&](Graph& g) {
      Computation c;
      Output x = input(g, c.feeds, "x", dt, {3, 4, 5}, 30, -9, 9);
      Output y = input(g, c.feeds, "y", dt, {3, 2, 5}, 31, -9, 9);
      Output z = input(g, c.feeds, "z", dt, {3, 4, 2}, 29, -9, 9);  // joins x along the last axis
      const std::vector<Output> pieces = split(x, {1, -1, 2}, 1);
      c.outputs = {transpose(x, {2, 0, 1}), transpose(x, {1, 0, 2}), concat({x, y}, 1), concat({z, x, z}, -1),
                   pieces[0], pieces[1], pieces[2], slice(x, {1, 1, 0}, {2, -1, 3}), pad(x, {0, 1, 2, 0, 1, 1}, 7.0)};
      return c;
    }, 0);
  }
  checkParity([](Graph& g) {
    Computation c;
    Output x = input(g, c.feeds, "x", f64, {3, 4, 5}, 32);
    Output y = input(g, c.feeds, "y", f64, {3, 2, 5}, 33);
    Output loss = sum(square(concat({x, y}, 1))) + sum(exp(slice(x, {1, 0, 2}, {2, 3, 3}))) +
                  sum(pad(y, {1, 0, 0, 2, 1, 1}) * 3.0) + sum(transpose(x, {2, 1, 0}) * transpose(x, {2, 1, 0}));
    const std::vector<Grad> grads = gradients(loss, {x, y});
    c.outputs = {loss, grads[0].dense, grads[1].dense};
    return c;
  }, 1e-12);
}

TEST_CASE("gathers, scatters and segment sums match the CPU") {
  for (DType ids : {i32, i64}) {
    CAPTURE(dtypeName(ids));
    checkParity([&](Graph& g) {
      Computation c;
      Output table = input(g, c.feeds, "table", f32, {50, 6}, 34);
      Output rows = input(g, c.feeds, "rows", f32, {40, 6}, 35);
      Output id = input(g, c.feeds, "ids", ids, {40}, 36, 0, 50);  // repeats likely
      Output nodes = input(g, c.feeds, "nodes", f64, {40, 3}, 37);
      c.outputs = {gather(table, id), scatterAdd(table, id, rows), unsortedSegmentSum(nodes, id, 60),
                   unsortedSegmentSum(nodes, id, 50)};
      return c;
    }, 1e-6);
  }
}

TEST_CASE("an out-of-range id in a GPU gather fails the run and names it") {
  Graph g;
  auto placed = g.onDevice("cuda:0");
  Output table = g.placeholder("table", f32, {5, 2});
  Output ids = g.placeholder("ids", i64, {3});
  Session s(g);
  const std::string e = errorOf([&] {
    s.run({gather(table, ids)},
          {{table, Tensor::zeros(f32, {5, 2})}, {ids, Tensor::fromVector<int64_t>({1, -2, 3}, {3})}});
  });
  CHECK(contains(e, "op 'Gather'"));
  CHECK(contains(e, "id -2 at position 1 is outside [0, 5)"));
}

TEST_CASE("sparse optimizer updates on the GPU match the CPU, repeated rows summed first") {
  for (const char* name : {"sgd", "adam", "adagrad"}) {
    CAPTURE(name);
    checkParity([&](Graph& g) {
      Computation c;
      Output ids = input(g, c.feeds, "ids", i64, {30}, 38, 0, 12);
      Output target = input(g, c.feeds, "target", f32, {30, 4}, 39);
      nn::Embedding embedding(g, "embedding", 12, 4);
      Output loss = mean(square(embedding(ids) - target));
      std::unique_ptr<optim::Optimizer> opt;
      if (std::string(name) == "sgd") opt = std::make_unique<optim::SGD>(0.5);
      else if (std::string(name) == "adam") opt = std::make_unique<optim::Adam>(0.05);
      else opt = std::make_unique<optim::Adagrad>(0.5);
      c.targets = {opt->minimize(loss)};
      c.outputs = {loss, embedding.table};
      return c;
    }, 1e-5);
  }
}

TEST_CASE("the LSTM and the GRU cell, forward and backward, match the CPU") {
  checkParity([](Graph& g) {
    Computation c;
    const int64_t steps = 5, batch = 3, in = 4, hidden = 6;
    Output x = input(g, c.feeds, "x", f64, {steps, batch, in}, 40);
    Output h0 = input(g, c.feeds, "h0", f64, {batch, hidden}, 41);
    Output c0 = input(g, c.feeds, "c0", f64, {batch, hidden}, 42);
    Output wx = input(g, c.feeds, "wx", f64, {in, 4 * hidden}, 43);
    Output wh = input(g, c.feeds, "wh", f64, {hidden, 4 * hidden}, 44);
    Output b = input(g, c.feeds, "b", f64, {4 * hidden}, 45);
    const LstmOutputs l = lstm(x, h0, c0, wx, wh, b);  // y, hLast, cLast
    Output gx = input(g, c.feeds, "gx", f64, {batch, in}, 46);
    Output gwx = input(g, c.feeds, "gwx", f64, {in, 3 * hidden}, 47);
    Output gwh = input(g, c.feeds, "gwh", f64, {hidden, 3 * hidden}, 48);
    Output gbx = input(g, c.feeds, "gbx", f64, {3 * hidden}, 49);
    Output gbh = input(g, c.feeds, "gbh", f64, {3 * hidden}, 50);
    Output hNew = gruCell(gx, h0, gwx, gwh, gbx, gbh);
    Output loss = sum(square(l.y)) + sum(l.hLast * 2.0) + sum(l.cLast) + sum(square(hNew));
    const std::vector<Grad> grads = gradients(loss, {x, h0, c0, wx, wh, b, gx, gwx, gwh, gbx, gbh});
    c.outputs = {l.y, l.hLast, l.cLast, hNew};
    for (const Grad& gr : grads) c.outputs.push_back(gr.dense);
    return c;
  }, 1e-10);
}

TEST_CASE("convolutions (cuDNN) and their gradients match the CPU") {
  struct Case {
    Shape x, filter;
    Conv2dOptions options;
  };
  const std::vector<Case> cases{{{2, 3, 9, 9}, {4, 3, 3, 3}, {{1, 1}, {1, 1}, {1, 1}}},
                                {{2, 3, 9, 8}, {5, 3, 3, 3}, {{2, 2}, {1, 1}, {1, 1}}},
                                {{1, 4, 7, 7}, {2, 4, 1, 1}, {{1, 1}, {0, 0}, {1, 1}}},
                                {{1, 2, 11, 10}, {3, 2, 5, 3}, {{2, 1}, {2, 0}, {1, 2}}}};
  for (DType dt : {f32, f64}) {
    for (const Case& k : cases) {
      CAPTURE(dtypeName(dt));
      CAPTURE(k.x.str());
      CAPTURE(k.filter.str());
      checkParity([&](Graph& g) {
        Computation c;
        Output x = input(g, c.feeds, "x", dt, k.x, 51);
        Output f = input(g, c.feeds, "f", dt, k.filter, 52);
        Output y = conv2d(x, f, k.options);
        const std::vector<Grad> grads = gradients(sum(square(y)), {x, f});
        c.outputs = {y, grads[0].dense, grads[1].dense};
        return c;
      }, dt == f32 ? 1e-4 : 1e-10);
    }
  }
}

TEST_CASE("max and average pooling and their gradients match the CPU") {
  for (DType dt : {f32, f64}) {
    CAPTURE(dtypeName(dt));
    checkParity([&](Graph& g) {
      Computation c;
      Output x = input(g, c.feeds, "x", dt, {2, 3, 9, 8}, 60);
      Output maxed = maxPool2d(x, {3, 3}, {2, 2}, {1, 1});
      Output averaged = avgPool2d(x, {2, 3}, {1, 2}, {1, 0});
      const std::vector<Grad> grads = gradients(sum(square(maxed)) + sum(averaged * averaged * 0.5), {x});
      c.outputs = {maxed, averaged, grads[0].dense};
      return c;
    }, dt == f32 ? 1e-5 : 1e-12);
  }
}

TEST_CASE("batch normalisation, training and inference, matches the CPU") {
  for (const Shape& shape : {Shape{16, 5}, Shape{4, 3, 6, 7}}) {
    CAPTURE(shape.str());
    checkParity([&](Graph& g) {
      Computation c;
      const int64_t channels = shape[1];
      Output x = input(g, c.feeds, "x", f64, shape, 53, 2, 5);  // a mean far from 0
      Output gamma = input(g, c.feeds, "gamma", f64, {channels}, 54);
      Output beta = input(g, c.feeds, "beta", f64, {channels}, 55);
      const BatchNormOutputs bn = batchNormTrain(x, gamma, beta, 1e-5);
      Output loss = sum(square(bn.y) * x) + sum(bn.batchMean * bn.batchVar);
      const std::vector<Grad> grads = gradients(loss, {x, gamma, beta});
      Output inference = batchNormInference(x, gamma, beta, bn.batchMean, bn.batchVar, 1e-3);
      c.outputs = {bn.y, bn.batchMean, bn.batchVar, inference, grads[0].dense, grads[1].dense, grads[2].dense};
      return c;
    }, 1e-9);
  }
}

TEST_CASE("batch normalisation split over many blocks per channel matches the CPU") {
  // Channels cut into many parts; planes whose length allows 16-byte vectors and planes that do
  // not (7 x 7, 3 x 5, 300 x 301); a 2-D input; one channel.
  const std::vector<Shape> shapes{{32, 64, 28, 28}, {16, 96, 7, 7}, {4, 5, 3, 5}, {512, 3}, {2, 1, 300, 301}};
  for (DType dt : {f32, f64}) {
    for (const Shape& shape : shapes) {
      CAPTURE(dtypeName(dt));
      CAPTURE(shape.str());
      checkParity([&](Graph& g) {
        Computation c;
        const int64_t channels = shape[1];
        Output x = input(g, c.feeds, "x", dt, shape, 56, -3, 5);
        Output gamma = input(g, c.feeds, "gamma", dt, {channels}, 57);
        Output beta = input(g, c.feeds, "beta", dt, {channels}, 58);
        const BatchNormOutputs bn = batchNormTrain(x, gamma, beta, 1e-5);
        Output loss = sum(bn.y * x);
        const std::vector<Grad> grads = gradients(loss, {x, gamma, beta});
        Output inference = batchNormInference(x, gamma, beta, bn.batchMean, bn.batchVar, 1e-3);
        c.outputs = {bn.y, bn.batchMean, bn.batchVar, inference, grads[0].dense, grads[1].dense, grads[2].dense};
        return c;
      }, dt == f32 ? 2e-4 : 1e-9);
    }
  }
}

TEST_CASE("16-bit batch norm, ReLU, residual sums, gradient sums and max pooling match the CPU") {
  for (DType low : {bf16, f16}) {
    CAPTURE(dtypeName(low));
    checkParity([&](Graph& g) {
      Computation c;
      Output x = cast(input(g, c.feeds, "x", f32, {4, 8, 15, 14}, 81, -2, 2), low);
      Output gamma = input(g, c.feeds, "gamma", f32, {8}, 82);
      Output beta = input(g, c.feeds, "beta", f32, {8}, 83);
      const BatchNormOutputs bn = batchNormTrain(x, gamma, beta, 1e-5);
      Output sumOf = relu(bn.y) + x;
      Output pooled = maxPool2d(sumOf, {3, 3}, {2, 2}, {1, 1});
      Output inference = batchNormInference(x, gamma, beta, bn.batchMean, bn.batchVar, 1e-3);
      // x feeds batch norm and the sum: its gradient is an AddN of two 16-bit gradients.
      const std::vector<Grad> grads = gradients(sum(square(cast(pooled, f32))), {x, gamma, beta});
      CHECK(grads[0].dense.dtype() == low);
      c.outputs = {bn.y, bn.batchMean, sumOf, pooled, inference, grads[0].dense, grads[1].dense, grads[2].dense};
      return c;
    }, low == bf16 ? 4.0 / 128 : 4.0 / 512);
  }
}

TEST_CASE("batch norm fused with its ReLU matches the CPU, forward and backward") {
  // One block per channel, and (a ResNet stem's shape) channels split over many blocks.
  for (const Shape& shape : {Shape{8, 16, 15, 14}, Shape{32, 16, 32, 32}})
  for (DType dt : {f32, f64, bf16}) {
    CAPTURE(shape.str());
    CAPTURE(dtypeName(dt));
    checkParity([&](Graph& g) {
      Computation c;
      const DType stats = dt == bf16 ? f32 : dt;
      Output x = input(g, c.feeds, "x", stats, shape, 86, -2, 2);
      if (dt == bf16) x = cast(x, bf16);
      Output gamma = input(g, c.feeds, "gamma", stats, {16}, 87);
      Output beta = input(g, c.feeds, "beta", stats, {16}, 88);
      Output w = input(g, c.feeds, "w", stats, shape, 89);
      const BatchNormOutputs bn = batchNormTrain(x, gamma, beta, 1e-5, true);
      const std::vector<Grad> grads = gradients(sum(cast(bn.y, stats) * w), {x, gamma, beta});
      CHECK(grads[1].dense.node()->op == "BatchNormReluGrad");
      c.outputs = {bn.y, bn.batchMean, bn.batchVar, grads[0].dense, grads[1].dense, grads[2].dense};
      return c;
    }, dt == f64 ? 1e-9 : dt == f32 ? 2e-4 : 4.0 / 128);
  }
}

TEST_CASE("a max pool's gradient goes to the first maximum of each window when values tie") {
  for (DType dt : {f32, f64}) {
    CAPTURE(dtypeName(dt));
    checkParity([&](Graph& g) {
      Computation c;
      Output x = cast(input(g, c.feeds, "x", i32, {3, 5, 17, 16}, 84, 0, 3), dt);  // many ties
      Output pooled = maxPool2d(x, {3, 3}, {2, 2}, {1, 1});
      Output weights = input(g, c.feeds, "w", dt, pooled.shape(), 85);
      c.outputs = {pooled, gradients(sum(pooled * weights), {x})[0].dense};
      return c;
    }, dt == f32 ? 1e-6 : 1e-12);
  }
}

TEST_CASE("dropout draws the CPU's mask, clipping norms and reversed sequences match the CPU") {
  checkParity([](Graph& g) {
    Computation c;
    Output x = input(g, c.feeds, "x", f32, {7, 300}, 56);
    Output seq = input(g, c.feeds, "seq", f32, {6, 3, 4}, 57);
    Output lengths = g.placeholder("lengths", i64, {3});
    c.feeds.emplace_back(lengths, Tensor::fromVector<int64_t>({6, 0, 3}, {3}));
    Output ids = input(g, c.feeds, "ids", i64, {20}, 58, 0, 7);
    Output rows = input(g, c.feeds, "rows", f32, {20, 5}, 59);
    const auto [clipped, norm] = clipByGlobalNorm({Grad(x), Grad::sparse(ids, rows, {7, 5})}, 1.0);
    c.outputs = {dropout(x, 0.3, 11), norm, clipped[0].dense, clipped[1].values, reverseSequence(seq, lengths, 0, 1)};
    return c;
  }, 1e-5);
}

TEST_CASE("a training step of every zoo model on the GPU matches the CPU step") {
  for (const std::string& name : models::zooModelNames()) {
    CAPTURE(name);
    auto cpuModel = models::makeZooModel(name), gpuModel = models::makeZooModel(name);
    Graph onCpu, onGpu;
    models::CommonOptions common;
    common.seed = 5;
    onCpu.setSeed(5);
    onGpu.setSeed(5);
    cpuModel->build(onCpu, common);
    Node* cpuStep = optim::SGD(0.05).minimize(cpuModel->loss());
    Node* gpuStep = nullptr;
    {
      auto placed = onGpu.onDevice("cuda:0");
      gpuModel->build(onGpu, common);
      gpuStep = optim::SGD(0.05).minimize(gpuModel->loss());
    }
    if (name == "resnet") {  // its batch norms and ReLUs are fused on the GPU as on the CPU
      const auto fused = [](const Graph& g) {
        return std::count_if(g.nodes().begin(), g.nodes().end(),
                             [](const auto& n) { return n->op == "BatchNormReluTrain"; });
      };
      CHECK(fused(onGpu) > 0);
      CHECK(fused(onGpu) == fused(onCpu));
    }
    Session cpuSession(onCpu), gpuSession(onGpu);
    const data::Batch batch = cpuModel->trainData().next();
    for (int i = 0; i < 2; ++i) {
      const double a = cpuSession.run({cpuModel->loss()}, models::feedsFor(onCpu, batch), {cpuStep})[0].item();
      const double b = gpuSession.run({gpuModel->loss()}, models::feedsFor(onGpu, batch), {gpuStep})[0].item();
      CHECK(b == doctest::Approx(a).epsilon(1e-3));
    }
    for (Node* v : onCpu.trainableVariables()) {
      CAPTURE(v->name);
      CHECK_CLOSE(gpuSession.variable(v->name), cpuSession.variable(v).toDoubles(), 1e-3);
    }
  }
}

TEST_CASE("profiling a GPU op counts its kernels' time on the GPU, not its launch's") {
  // A pipeline's cut balances stages by these times. A 4096-cube f32 product is 137 GFLOP: over
  // a millisecond on any GPU, where its launch returns in microseconds.
  Graph g;
  auto placed = g.onDevice("cuda:0");
  const Output a = g.placeholder("a", f32, {4096, 4096});
  const Output product = matmul(a, a);
  Session s(g);
  const auto seconds = s.profile({product}, {{a, randomTensor(f32, {4096, 4096}, 90)}});
  CHECK(seconds.at(product.node()) > 1e-3);
}

TEST_CASE("runOnDevice leaves fetched values on the GPU, with the values run() brings to the host") {
  Graph g;
  auto placed = g.onDevice("cuda:0");
  const Output a = g.placeholder("a", f32, {64, 32});
  const Output product = matmul(a, a, false, true);
  const Output w = g.variable("w", f32, {64, 64}, Initializer::constant(0.5));
  const Output scaled = product * w;
  Session s(g);
  const FeedMap feeds{{a, randomTensor(f32, {64, 32}, 91)}};
  const std::vector<Tensor> onHost = s.run({scaled, w}, feeds);
  const std::vector<Tensor> onGpu = s.runOnDevice({scaled, w}, feeds);
  for (size_t i = 0; i < onGpu.size(); ++i) {
    CHECK(onHost[i].device().type == DeviceType::CPU);
    CHECK(onGpu[i].device().type == DeviceType::CUDA);
    CHECK_CLOSE(onGpu[i], onHost[i].toDoubles(), 0.0);
  }
  // A fetched variable is a copy: updating the variable later leaves it as it was.
  s.variable("w").fill(2.0);
  CHECK(onGpu[1].toDoubles()[0] == 0.5);
}

/// A small f64 AMP model, as tests/test_amp_models.cpp builds them.
std::unique_ptr<models::AmpModel> smallAmpModel(const std::string& name, const std::map<std::string, int64_t>& settings,
                                                int replicas = 1) {
  auto model = models::makeAmpModel(name);
  for (const models::ModelOption& o : model->options())
    if (auto it = settings.find(o.name); it != settings.end()) *std::get<int64_t*>(o.target) = it->second;
  model->build({3, "", f64, replicas});
  return model;
}

TEST_CASE("AMP transforms on the GPU train as on the CPU: synchronous minibatches of each AMP model") {
  const std::map<std::string, std::map<std::string, int64_t>> models{
      {"mlp", {{"hidden", 6}, {"train-size", 8}, {"eval-size", 2}}},
      {"list_reduction", {{"hidden", 5}, {"embedding", 3}, {"train-size", 8}, {"eval-size", 2}}},
      {"tree_lstm", {{"hidden", 4}, {"embedding", 3}, {"train-size", 8}, {"eval-size", 2}, {"max-leaves", 5}}},
      {"ggsnn",
       {{"hidden", 4}, {"propagation-steps", 2}, {"train-size", 8}, {"eval-size", 2}, {"min-nodes", 4},
        {"max-nodes", 6}}}};
  for (const auto& [name, settings] : models) {
    CAPTURE(name);
    std::map<std::string, Tensor> trained[2];
    double accuracy[2];
    for (int onGpu = 0; onGpu < 2; ++onGpu) {
      auto model = smallAmpModel(name, settings);
      // Two workers take turns on the GPU; a minibatch's gradients are summed in arrival order.
      amp::Runtime runtime(model->graph(), {.workers = 2, .device = onGpu ? "cuda:0" : "", .maxActiveKeys = 2,
                                            .minibatch = 4, .optimizer = std::make_shared<optim::SGD>(0.1)});
      runtime.train(8, [&](int64_t i) { return model->trainInstance(i); });
      accuracy[onGpu] = runtime.evaluate(2, [&](int64_t i) { return model->evalInstance(i); }).accuracy;
      trained[onGpu] = runtime.variables();
    }
    CHECK(accuracy[1] == accuracy[0]);
    REQUIRE(trained[1].size() == trained[0].size());
    for (const auto& [variable, value] : trained[0]) {
      CAPTURE(variable);
      CHECK(trained[1].at(variable).device().type == DeviceType::CPU);
      CHECK(relativeDifference(trained[1].at(variable), value) < 1e-9);
    }
  }
}

TEST_CASE("AMP replicas of a layer on the GPU are averaged through the host: at each epoch's end, or every k updates") {
  for (const int every : {0, 2}) {
    CAPTURE(every);
    auto model = smallAmpModel("list_reduction", {{"hidden", 8}, {"train-size", 40}, {"eval-size", 4}}, 3);
    amp::Runtime runtime(model->graph(), {.workers = 3, .device = "cuda:0", .maxActiveKeys = 6,
                                          .minUpdateFrequency = 4, .optimizer = std::make_shared<optim::SGD>(0.05),
                                          .replicaSyncEvery = every});
    const amp::EpochReport r = runtime.train(40, [&](int64_t i) { return model->trainInstance(i); });
    const auto v = runtime.variables();
    const Tensor& first = v.at("linear/replica0/linear/weight");
    if (every == 0) {  // averaged at the end of the epoch
      CHECK(relativeDifference(first, v.at("linear/replica1/linear/weight")) == 0);
      CHECK(relativeDifference(first, v.at("linear/replica2/linear/weight")) == 0);
    } else {
      CHECK(r.replicaSyncs > 0);
    }
    for (double x : first.toDoubles()) CHECK(std::isfinite(x));
  }
}

TEST_CASE("gradients computed on the GPU pass finite-difference checks") {
  Graph g;
  auto placed = g.onDevice("cuda:0");
  Output a = g.placeholder("a", f64, {4, 5});
  Output b = g.placeholder("b", f64, {5, 3});
  Output bias = g.placeholder("bias", f64, {3});
  Output h = matmul(a, b) + bias;
  Output y = sum(tanh(h) * sigmoid(h) + relu(h) / (1.0 + square(h)), {1}) + mean(exp(h * 0.1), {0, 1});
  const FeedMap feeds{{a, randomTensor(f64, {4, 5}, 18)}, {b, randomTensor(f64, {5, 3}, 19)},
                      {bias, randomTensor(f64, {3}, 20)}};
  CHECK_GRADIENTS(checkGradients(g, y, {a, b, bias}, feeds));
}

TEST_CASE("an out-of-range label found on the GPU fails the run, naming the op and the value") {
  Graph g;
  auto placed = g.onDevice("cuda:0");
  Output logits = g.placeholder("logits", f32, {3, 4});
  Output ids = g.placeholder("ids", i64, {3});
  Output loss = sparseSoftmaxCrossEntropy(logits, ids);
  Session s(g);
  const std::string e = errorOf([&] {
    s.run({loss}, {{logits, randomTensor(f32, {3, 4}, 21)}, {ids, Tensor::fromVector<int64_t>({0, 9, 1}, {3})}});
  });
  CHECK(contains(e, "SparseSoftmaxCrossEntropy"));
  CHECK(contains(e, "id 9 at position 1 is outside [0, 4)"));
  // The session is still usable.
  const Tensor ok =
      s.run({loss}, {{logits, randomTensor(f32, {3, 4}, 21)}, {ids, Tensor::fromVector<int64_t>({0, 3, 1}, {3})}})[0];
  CHECK(ok.numel() == 3);
}

TEST_CASE("a training step that fails on a bad label on the GPU changes no variable") {
  Graph g;
  auto placed = g.onDevice("cuda:0");
  const Output x = g.placeholder("x", f32, {3, 5}), labels = g.placeholder("labels", i64, {3});
  nn::Linear layer(g, "fc", 5, 4);
  nn::Embedding embedding(g, "embedding", 6, 5);
  const Output ids = g.placeholder("ids", i64, {3});
  const Output logits = layer(x + embedding(ids));
  Node* step = optim::Adam(0.1).minimize(mean(sparseSoftmaxCrossEntropy(logits, labels)));
  Session s(g);
  const Tensor xv = randomTensor(f32, {3, 5}, 26), idv = Tensor::fromVector<int64_t>({0, 2, 5}, {3});
  s.run({}, {{x, xv}, {ids, idv}, {labels, Tensor::fromVector<int64_t>({0, 1, 2}, {3})}}, {step});
  std::vector<std::vector<double>> before;
  // The updates read the loss's gradient, so they run after the op that found the bad label.
  const std::vector<std::string> names{"fc/weight", "fc/bias", "embedding/table", "Adam/fc/weight/m",
                                       "Adam/embedding/table/v"};
  for (const std::string& n : names) before.push_back(s.variable(n).toDoubles());
  const std::string e = errorOf([&] {
    s.run({}, {{x, xv}, {ids, idv}, {labels, Tensor::fromVector<int64_t>({0, 9, 2}, {3})}}, {step});
  });
  CHECK(contains(e, "id 9 at position 1 is outside [0, 4)"));
  for (size_t i = 0; i < names.size(); ++i) {
    CAPTURE(names[i]);
    CHECK(s.variable(names[i]).toDoubles() == before[i]);
  }
}

TEST_CASE("ops with ids but nothing to move still check the ids on the GPU") {
  Graph g;
  auto placed = g.onDevice("cuda:0");
  const Output table = g.placeholder("table", f32, {5, 0}), ids = g.placeholder("ids", i64, {2});
  Session s(g);
  CHECK(contains(errorOf([&] {
                   s.run({gather(table, ids)},
                         {{table, Tensor::zeros(f32, {5, 0})}, {ids, Tensor::fromVector<int64_t>({1, 7}, {2})}});
                 }),
                 "id 7 at position 1 is outside [0, 5)"));
}

TEST_CASE("ones and padding fill 16-bit tensors on the GPU") {
  checkParity([](Graph& g) {
    Computation c;
    const Output x = cast(input(g, c.feeds, "x", f32, {2, 3}, 27), bf16);
    c.outputs = {cast(pad(x, {1, 0, 0, 2}, 0.5), f32), cast(onesLike(x), f32)};
    return c;
  }, 0.0);
}

TEST_CASE("a sequence length beyond the sequence fails a GPU run in the CPU's words") {
  Graph g;
  auto placed = g.onDevice("cuda:0");
  const Output x = g.placeholder("x", f32, {4, 2}), lengths = g.placeholder("lengths", i64, {2});
  Session s(g);
  const std::string e = errorOf([&] {
    s.run({reverseSequence(x, lengths, 0, 1)},
          {{x, Tensor::zeros(f32, {4, 2})}, {lengths, Tensor::fromVector<int64_t>({2, 5}, {2})}});
  });
  CHECK(contains(e, "op 'ReverseSequence'"));
  CHECK(contains(e, "length 5 of sequence 1 is outside [0, 4]"));
}

TEST_CASE("integer division by zero on the GPU fails the run") {
  Graph g;
  auto placed = g.onDevice("cuda:0");
  Output a = g.placeholder("a", i64, {3});
  Output b = g.placeholder("b", i64, {3});
  Session s(g);
  const std::string e = errorOf([&] {
    s.run({a / b},
          {{a, Tensor::fromVector<int64_t>({1, 2, 3}, {3})}, {b, Tensor::fromVector<int64_t>({1, 0, 1}, {3})}});
  });
  CHECK(contains(e, "integer division by zero (divisor element 1)"));
}

TEST_CASE("values cross between devices where their consumers run") {
  Graph g;
  Output x = g.placeholder("x", f32, {2, 3});
  Output onGpu, back;
  {
    auto placed = g.onDevice("cuda:0");
    onGpu = exp(x);
  }
  back = onGpu * 2.0;  // on the CPU
  Output again;
  {
    auto placed = g.onDevice("cuda:0");
    again = back + onGpu;
  }
  Session s(g);
  const Tensor xv = randomTensor(f32, {2, 3}, 22);
  const std::vector<Tensor> out = s.run({onGpu, back, again}, {{x, xv}});
  std::vector<double> e, b2, a3;
  for (double v : xv.toDoubles()) {
    e.push_back(std::exp(v));
    b2.push_back(2 * std::exp(v));
    a3.push_back(3 * std::exp(v));
  }
  CHECK_CLOSE(out[0], e, 1e-6);
  CHECK_CLOSE(out[1], b2, 1e-6);
  CHECK_CLOSE(out[2], a3, 1e-6);
}

TEST_CASE("a trace gives every GPU op its kernels' time on the track \"gpu\"") {
  Graph g;
  auto placed = g.onDevice("cuda:0");
  const Output x = g.placeholder("x", f32, {1 << 20});
  const Output y = tanh(x) * 2.0;
  Session s(g);
  const FeedMap feeds{{x, randomTensor(f32, {1 << 20}, 90)}};
  s.run({y}, feeds);  // compiles the plan
  startTracing();
  s.run({y}, feeds);
  s.run({y}, feeds);
  stopTracing();
  const auto trace = nlohmann::json::parse(traceEventsJson(0, "test"));
  int gpuTrack = -1;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] == "gpu") gpuTrack = e["tid"].get<int>();
  }
  REQUIRE(gpuTrack >= 0);
  std::map<std::string, int> runs;  // by category: the op, or Copy for the executor's copies
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || e["tid"].get<int>() != gpuTrack) continue;
    ++runs[e["cat"].get<std::string>()];
    CHECK(e["dur"].get<int64_t>() >= 0);
    CHECK(e["args"].contains("bytes"));
  }
  CHECK(runs["Tanh"] == 2);
  CHECK(runs["Mul"] == 2);
  CHECK(runs["Copy"] == 2);  // x, fed from the host
}

TEST_CASE("the caching allocator serves every step after the first from its cache") {
  Graph g;
  auto placed = g.onDevice("cuda:0");
  Output x = g.placeholder("x", f32, {64, 128});
  nn::Linear layer(g, "fc", 128, 256);
  Output loss = mean(square(layer(x)));
  Node* step = optim::Adam(1e-3).minimize(loss);
  Session s(g);
  const FeedMap feeds{{x, randomTensor(f32, {64, 128}, 23)}};
  // Two runs: the first sizes the arena, the second allocates the fetch while the first's is held.
  s.run({loss}, feeds, {step});
  s.run({loss}, feeds, {step});
  const MemoryStats warm = memoryStats(Device::parse("cuda:0"));
  for (int i = 0; i < 5; ++i) s.run({loss}, feeds, {step});
  const MemoryStats after = memoryStats(Device::parse("cuda:0"));
  CHECK(after.deviceAllocations == warm.deviceAllocations);
  CHECK(after.allocations > warm.allocations);
  CHECK(after.reservedBytes >= after.allocatedBytes);
  CHECK(after.peakAllocatedBytes >= after.allocatedBytes);
}

TEST_CASE("uploads land on the GPU intact, staged through reused pinned buffers") {
  const Device gpu = Device::parse("cuda:0");
  CHECK(hostMemoryPinnable());
  const Tensor a = randomTensor(f32, {1000, 33}, 30), ids = randomInts(i64, {77}, 0, 1000, 31);
  Tensor pinned = Tensor::pinned(f32, {5});
  pinned.fill(3);
  const std::vector<Tensor> up = uploadTo({a, ids, pinned}, gpu);
  REQUIRE(up.size() == 3);
  for (size_t i = 0; i < up.size(); ++i) CHECK(up[i].device() == gpu);
  CHECK(up[0].toDoubles() == a.toDoubles());
  CHECK(up[1].toDoubles() == ids.toDoubles());
  CHECK(up[2].toDoubles() == std::vector<double>(5, 3.0));
  const MemoryStats warm = pinnedMemoryStats();
  CHECK(uploadTo({a, ids}, gpu)[0].toDoubles() == a.toDoubles());
  const MemoryStats after = pinnedMemoryStats();
  CHECK(after.deviceAllocations == warm.deviceAllocations);
  CHECK(after.cacheHits >= warm.cacheHits + 2);
}

TEST_CASE("a pinned tensor may be overwritten once its copy to the GPU returns") {
  const Device gpu = Device::parse("cuda:0");
  const int64_t n = int64_t{1} << 24;
  Tensor host = Tensor::pinned(f32, {n});
  host.fill(1);
  const Tensor busy = Tensor::zeros(f32, {int64_t{1} << 26}).to(gpu);
  for (int i = 0; i < 40; ++i) busy.clone();  // the copy below waits milliseconds behind these
  const Tensor onGpu = host.to(gpu);
  host.fill(2);
  CHECK(onGpu.toDoubles() == std::vector<double>(static_cast<size_t>(n), 1.0));
}

TEST_CASE("a freed upload is written again only after the compute stream has read it") {
  const Device gpu = Device::parse("cuda:0");
  const int64_t n = int64_t{1} << 20;
  const Tensor first = Tensor::full(f32, {n}, 1.0), second = Tensor::full(f32, {n}, 2.0);
  const Tensor busy = Tensor::zeros(f32, {int64_t{1} << 26}).to(gpu);
  Tensor copy;
  {
    const Tensor up = uploadTo({first}, gpu)[0];
    for (int i = 0; i < 40; ++i) busy.clone();  // keeps the compute stream busy for milliseconds
    copy = up.clone();                          // queued behind them, reading `up`
  }
  const Tensor again = uploadTo({second}, gpu)[0];  // the same size: the freed block's cache
  CHECK(copy.toDoubles() == std::vector<double>(static_cast<size_t>(n), 1.0));
  CHECK(again.toDoubles() == std::vector<double>(static_cast<size_t>(n), 2.0));
}

TEST_CASE("an MLP fed by a prefetcher uploading to the GPU trains as when fed from the host") {
  std::vector<data::Example> examples;
  for (int64_t i = 0; i < 256; ++i) {
    examples.push_back({{"x", randomTensor(f32, {20}, 300 + static_cast<uint64_t>(i))},
                        {"labels", Tensor::scalar(i64, static_cast<double>(i % 5))}});
  }
  const data::Dataset dataset(std::move(examples));
  Graph g;
  Output loss;
  Node* step = nullptr;
  {
    auto placed = g.onDevice("cuda:0");
    const Output x = g.placeholder("x", f32, {32, 20}), labels = g.placeholder("labels", i64, {32});
    nn::Linear l1(g, "l1", 20, 64), l2(g, "l2", 64, 5);
    loss = nn::meanSparseCrossEntropy(l2(relu(l1(x))), labels);
    step = optim::Momentum(0.05, 0.9).minimize(loss);
  }
  Session fromHost(g), fromGpu(g);
  data::Batcher hostBatches(dataset, {32, true, 7, {}, 0, 0, {}}), gpuSource(dataset, {32, true, 7, {}, 0, 0, {}});
  data::PrefetchOptions options;
  options.device = Device::parse("cuda:0");
  data::Prefetcher gpuBatches(gpuSource, options);
  for (int i = 0; i < 20; ++i) {
    CAPTURE(i);
    const data::Batch onGpu = gpuBatches.next();
    CHECK(onGpu.at("x").device() == Device::parse("cuda:0"));
    const double a = fromHost.run({loss}, models::feedsFor(g, hostBatches.next()), {step})[0].item();
    const double b = fromGpu.run({loss}, models::feedsFor(g, onGpu), {step})[0].item();
    CHECK(b == doctest::Approx(a).epsilon(1e-6));
  }
}

TEST_CASE("optimizer updates on the GPU match the CPU") {
  using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>()>;
  const std::vector<std::pair<const char*, MakeOptimizer>> optimizers{
      {"sgd", [] { return std::make_unique<optim::SGD>(0.1, 1e-2); }},
      {"momentum", [] { return std::make_unique<optim::Momentum>(0.1, 0.9, true, 1e-2); }},
      {"adam", [] { return std::make_unique<optim::Adam>(0.01); }},
      {"adagrad", [] { return std::make_unique<optim::Adagrad>(0.1); }}};
  for (const auto& [name, make] : optimizers) {
    CAPTURE(name);
    checkParity([&, make = make](Graph& g) {
      Computation c;
      Output x = input(g, c.feeds, "x", f32, {16, 10}, 24);
      Output labels = input(g, c.feeds, "labels", i64, {16}, 25, 0, 4);
      nn::Linear hidden(g, "hidden", 10, 32), out(g, "out", 32, 4);
      Output loss = nn::meanSparseCrossEntropy(out(relu(hidden(x))), labels);
      c.targets = {make()->minimize(loss)};
      c.outputs = {loss, hidden.weight, hidden.bias, out.weight};  // values after the update
      return c;
    }, 1e-5);
  }
}

TEST_CASE("training an MLP on the GPU follows the CPU step for step") {
  SideBySide mlp([](Graph& g) {
    Classifier m{g.placeholder("x", f32, {32, 20}), g.placeholder("labels", i64, {32}), {}, nullptr};
    nn::Linear l1(g, "l1", 20, 64), l2(g, "l2", 64, 64), l3(g, "l3", 64, 5);
    m.loss = nn::meanSparseCrossEntropy(l3(relu(l2(relu(l1(m.x))))), m.labels);
    // Momentum rather than Adam: Adam's normalised steps would magnify rounding differences in
    // near-zero gradients into whole learning-rate steps.
    m.step = optim::Momentum(0.05, 0.9).minimize(m.loss);
    return m;
  });
  for (int i = 0; i < 10; ++i) {
    const auto [a, b] = mlp.step(randomTensor(f32, {32, 20}, 100 + static_cast<uint64_t>(i)),
                                 randomInts(i64, {32}, 0, 5, 200 + static_cast<uint64_t>(i)));
    CAPTURE(i);
    CHECK(b == doctest::Approx(a).epsilon(1e-4));
  }
  for (const char* name : {"l1/weight", "l2/bias", "l3/weight"}) {
    CAPTURE(name);
    CHECK_CLOSE(mlp.gpuSession->variable(name), mlp.cpuSession->variable(name).toDoubles(), 1e-4);
  }
}

TEST_CASE("casts to and from bf16 and f16 match the CPU bit for bit") {
  checkParity([](Graph& g) {
    Computation c;
    Output x = input(g, c.feeds, "x", f32, {1000}, 71, -70000, 70000);  // beyond f16's range too
    Output small = input(g, c.feeds, "small", f32, {1000}, 72, -1e-6, 1e-6);  // f16 subnormals
    Output d = input(g, c.feeds, "d", f64, {100}, 73);
    Output ids = input(g, c.feeds, "ids", i32, {100}, 74, -3000, 3000);
    c.outputs = {cast(x, bf16), cast(x, f16), cast(small, f16), cast(d, bf16), cast(ids, f16),
                 cast(cast(x, bf16), f32), cast(cast(small, f16), f64), cast(cast(x, f16), bf16)};
    return c;
  }, 0.0);
}

TEST_CASE("16-bit convolutions (cuDNN) and their gradients match the CPU") {
  for (DType low : {bf16, f16}) {
    CAPTURE(dtypeName(low));
    checkParity([&](Graph& g) {
      Computation c;
      Output x = input(g, c.feeds, "x", f32, {4, 8, 12, 12}, 79);
      Output f = input(g, c.feeds, "f", f32, {16, 8, 3, 3}, 80);
      Output y;
      {
        auto mixed = g.mixedPrecision(low);
        y = conv2d(x, f, {{1, 1}, {1, 1}, {1, 1}});
      }
      const std::vector<Grad> grads = gradients(sum(square(y)), {x, f});
      c.outputs = {y, grads[0].dense, grads[1].dense};
      return c;
    }, low == bf16 ? 4.0 / 128 : 4.0 / 512);
  }
}

TEST_CASE("a small ResNet trains on the GPU in bf16 as on the CPU, with its activations in bf16") {
  SideBySide resnet([](Graph& g) {
    models::ResNetNet net;
    {
      auto mixed = g.mixedPrecision(bf16);
      net = models::buildResNet(g, {8, 8, 4, 3, 0.9, 3, f32});
    }
    Classifier m{net.images, net.labels, net.loss, nullptr};
    m.step = optim::Momentum(0.05, 0.9).minimize(m.loss);
    return m;
  });
  const Tensor xv = randomTensor(f32, {16, 3, 16, 16}, 310);
  const Tensor yv = randomInts(i64, {16}, 0, 4, 311);
  for (int i = 0; i < 10; ++i) {
    const auto [a, b] = resnet.step(xv, yv);
    CAPTURE(i);
    CHECK(b == doctest::Approx(a).epsilon(0.03));  // bf16 rounding differs in summation order
  }
  const FeedMap feeds{{resnet.gpuModel.x, xv}, {resnet.gpuModel.labels, yv}};
  const PlanStats gpu = resnet.gpuSession->planStats({resnet.gpuModel.loss}, feeds, {resnet.gpuModel.step});
  const FeedMap cpuFeeds{{resnet.cpuModel.x, xv}, {resnet.cpuModel.labels, yv}};
  const PlanStats cpu = resnet.cpuSession->planStats({resnet.cpuModel.loss}, cpuFeeds, {resnet.cpuModel.step});
  CHECK(gpu.castOps == cpu.castOps);
  CHECK(gpu.castOps < 60);  // filters down, filter gradients up, images, the classifier's product
}

TEST_CASE("AllFinite and an update it gates run on the GPU as on the CPU") {
  for (const float poison : {1.0f, INFINITY, NAN}) {
    CAPTURE(poison);
    checkParity([&](Graph& g) {
      Computation c;
      Output x = g.placeholder("x", f32, {5000});
      std::vector<float> values(5000, 0.5f);
      values[4321] = poison;
      c.feeds.emplace_back(x, Tensor::fromVector(values, {5000}));
      const Output counter = g.variable("counter", f32, {}, Initializer::zeros(), false);
      Node* add = assignAdd(counter, g.scalar(1.0));
      g.runOnlyIf(add, allFinite({x}));
      c.outputs = {allFinite({x}), counter};
      c.targets = {add};
      return c;
    }, 0.0);
  }
}

TEST_CASE("an MLP trains on the GPU in bf16, and in f16 with loss scaling, as on the CPU") {
  for (DType low : {bf16, f16}) {
    CAPTURE(dtypeName(low));
    SideBySide mlp([&](Graph& g) {
      Classifier m{g.placeholder("x", f32, {64, 20}), g.placeholder("labels", i64, {64}), {}, nullptr};
      auto mixed = g.mixedPrecision(low);
      nn::Linear l1(g, "l1", 20, 128), l2(g, "l2", 128, 5);
      m.loss = nn::meanSparseCrossEntropy(l2(relu(l1(m.x))), m.labels);
      optim::MinimizeOptions options;
      if (low == f16) options.lossScaling = optim::LossScaling{};
      m.step = optim::Momentum(0.05, 0.9).minimize(m.loss, options);
      return m;
    });
    const Tensor xv = randomTensor(f32, {64, 20}, 300);
    const Tensor yv = randomInts(i64, {64}, 0, 5, 301);
    double first = 0, last = 0;
    for (int i = 0; i < 30; ++i) {
      const auto [a, b] = mlp.step(xv, yv);
      last = b;
      if (i == 0) first = b;
      CAPTURE(i);
      CHECK(b == doctest::Approx(a).epsilon(0.02));  // 16-bit rounding differs in summation order
    }
    CHECK(last < first / 2);  // one fixed batch: memorised
    if (low == f16) {
      CHECK(mlp.gpuSession->variable("loss_scale").item() == mlp.cpuSession->variable("loss_scale").item());
    }
  }
}
