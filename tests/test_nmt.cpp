// The NMT model: graph shapes, training signal, gradients, decoding, and the zoo model.
#include "models/Nmt.h"
#include "autodiff/Gradients.h"
#include "data/Translation.h"
#include "tests/TestUtil.h"

#include <fmt/format.h>

#include <cmath>

using namespace weft;
using namespace weft::models;

namespace {

/// Sentence pairs of a toy language with words 4..9: the target reverses the source and adds 1
/// to each word id below 9.
std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> toyPairs() {
  const std::vector<std::vector<int32_t>> sources{{4, 5, 6}, {7, 8}, {9, 4, 7, 5}, {6, 6, 8, 9, 4}};
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> pairs;
  for (const auto& s : sources) {
    std::vector<int32_t> t(s.rbegin(), s.rend());
    for (int32_t& w : t) w = w < 9 ? w + 1 : w;
    pairs.emplace_back(s, t);
  }
  return pairs;
}

data::Batch toyBatch(size_t count) {
  std::vector<data::Example> examples;
  for (const auto& [s, t] : toyPairs()) examples.push_back(data::translationExample(s, t));
  std::vector<const data::Example*> pointers;
  for (size_t i = 0; i < count; ++i) pointers.push_back(&examples[i]);
  data::BatchOptions options;
  options.padded = {"source", "target_in", "target_out"};
  return data::collate(pointers, options);
}

NmtConfig toyConfig(int64_t embedding, int64_t hidden, DType dtype) {
  NmtConfig c;
  c.sourceVocab = c.targetVocab = 10;
  c.embedding = embedding;
  c.hidden = hidden;
  c.dtype = dtype;
  return c;
}

/// A model trained on the toy pairs until it reproduces them.
struct Overfit {
  Graph g;
  NmtNet net;
  std::unique_ptr<Session> session;
  double loss = 0;

  Overfit() {
    net = buildNmt(g, toyConfig(16, 32, f32));
    Node* step = optim::Adam(0.02).minimize(net.loss);
    session = std::make_unique<Session>(g, SessionOptions{1});
    const FeedMap feeds = feedsFor(g, toyBatch(4));
    for (int i = 0; i < 150; ++i) loss = session->run({net.loss}, feeds, {step})[0].item();
  }
};

std::vector<std::vector<int32_t>> toySources() {
  std::vector<std::vector<int32_t>> sources;
  for (auto [s, t] : toyPairs()) {
    s.push_back(data::kEos);
    sources.push_back(s);
  }
  return sources;
}

/// Compares autodiff's gradient of the loss for `name` with central differences, element by
/// element, perturbing the variable through the session.
void checkVariableGradient(Session& s, const NmtNet& net, const std::string& name, const FeedMap& feeds) {
  Graph& g = s.graph();
  Node* variable = g.find(name);
  REQUIRE(variable != nullptr);
  const Tensor analytic = s.run({toDense(gradients(net.loss, {variable->output()})[0])}, feeds)[0];
  const Tensor original = s.variable(variable).clone();
  const double eps = 1e-6;
  for (int64_t i = 0; i < original.numel(); ++i) {
    Tensor t = original.clone();
    t.data<double>()[i] += eps;
    s.setVariable(name, t);
    const double plus = s.run({net.loss}, feeds)[0].item();
    t.data<double>()[i] -= 2 * eps;
    s.setVariable(name, t);
    const double minus = s.run({net.loss}, feeds)[0].item();
    const double numeric = (plus - minus) / (2 * eps);
    CHECK_MESSAGE(std::abs(analytic.at(i) - numeric) <= 1e-6 * (1 + std::abs(numeric)),
                  name << "[" << i << "]: autodiff " << analytic.at(i) << ", numeric " << numeric);
  }
  s.setVariable(name, original);
}

}  // namespace

