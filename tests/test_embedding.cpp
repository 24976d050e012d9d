// nn::Embedding's gradient: sparse rows by default, or the dense table gradient on request,
// recorded as such in the graph's gradient links (which decide lazy updates and the servers).
#include "tests/TestUtil.h"

#include "autodiff/Gradients.h"
#include "nn/Layers.h"
#include "ops/Ops.h"
#include "optim/Optimizer.h"

using namespace weft;

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
