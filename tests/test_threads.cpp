// Results do not depend on the thread count: every op family whose CPU kernel splits its work
// across the pool computes the same bits, forward and backward, with 1, 2, 3 and 4 threads. The
// inputs are large enough that the pool really splits them (parallelFor keeps work under about
// 20 us on one thread). Three and four threads on a two-core machine still split the work three
// and four ways; what is checked is the split, not the speed.
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "core/Random.h"
#include "ops/Ops.h"
#include "optim/Optimizer.h"

#include <functional>
#include <optional>
#include <string>
#include <utility>

using namespace weft;
using weft::testing::randomTensor;

namespace {

/// A graph under test: its forward outputs, given placeholders the builder fed.
struct Built {
  std::vector<Output> outputs;
  std::vector<Output> differentiable;  // float placeholders the gradients are taken for
  std::vector<Node*> targets;          // update ops, run with the fetches
};
using Builder = std::function<Built(Graph&, FeedMap&)>;

Output fed(Graph& g, FeedMap& feeds, const std::string& name, Tensor value) {
  const Output x = g.placeholder(name, value.dtype(), value.shape());
  feeds.emplace_back(x, std::move(value));
  return x;
}

Output floatInput(Graph& g, FeedMap& feeds, const std::string& name, Shape shape, uint64_t seed, DType dt = f32) {
  return fed(g, feeds, name, randomTensor(dt, std::move(shape), seed));
}

Tensor ids(int64_t n, int64_t rows, uint64_t seed) {
  Tensor t(i64, {n});
  for (int64_t i = 0; i < n; ++i)
    t.data<int64_t>()[i] =
        static_cast<int64_t>(mix64(seed * 7919 + static_cast<uint64_t>(i)) % static_cast<uint64_t>(rows));
  return t;
}

/// Every forward output and the gradient of sum(y * w) (random w per output) for each
/// differentiable input, with `threads` threads.
std::vector<std::vector<double>> runWith(const Builder& build, int threads) {
  Graph g;
  FeedMap feeds;
  Built b = build(g, feeds);
  std::vector<Output> fetches = b.outputs;
  if (!b.differentiable.empty()) {
    Output loss;
    uint64_t seed = 100;
    for (const Output& y : b.outputs) {
      if (!isFloating(y.dtype())) continue;
      const Output term = sum(y * g.constant(randomTensor(y.dtype(), y.shape(), seed++)));
      const Output asF64 = term.dtype() == f64 ? term : cast(term, f64);
      loss = loss.valid() ? loss + asF64 : asF64;
    }
    for (const Grad& gr : gradients(loss, b.differentiable)) {
      if (gr.valid()) fetches.push_back(toDense(gr));
    }
  }
  Session s(g, {threads, false});
  std::vector<std::vector<double>> out;
  for (const Tensor& t : s.run(fetches, feeds, b.targets)) out.push_back(t.toDoubles());
  for (Node* v : g.variables()) out.push_back(s.variable(v).toDoubles());
  return out;
}

void checkThreadIndependent(const Builder& build) {
  const std::vector<std::vector<double>> one = runWith(build, 1);
  for (int threads : {2, 3, 4}) {
    CAPTURE(threads);
    const std::vector<std::vector<double>> many = runWith(build, threads);
    REQUIRE(many.size() == one.size());
    for (size_t i = 0; i < one.size(); ++i) {
      CAPTURE(i);
      CHECK(many[i] == one[i]);
    }
  }
}

}  // namespace

TEST_CASE("elementwise ops with broadcasting, unary chains and casts") {
  checkThreadIndependent([](Graph& g, FeedMap& f) {
    const Output a = floatInput(g, f, "a", {512, 300}, 1), b = floatInput(g, f, "b", {300}, 2);
    const Output y = tanh(a * b + exp(a) / (abs(b) + 1.0));
    return Built{{y, cast(y, f64), maximum(a, b)}, {a, b}, {}};
  });
}