TEST_CASE("nmt: builds with the documented shapes") {
  Graph g;
  const NmtNet net = buildNmt(g, toyConfig(5, 6, f32));
  Session s(g, {1});
  const data::Batch batch = toyBatch(3);
  const std::vector<Tensor> r =
      s.run({net.loss, net.encoded, net.initialH, net.initialC, net.tokenCount}, feedsFor(g, batch));
  const int64_t ts = batch.at("source").shape()[1];
  CHECK(r[0].shape().rank() == 0);
  CHECK(std::abs(r[0].item() - std::log(10.0)) < 0.5);  // near uniform at the start
  CHECK(r[1].shape() == Shape{3, ts, 6});
  CHECK(r[2].shape() == Shape{3, 6});
  CHECK(r[3].shape() == Shape{3, 6});
  CHECK(r[4].item() == 4 + 3 + 5);  // real target tokens, </s> included
  const Tensor step = s.run({net.step.logProbs}, {{net.step.previous, Tensor::full(i32, {3}, data::kBos)},
                                                 {net.step.h, r[2]},
                                                 {net.step.c, r[3]},
                                                 {net.step.encoded, r[1]},
                                                 {net.step.sourceMask, batch.at("source_mask")}})[0];
  CHECK(step.shape() == Shape{3, 10});
}

TEST_CASE("nmt: padding does not change a sentence's loss") {
  // Sentences 0 and 1 alone, and together (sentence 1 padded to sentence 0's length): same loss.
  Graph g;
  const NmtNet net = buildNmt(g, toyConfig(5, 6, f64));
  Session s(g, {1});
  const double both = s.run({net.tokenLossSum}, feedsFor(g, toyBatch(2)))[0].item();
  std::vector<data::Example> examples;
  for (const auto& [src, tgt] : toyPairs()) examples.push_back(data::translationExample(src, tgt));
  data::BatchOptions options;
  options.padded = {"source", "target_in", "target_out"};
  const double first = s.run({net.tokenLossSum}, feedsFor(g, data::collate({&examples[0]}, options)))[0].item();
  const double second = s.run({net.tokenLossSum}, feedsFor(g, data::collate({&examples[1]}, options)))[0].item();
  CHECK(both == doctest::Approx(first + second).epsilon(1e-12));
}

TEST_CASE("nmt: one training step lowers the loss on a fixed batch") {
  Graph g;
  const NmtNet net = buildNmt(g, toyConfig(8, 16, f32));
  Node* step = optim::Adam(0.01).minimize(net.loss);
  Session s(g, {1});
  const FeedMap feeds = feedsFor(g, toyBatch(4));
  const double before = s.run({net.loss}, feeds, {step})[0].item();
  const double after = s.run({net.loss}, feeds)[0].item();
  CHECK(after < before);
}

TEST_CASE("nmt: gradients match central differences on a tiny f64 instance") {
  Graph g;
  const NmtNet net = buildNmt(g, toyConfig(3, 4, f64));
  Session s(g, {1});
  const FeedMap feeds = feedsFor(g, toyBatch(3));
  for (const char* name : {"encoder_backward/wx", "decoder/wh", "attentional/weight", "init_c/weight",
                           "source_embedding/table"}) {
    checkVariableGradient(s, net, name, feeds);
  }
}

TEST_CASE("nmt: greedy decoding of an overfit model reproduces its targets") {
  Overfit m;
  CHECK(m.loss < 0.05);
  const auto decoded = greedyDecode(*m.session, m.net, toySources(), 20);
  const auto pairs = toyPairs();
  for (size_t i = 0; i < pairs.size(); ++i) CHECK(decoded[i] == pairs[i].second);
  const auto beam = beamDecode(*m.session, m.net, toySources(), 3, 20);
  for (size_t i = 0; i < pairs.size(); ++i) CHECK(beam[i] == pairs[i].second);
}

TEST_CASE("nmt: beam search of width 1 equals greedy decoding") {
  // An untrained model, so that the outputs are arbitrary and often run to the length limit.
  Graph g;
  const NmtNet net = buildNmt(g, toyConfig(8, 16, f32));
  Session s(g, {1});
  const auto greedy = greedyDecode(s, net, toySources(), 7);
  CHECK(greedy == beamDecode(s, net, toySources(), 1, 7));
  bool someLong = false;
  for (const auto& h : greedy) someLong = someLong || h.size() == 7;
  CHECK(someLong);
}

