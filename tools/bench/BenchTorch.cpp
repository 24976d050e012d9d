// The LibTorch peer of BenchWeft.cpp: the same shapes and models, eager mode, the same thread
// count. Embedding gradients are sparse and updated by SparseAdam, the same lazy rule weft's
// sparse Adam applies.
#include "tools/bench/BenchUtil.h"

#include <torch/torch.h>

#include <cstdlib>

namespace {

int threads = 2;

void gemm() {
  for (int64_t n : bench::kGemmSizes) {
    torch::NoGradGuard noGrad;
    auto a = torch::rand({n, n}), b = torch::rand({n, n});
    const auto t = bench::time([&] { auto c = torch::mm(a, b); }, 3, 20);
    bench::report("gemm_" + std::to_string(n), "libtorch", t, "gflops",
                  2.0 * static_cast<double>(n * n * n) / t.median / 1e9);
  }
}

void elementwise() {
  torch::NoGradGuard noGrad;
  for (const auto& [name, n] : bench::kElementwiseSizes) {
    auto a = torch::rand({n}), b = torch::rand({n});
    const auto t = bench::time([&] { auto c = a + b; }, 3, 20);
    bench::report(name, "libtorch", t, "gb_per_s", 3.0 * 4 * static_cast<double>(n) / t.median / 1e9);
  }
}

void overhead() {
  torch::NoGradGuard noGrad;
  auto x = torch::ones({1});
  const auto t = bench::time(
      [&] {
        auto y = x;
        for (int i = 0; i < bench::kOverheadChain; ++i) y = y + x;
      },
      10, 200);
  bench::report("op_overhead", "libtorch", t, "us_per_op", t.median / bench::kOverheadChain * 1e6);
}

void conv() {
  for (const bench::ConvShape& c : bench::kConvs) {
    auto x = torch::rand({c.batch, c.channels, c.size, c.size}).requires_grad_();
    auto f = torch::rand({c.channels, c.channels, 3, 3}).requires_grad_();
    const auto t = bench::time(
        [&] {
          x.mutable_grad() = torch::Tensor();
          f.mutable_grad() = torch::Tensor();
          auto y = torch::conv2d(x, f, {}, 1, 1);
          y.sum().backward();
        },
        2, 10);
    bench::report(c.name, "libtorch", t, "gflops", c.flops() / t.median / 1e9);
  }
}

void mlp() {
  for (const bench::MlpShape& m : bench::kMlps) {
    torch::nn::Sequential net;
    int64_t width = m.inputs;
    for (int64_t i = 0; i < m.layers; ++i) {
      net->push_back(torch::nn::Linear(width, m.hidden));
      net->push_back(torch::nn::ReLU());
      width = m.hidden;
    }
    net->push_back(torch::nn::Linear(width, m.classes));
    torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-3));
    auto x = torch::rand({m.batch, m.inputs});
    auto y = torch::randint(0, m.classes, {m.batch}, torch::kLong);
    const auto t = bench::time(
        [&] {
          opt.zero_grad();
          auto loss = torch::nn::functional::cross_entropy(net->forward(x), y);
          loss.backward();
          opt.step();
        },
        5, 50);
    bench::report(m.name, "libtorch", t, "examples_per_s", static_cast<double>(m.batch) / t.median);
  }
}

void lm() {
  for (const bench::LmShape& m : bench::kLms) {
    torch::nn::Embedding embedding(torch::nn::EmbeddingOptions(m.vocab, m.embed).sparse(true));
    torch::nn::LSTM lstm(torch::nn::LSTMOptions(m.embed, m.hidden));
    torch::nn::Linear softmax(m.hidden, m.vocab);
    std::vector<torch::Tensor> dense = lstm->parameters();
    for (auto& p : softmax->parameters()) dense.push_back(p);
    torch::optim::Adam opt(dense, torch::optim::AdamOptions(1e-3));
    auto tokens = torch::randint(0, m.vocab, {m.steps, m.batch}, torch::kLong);
    auto targets = torch::randint(0, m.vocab, {m.steps * m.batch}, torch::kLong);
    // LibTorch's C++ API has no SparseAdam: the sparse rows are updated by hand with the lazy
    // Adam rule, as weft's SparseApplyAdam does.
    auto m1 = torch::zeros({m.vocab, m.embed}), v1 = torch::zeros({m.vocab, m.embed});
    int64_t stepCount = 0;
    const auto t = bench::time(
        [&] {
          opt.zero_grad();
          embedding->weight.mutable_grad() = torch::Tensor();
          auto out = std::get<0>(lstm->forward(embedding->forward(tokens)));
          auto loss = torch::nn::functional::cross_entropy(softmax->forward(out.reshape({-1, m.hidden})), targets);
          loss.backward();
          opt.step();
          torch::NoGradGuard noGrad;
          auto grad = embedding->weight.grad().coalesce();
          auto rows = grad.indices()[0];
          auto g = grad.values();
          ++stepCount;
          auto mr = m1.index_select(0, rows).mul_(0.9).add_(g, 0.1);
          auto vr = v1.index_select(0, rows).mul_(0.999).addcmul_(g, g, 0.001);
          m1.index_copy_(0, rows, mr);
          v1.index_copy_(0, rows, vr);
          const double c1 = 1 - std::pow(0.9, stepCount), c2 = 1 - std::pow(0.999, stepCount);
          auto update = (mr / c1) / ((vr / c2).sqrt() + 1e-8) * 1e-3;
          embedding->weight.index_add_(0, rows, -update);
        },
        3, 20);
    bench::report(m.name, "libtorch", t, "words_per_s", static_cast<double>(m.steps * m.batch) / t.median);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) threads = std::atoi(argv[1]);
  torch::set_num_threads(threads);
  torch::manual_seed(1);
  gemm();
  elementwise();
  overhead();
  conv();
  mlp();
  lm();
}
