// Layer options of nn/Layers.h: Embedding's gradient, sparse rows by default or the dense table
// gradient on request (recorded as such in the gradient links, which decide lazy updates and the
// servers); LSTM's batch-first layout and PyTorch's two biases.
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "nn/Layers.h"
#include "ops/Ops.h"
#include "optim/Optimizer.h"

#include <cmath>

using namespace weft;
using weft::testing::randomTensor;

namespace {

/// Feeds ids {3, 7, 3} through an Embedding of 10 rows of 2 and returns the table's gradient link
/// and its gradient, densely, for the loss sum(rows * [1, 2]).
std::pair<GradientLink, std::vector<double>> tableGradient(nn::EmbeddingGradient kind) {
  Graph g;
  nn::Embedding embedding(g, "emb", 10, 2, f64, kind);
  const Output ids = g.placeholder("ids", i32, {-1});
  const Output loss = sum(embedding(ids) * g.constant(Tensor::fromVector<double>({1, 2}, {1, 2})));
  const Grad grad = gradients(loss, {embedding.table})[0];
  REQUIRE(g.gradientLinks().size() == 1);
  Session s(g);
  const FeedMap feeds{{ids, Tensor::fromVector<int32_t>({3, 7, 3}, {3})}};
  return {g.gradientLinks()[0], s.run({toDense(grad)}, feeds)[0].toDoubles()};
}

}  // namespace

TEST_CASE("an Embedding's table gradient is sparse by default and dense on request, with the same values") {
  const auto [sparseLink, sparse] = tableGradient(nn::EmbeddingGradient::Sparse);
  const auto [denseLink, dense] = tableGradient(nn::EmbeddingGradient::Dense);
  CHECK(sparseLink.sparse);
  CHECK_FALSE(denseLink.sparse);
  CHECK(denseLink.denseShape == Shape{10, 2});
  std::vector<double> expected(20, 0.0);
  expected[3 * 2] = 2, expected[3 * 2 + 1] = 4;  // row 3 looked up twice
  expected[7 * 2] = 1, expected[7 * 2 + 1] = 2;
  CHECK(sparse == expected);
  CHECK(dense == expected);
}

TEST_CASE("with a dense gradient Adam keeps moving rows the batch did not look up; with a sparse one it does not") {
  for (const auto kind : {nn::EmbeddingGradient::Sparse, nn::EmbeddingGradient::Dense}) {
    const bool dense = kind == nn::EmbeddingGradient::Dense;
    CAPTURE(dense);
    Graph g;
    nn::Embedding embedding(g, "emb", 4, 2, f64, kind);
    const Output ids = g.placeholder("ids", i32, {-1});
    Node* step = optim::Adam(0.1).minimize(sum(square(embedding(ids))));
    Session s(g);
    s.run({}, {{ids, Tensor::fromVector<int32_t>({1}, {1})}}, {step});
    const std::vector<double> afterFirst = s.run({embedding.table})[0].toDoubles();
    s.run({}, {{ids, Tensor::fromVector<int32_t>({2}, {1})}}, {step});
    const std::vector<double> afterSecond = s.run({embedding.table})[0].toDoubles();
    // Row 1, looked up only in the first step, moves in the second under the dense update alone.
    const bool row1Moved = afterSecond[2] != afterFirst[2] || afterSecond[3] != afterFirst[3];
    CHECK(row1Moved == dense);
    CHECK(afterSecond[4] != afterFirst[4]);  // row 2 moves either way
    CHECK(afterSecond[0] == afterFirst[0]);  // row 0 never looked up, never moved
  }
}

TEST_CASE("a batch-first LSTM gives the time-major LSTM's outputs, transposed") {
  const Tensor x = randomTensor(f64, {2, 5, 3}, 11);  // (B, T, in)
  auto run = [&](bool batchFirst) {
    Graph g;  // the same seed and names: the same initial weights
    nn::LSTM lstm(g, "lstm", 3, 4, f64, {.batchFirst = batchFirst});
    const Output given = g.constant(x);
    const LstmOutputs out = lstm(batchFirst ? given : transpose(given, {1, 0, 2}));
    Session s(g);
    return s.run({batchFirst ? out.y : transpose(out.y, {1, 0, 2}), out.hLast});
  };
  const std::vector<Tensor> first = run(true), major = run(false);
  CHECK(first[0].shape() == Shape{2, 5, 4});
  CHECK(first[0].toDoubles() == major[0].toDoubles());
  CHECK(first[1].toDoubles() == major[1].toDoubles());
}

TEST_CASE("an LSTM with two biases adds them, each drawn as PyTorch draws it, and each gets the bias gradient") {
  Graph g;
  nn::LSTM lstm(g, "lstm", 3, 4, f64, {.twoBiases = true});
  REQUIRE(lstm.bih.valid());
  CHECK(lstm.bih.node()->name == "lstm/bias_ih");
  CHECK(lstm.bhh.node()->name == "lstm/bias_hh");
  const Output x = g.constant(randomTensor(f64, {5, 2, 3}, 3));
  const Output y = lstm(x).y;
  const Output loss = sum(square(y));
  const std::vector<Grad> grads = gradients(loss, {lstm.bih, lstm.bhh});
  Session s(g);
  const std::vector<Tensor> got = s.run({lstm.bih, lstm.bhh, y, toDense(grads[0]), toDense(grads[1])});
  const double limit = 1 / std::sqrt(4.0);
  for (const Tensor& bias : {got[0], got[1]})
    for (const double v : bias.toDoubles()) CHECK((v >= -limit && v <= limit));
  CHECK(got[0].toDoubles() != got[1].toDoubles());
  // The same LSTM op with their sum as its one bias gives the same outputs.
  const Output summed = g.constant(Tensor::fromVector<double>(
      [&] {
        std::vector<double> b = got[0].toDoubles(), c = got[1].toDoubles();
        for (size_t i = 0; i < b.size(); ++i) b[i] += c[i];
        return b;
      }(),
      {16}));
  const Output zeros = g.constant(Tensor::zeros(f64, {2, 4}));
  CHECK(s.run({weft::lstm(x, zeros, zeros, lstm.wx, lstm.wh, summed).y})[0].toDoubles() == got[2].toDoubles());
  CHECK(got[3].toDoubles() == got[4].toDoubles());
}