TEST_CASE("nmt: the zoo model trains on the synthetic task and reports bleu and perplexity") {
  auto model = makeNmtModel();
  for (const ModelOption& o : model->options()) {
    if (o.name == "vocab") *std::get<int64_t*>(o.target) = 200;
    if (o.name == "train-size") *std::get<int64_t*>(o.target) = 300;
    if (o.name == "test-size") *std::get<int64_t*>(o.target) = 30;
    if (o.name == "hidden") *std::get<int64_t*>(o.target) = 16;
    if (o.name == "embedding") *std::get<int64_t*>(o.target) = 8;
    if (o.name == "beam") *std::get<int64_t*>(o.target) = 2;
    if (o.name == "eval-batch") *std::get<int64_t*>(o.target) = 16;
  }
  Graph g;
  CommonOptions common;
  common.batchSize = 16;
  model->build(g, common);
  CHECK(model->targetMetric() == "bleu");
  CHECK(model->higherIsBetter());
  const OptimizerSpec spec = model->defaultOptimizer();
  Node* step = optim::Adam(spec.lr).minimize(model->loss(), {spec.clipNorm, {}, std::nullopt});
  Session s(g, {1});
  const data::Batch batch = model->trainData().next();
  CHECK(batch.at("source").shape()[0] == 16);
  CHECK(model->itemsIn(batch).second > 16 * 4);
  s.run({model->loss()}, feedsFor(g, batch), {step});
  const auto metrics = model->evaluate(s, 0);
  REQUIRE(metrics.count("bleu"));
  REQUIRE(metrics.count("perplexity"));
  CHECK(metrics.at("bleu") >= 0);
  CHECK(metrics.at("bleu") <= 100);
  CHECK(metrics.at("perplexity") > 1);
  CHECK(std::isfinite(metrics.at("perplexity")));
}

TEST_CASE("nmt: --data must name two files") {
  auto model = makeNmtModel();
  Graph g;
  CommonOptions common;
  common.data = "only-one-file";
  CHECK(contains(errorOf([&] { model->build(g, common); }), "SOURCE,TARGET"));
}

TEST_CASE("nmt: --streams that do not divide the batch, exceed the pairs or lack --data are refused, naming it") {
  TempDir dir;
  std::string source, target;
  for (int i = 0; i < 40; ++i) source += fmt::format("s{} s{}\n", i % 7, i % 5), target += fmt::format("t{}\n", i % 6);
  const std::string data = dir.write("a.src", source) + "," + dir.write("a.tgt", target);
  auto build = [&](int64_t streams, const std::string& withData, int64_t batch) {
    auto model = makeNmtModel();
    for (const ModelOption& o : model->options()) {
      if (o.name == "streams") *std::get<int64_t*>(o.target) = streams;
      if (o.name == "test-size") *std::get<int64_t*>(o.target) = 4;  // 36 pairs to train on
    }
    Graph g;
    CommonOptions common;
    common.batchSize = batch;
    common.data = withData;
    model->build(g, common);
  };
  auto refusal = [&](int64_t streams, const std::string& withData, int64_t batch) {
    return errorOf([&] { build(streams, withData, batch); });
  };
  CHECK(contains(refusal(3, data, 8), "nmt: --streams 3 must divide the batch of 8"));
  CHECK(contains(refusal(0, data, 8), "nmt: --streams 0 must divide the batch of 8"));
  CHECK(contains(refusal(2, "", 8),
                 "nmt: --streams 2 reads parallel text (--data) in streams; the built-in task has "
                 "none"));
  CHECK(contains(refusal(40, data, 40), "nmt: --streams 40 must be 1 to the 36 training pairs of"));
  CHECK_NOTHROW(build(4, data, 8));
}