TEST_CASE("matrix products, plain and batched") {
  checkThreadIndependent([](Graph& g, FeedMap& f) {
    const Output a = floatInput(g, f, "a", {300, 200}, 1), b = floatInput(g, f, "b", {200, 260}, 2);
    const Output c = floatInput(g, f, "c", {4, 100, 90}, 3), d = floatInput(g, f, "d", {4, 110, 90}, 4);
    return Built{{matmul(a, b), matmul(a, a, true, false), batchMatmul(c, d, false, true)}, {a, b, c, d}, {}};
  });
}

TEST_CASE("reductions over each axis") {
  checkThreadIndependent([](Graph& g, FeedMap& f) {
    const Output x = floatInput(g, f, "x", {600, 500}, 1);
    return Built{{sum(x, {0}), sum(x, {1}), mean(x), max(x, {1}), argmax(x, 0)}, {x}, {}};
  });
}

TEST_CASE("shape ops: transpose, concat, pad, slice, reversed sequences") {
  checkThreadIndependent([](Graph& g, FeedMap& f) {
    const Output x = floatInput(g, f, "x", {40, 64, 300}, 1);
    const Output lengths = fed(g, f, "lengths", ids(64, 41, 5));
    return Built{{transpose(x, {2, 0, 1}), concat({x, x * 2.0}, 1), pad(x, {1, 2, 0, 0, 3, 1}),
                  slice(x, {3, 5, 7}, {30, 50, 200}), reverseSequence(x, cast(lengths, i32), 0, 1)},
                 {x},
                 {}};
  });
}

TEST_CASE("softmax, log-softmax and the cross-entropies") {
  checkThreadIndependent([](Graph& g, FeedMap& f) {
    const Output logits = floatInput(g, f, "logits", {512, 400}, 1);
    const Output labels = fed(g, f, "labels", ids(512, 400, 2));
    const Output soft = floatInput(g, f, "soft", {512, 400}, 3);
    const Output trueLogits = floatInput(g, f, "true", {512}, 4);
    const Output candidates = fed(g, f, "candidates", ids(400, 400, 5));
    const Output sampled = sampledSoftmaxCrossEntropy(trueLogits, penalizeMatches(logits, labels, candidates, 50.0));
    return Built{{softmax(logits), logSoftmax(logits), sparseSoftmaxCrossEntropy(logits, labels),
                  softmaxCrossEntropy(logits, softmax(soft)), sampled},
                 {logits, trueLogits},
                 {}};
  });
}

TEST_CASE("gathers, scatter-adds and segment sums of many rows") {
  checkThreadIndependent([](Graph& g, FeedMap& f) {
    const Output table = floatInput(g, f, "table", {3000, 64}, 1);
    const Output rows = fed(g, f, "rows", ids(20000, 3000, 2));
    const Output updates = floatInput(g, f, "updates", {20000, 64}, 3);
    return Built{{gather(table, rows), scatterAdd(table, rows, updates), unsortedSegmentSum(updates, rows, 3000)},
                 {table, updates},
                 {}};
  });
}

TEST_CASE("convolutions on each kernel (Winograd, direct, im2col) and pooling") {
  checkThreadIndependent([](Graph& g, FeedMap& f) {
    const Output x = floatInput(g, f, "x", {8, 16, 16, 16}, 1);
    const Output w3 = floatInput(g, f, "w3", {32, 16, 3, 3}, 2), w5 = floatInput(g, f, "w5", {8, 16, 5, 5}, 3);
    Conv2dOptions stride2;
    stride2.stride = {2, 2};
    stride2.padding = {1, 1};
    Conv2dOptions same;
    same.padding = {1, 1};
    Conv2dOptions wide;
    wide.padding = {2, 2};
    return Built{{conv2d(x, w3, same), conv2d(x, w3, stride2), conv2d(x, w5, wide), maxPool2d(x, {2, 2}, {2, 2}),
                  avgPool2d(x, {3, 3}, {1, 1}, {1, 1})},
                 {x, w3, w5},
                 {}};
  });
}

