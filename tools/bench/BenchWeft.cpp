// weft's benchmarks: GEMM (BenchEigen.cpp measures Eigen called directly), elementwise bandwidth, per-op engine
// overhead, 3x3 convolutions, and training steps of the MLPs and an LSTM language model.
#include "tools/bench/BenchUtil.h"

#include "core/Random.h"
#include "autodiff/Gradients.h"
#include "core/Session.h"
#include "nn/Layers.h"
#include "optim/Optimizer.h"
#include "testing/OpTest.h"

#include <cstdlib>

using namespace weft;

namespace {

int threads = 2;

/// Square products in `dtype` (bf16: weft's bf16 kernel where the CPU has AVX512_BF16, f32 arithmetic
/// elsewhere), reported as PREFIX_N.
void gemm(DType dtype, const std::string& prefix) {
  for (int64_t n : bench::kGemmSizes) {
    Graph g;
    Output a = g.placeholder("a", dtype, {n, n}), b = g.placeholder("b", dtype, {n, n});
    Output c = matmul(a, b);
    Session s(g, {threads, false});
    const FeedMap feeds{{a, testing::randomTensor(f32, {n, n}, 1).cast(dtype)},
                        {b, testing::randomTensor(f32, {n, n}, 2).cast(dtype)}};
    const auto t = bench::time([&] { s.run({c}, feeds); }, 3, 20);
    bench::report(prefix + std::to_string(n), "weft", t, "gflops",
                  2.0 * static_cast<double>(n * n * n) / t.median / 1e9);
  }
}

void elementwise() {
  for (const auto& [name, n] : bench::kElementwiseSizes) {
    Graph g;
    Output a = g.placeholder("a", f32, {n}), b = g.placeholder("b", f32, {n});
    Output c = a + b;
    Session s(g, {threads, false});
    const FeedMap feeds{{a, testing::randomTensor(f32, {n}, 1)}, {b, testing::randomTensor(f32, {n}, 2)}};
    const auto t = bench::time([&] { s.run({c}, feeds); }, 3, 20);
    bench::report(name, "weft", t, "gb_per_s", 3.0 * 4 * static_cast<double>(n) / t.median / 1e9);
  }
}

void overhead() {
  Graph g;
  Output x = g.placeholder("x", f32, {1});
  Output y = x;
  for (int i = 0; i < bench::kOverheadChain; ++i) y = y + x;
  Session s(g, {threads, false});
  const FeedMap feeds{{x, Tensor::full(f32, {1}, 1)}};
  const auto t = bench::time([&] { s.run({y}, feeds); }, 10, 200);
  bench::report("op_overhead", "weft", t, "us_per_op", t.median / bench::kOverheadChain * 1e6);
}

void conv() {
  for (const bench::ConvShape& c : bench::kConvs) {
    Graph g;
    const Shape xs{c.batch, c.channels, c.size, c.size}, fs{c.channels, c.channels, 3, 3};
    Output x = g.placeholder("x", f32, xs), f = g.placeholder("f", f32, fs);
    Output y = conv2d(x, f, {{1, 1}, {1, 1}, {1, 1}});
    const std::vector<Grad> grads = gradients(sum(y), {x, f});
    Session s(g, {threads, false});
    const FeedMap feeds{{x, testing::randomTensor(f32, xs, 1)}, {f, testing::randomTensor(f32, fs, 2)}};
    const auto t = bench::time([&] { s.run({y, grads[0].dense, grads[1].dense}, feeds); }, 2, 10);
    bench::report(c.name, "weft", t, "gflops", c.flops() / t.median / 1e9);
  }
}

void mlp() {
  for (const bench::MlpShape& m : bench::kMlps) {
    Graph g;
    Output x = g.placeholder("x", f32, {m.batch, m.inputs});
    Output y = g.placeholder("y", i64, {m.batch});
    Output h = x;
    int64_t width = m.inputs;
    for (int64_t i = 0; i < m.layers; ++i) {
      h = relu(nn::Linear(g, "fc" + std::to_string(i), width, m.hidden)(h));
      width = m.hidden;
    }
    Output loss = mean(sparseSoftmaxCrossEntropy(nn::Linear(g, "out", width, m.classes)(h), y));
    Node* step = optim::Adam(1e-3).minimize(loss);
    Session s(g, {threads, false});
    const FeedMap feeds{{x, testing::randomTensor(f32, {m.batch, m.inputs}, 1)},
                        {y, testing::randomInts(i64, {m.batch}, 0, m.classes, 2)}};
    const auto t = bench::time([&] { s.run({loss}, feeds, {step}); }, 5, 50);
    bench::report(m.name, "weft", t, "examples_per_s", static_cast<double>(m.batch) / t.median);
  }
}

void lm() {
  for (const bench::LmShape& m : bench::kLms) {
    Graph g;
    Output tokens = g.placeholder("tokens", i64, {m.steps, m.batch});
    Output targets = g.placeholder("targets", i64, {m.steps * m.batch});
    nn::Embedding embedding(g, "embedding", m.vocab, m.embed);
    nn::LSTM lstm(g, "lstm", m.embed, m.hidden);
    nn::Linear softmax(g, "softmax", m.hidden, m.vocab);
    Output hidden = lstm(embedding(tokens)).y;                     // (T, B, H)
    Output logits = softmax(reshape(hidden, {-1, m.hidden}));       // (T*B, V)
    Output loss = mean(sparseSoftmaxCrossEntropy(logits, targets));
    Node* step = optim::Adam(1e-3).minimize(loss);
    Session s(g, {threads, false});
    const FeedMap feeds{{tokens, testing::randomInts(i64, {m.steps, m.batch}, 0, m.vocab, 1)},
                        {targets, testing::randomInts(i64, {m.steps * m.batch}, 0, m.vocab, 2)}};
    const auto t = bench::time([&] { s.run({loss}, feeds, {step}); }, 3, 20);
    bench::report(m.name, "weft", t, "words_per_s", static_cast<double>(m.steps * m.batch) / t.median);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) threads = std::atoi(argv[1]);
  gemm(f32, "gemm_");
  gemm(bf16, "bf16_gemm_");
  elementwise();
  overhead();
  conv();
  mlp();
  lm();
}