TEST_CASE("batch normalisation and dropout") {
  checkThreadIndependent([](Graph& g, FeedMap& f) {
    const Output x = floatInput(g, f, "x", {16, 32, 24, 24}, 1);
    const Output gamma = floatInput(g, f, "gamma", {32}, 2), beta = floatInput(g, f, "beta", {32}, 3);
    const BatchNormOutputs bn = batchNormTrain(x, gamma, beta, 1e-5);
    return Built{{bn.y, bn.batchMean, bn.batchVar, dropout(x, 0.3, 7)}, {x, gamma, beta}, {}};
  });
}

TEST_CASE("the fused LSTM and GRU, forward and backward, with products exact or rounded to bf16") {
  for (const auto& [dt, rounded] : {std::pair{f32, false}, {f64, false}, {f32, true}}) {
    CAPTURE(dtypeName(dt));
    CAPTURE(rounded);
    checkThreadIndependent([dt, rounded](Graph& g, FeedMap& f) {
      std::optional<Graph::PrecisionScope> scope;
      if (rounded) scope.emplace(g, bf16, Graph::MixedOps::RoundInProducts);
      // 150 hidden units: no whole number of the product kernel's tiles; 46 batch rows: the
      // LSTM's rows in groups of 8 and one of 6, cut 1-4 ways.
      const int64_t steps = 6, batch = 46, input = 96, hidden = 150;
      const Output x = floatInput(g, f, "x", {steps, batch, input}, 1, dt);
      const Output h0 = floatInput(g, f, "h0", {batch, hidden}, 2, dt),
                   c0 = floatInput(g, f, "c0", {batch, hidden}, 3, dt);
      const Output wx = floatInput(g, f, "wx", {input, 4 * hidden}, 4, dt);
      const Output wh = floatInput(g, f, "wh", {hidden, 4 * hidden}, 5, dt),
                   b = floatInput(g, f, "b", {4 * hidden}, 6, dt);
      const LstmOutputs l = lstm(x * 0.2, h0, c0, wx * 0.1, wh * 0.1, b);
      const Output gx = floatInput(g, f, "gx", {batch, input}, 7, dt);
      const Output gwx = floatInput(g, f, "gwx", {input, 3 * hidden}, 8, dt);
      const Output gwh = floatInput(g, f, "gwh", {hidden, 3 * hidden}, 9, dt);
      const Output bx = floatInput(g, f, "bx", {3 * hidden}, 10, dt), bh = floatInput(g, f, "bh", {3 * hidden}, 11, dt);
      const Output gru = gruCell(gx, h0, gwx * 0.1, gwh * 0.1, bx, bh);
      return Built{{l.y, l.hLast, l.cLast, gru}, {x, h0, c0, wx, wh, b, gx, gwx, gwh, bx, bh}, {}};
    });
  }
}

TEST_CASE("squared norms, dense and sparse, and clipping by global norm") {
  checkThreadIndependent([](Graph& g, FeedMap& f) {
    const Output dense = floatInput(g, f, "dense", {700, 300}, 1);
    const Output rows = fed(g, f, "rows", ids(5000, 900, 2));
    const Output values = floatInput(g, f, "values", {5000, 64}, 3);
    const auto [clipped, norm] = clipByGlobalNorm({Grad(dense), Grad::sparse(rows, values, Shape{900, 64})}, 1.0);
    return Built{{squaredNorm(dense), sparseSquaredNorm(rows, values), norm, clipped[0].dense, clipped[1].values},
                 {},
                 {}};
  });
}

TEST_CASE("dense and sparse optimizer updates") {
  checkThreadIndependent([](Graph& g, FeedMap& f) {
    const Output rows = fed(g, f, "rows", ids(6000, 2000, 1));
    const Output table = g.variable("table", f32, {2000, 64}, Initializer::normal(0, 1));
    const Output w = g.variable("w", f32, {64, 300}, Initializer::normal(0, 0.1));
    const Output loss = sum(square(matmul(gather(table, rows), w)));
    Node* step = optim::Adam(0.01).minimize(loss);
    return Built{{loss}, {}, {step}};
  });
}
