// Tests of the LSTM language model: the candidate sampler, the sampled softmax against the full
// softmax, the model's graph, a training step, gradients, evaluation and text-corpus mode.
#include "autodiff/Gradients.h"
#include "models/Lm.h"
#include "tests/TestUtil.h"

#include <cmath>
#include <filesystem>
#include <fstream>

using namespace weft;
using namespace weft::models;

namespace {

LmConfig tinyConfig() {
  LmConfig c;
  c.embed = 6;
  c.hidden = 7;
  c.sampled = 12;
  c.batchSize = 4;
  c.evalBatch = 5;
  c.vocab = 30;
  c.classes = 3;
  c.trainSentences = 40;
  c.heldoutSentences = 12;
  return c;
}

struct TinyLm {
  LmModel model;
  Graph g;
  TinyLm(LmConfig config, const std::string& dtype = "f32", const std::string& data = "") {
    model.config() = config;
    CommonOptions common;
    common.dtype = dtype;
    common.data = data;
    model.build(g, common);
  }
};

double run(Session& s, Output x, const data::Batch& b) { return s.run({x}, feedsFor(s.graph(), b))[0].item(); }

/// Feeds for the loss helpers: hidden (N, P), weights (V, P), bias (V), targets (N), mask (N).
struct SoftmaxCase {
  Graph g;
  Output hidden = g.placeholder("hidden", f64, {-1, 3});
  Output weight = g.placeholder("weight", f64, {8, 3});
  Output bias = g.placeholder("bias", f64, {8});
  Output targets = g.placeholder("targets", i32, {-1});
  Output mask = g.placeholder("mask", f64, {-1});
  Output candidates = g.placeholder("candidates", i32, {-1});
  Output candidateLogQ = g.placeholder("candidate_logq", f64, {-1});
  Output targetLogQ = g.placeholder("target_logq", f64, {-1});
  FeedMap feeds{{hidden, testing::randomTensor(f64, {5, 3}, 1)},
                {weight, testing::randomTensor(f64, {8, 3}, 2)},
                {bias, testing::randomTensor(f64, {8}, 3)},
                {targets, Tensor::fromVector<int32_t>({1, 7, 3, 3, 0}, {5})},
                {mask, Tensor::fromVector<double>({1, 1, 1, 0, 1}, {5})}};

  double sampled(const std::vector<int32_t>& ids, const std::vector<double>& idLogQ,
                 const std::vector<double>& targetQ) {
    const Output loss = sampledSoftmaxLoss(hidden, weight, bias, targets, mask, candidates, candidateLogQ, targetLogQ);
    FeedMap f = feeds;
    const auto n = static_cast<int64_t>(ids.size());
    f.push_back({candidates, Tensor::fromVector(ids, {n})});
    f.push_back({candidateLogQ, Tensor::fromVector(idLogQ, {n})});
    f.push_back({targetLogQ, Tensor::fromVector(targetQ, {5})});
    Session s(g, {1});
    return s.run({loss}, f)[0].item();
  }
  double full() {
    Session s(g, {1});
    return s.run({fullSoftmaxLoss(hidden, weight, bias, targets, mask)}, feeds)[0].item();
  }
};

/// Autodiff gradient of `loss` for `variable` against central differences of the loss, for a
/// few elements, perturbing the variable's value in the session.
void checkVariableGradient(Session& s, Output loss, const std::string& variable, const data::Batch& batch) {
  Graph& g = s.graph();
  Node* v = g.find(variable);
  REQUIRE(v != nullptr);
  const Output grad = toDense(gradients(loss, {v->output()})[0]);
  const FeedMap feeds = feedsFor(g, batch);
  const Tensor analytic = s.run({grad}, feeds)[0];
  Tensor& value = s.variable(v);
  const int64_t n = value.numel();
  double checked = 0;
  for (int64_t k = 0; k < 6; ++k) {
    const int64_t i = (k * 7919) % n;
    double* p = value.data<double>() + i;
    const double saved = *p, h = 1e-6;
    *p = saved + h;
    const double up = s.run({loss}, feeds)[0].item();
    *p = saved - h;
    const double down = s.run({loss}, feeds)[0].item();
    *p = saved;
    const double numeric = (up - down) / (2 * h);
    CHECK_MESSAGE(std::abs(analytic.at(i) - numeric) < 1e-6 + 1e-5 * std::abs(numeric),
                  variable << "[" << i << "]: autodiff " << analytic.at(i) << " vs numeric " << numeric);
    checked += std::abs(numeric);
  }
  CHECK(checked > 0);  // at least one element the loss depends on
}

}  // namespace

TEST_CASE("the log-uniform sampler's draws follow its probabilities and are reproducible") {
  const LogUniformSampler sampler(20);
  double total = 0;
  for (int64_t k = 0; k < 20; ++k) total += sampler.prob(k);
  CHECK(total == doctest::Approx(1.0));
  CHECK(sampler.prob(0) / sampler.prob(9) == doctest::Approx(std::log(2.0) / std::log(11.0 / 10.0)));
  const auto a = sampler.sample(40000, 5, 3);
  CHECK(a == sampler.sample(40000, 5, 3));
  CHECK(a != sampler.sample(40000, 5, 4));
  std::vector<double> freq(20);
  for (const int32_t id : a) {
    REQUIRE((id >= 0 && id < 20));
    freq[static_cast<size_t>(id)] += 1.0 / 40000;
  }
  for (int64_t k = 0; k < 20; ++k) CHECK(freq[static_cast<size_t>(k)] == doctest::Approx(sampler.prob(k)).epsilon(0.1));
  CHECK(contains(errorOf([&] { sampler.prob(20); }), "id 20"));
}

TEST_CASE("sampling every class once gives the full softmax loss, with accidental hits removed") {
  SoftmaxCase c;
  const double full = c.full();
  std::vector<int32_t> all;
  for (int32_t k = 0; k < 8; ++k) all.push_back(k);
  // A logQ that is the same for every id shifts all logits equally: the loss is exact.
  CHECK(c.sampled(all, std::vector<double>(8, 0.7), std::vector<double>(5, 0.7)) ==
        doctest::Approx(full).epsilon(1e-12));
  // Without the removal of the target among the candidates it would be counted twice.
  CHECK(c.sampled(all, std::vector<double>(8, 0.0), std::vector<double>(5, 0.0)) ==
        doctest::Approx(full).epsilon(1e-12));
  // The correction matters: a logQ varying by id changes the loss.
  std::vector<double> varying(8);
  for (size_t k = 0; k < 8; ++k) varying[k] = 0.3 * static_cast<double>(k);
  CHECK(std::abs(c.sampled(all, varying, std::vector<double>(5, 0.0)) - full) > 0.05);
}

TEST_CASE("with many log-uniform samples the sampled loss is the importance-sampling estimate") {
  // With S draws corrected by log(S p), the candidates' exp-logits sum to about Z - exp(l_t)
  // (Z: the full normaliser; the target's own draws are removed), so each position's loss tends
  // to log(Z - exp(l_t) + exp(l_t) / (S p_t)) - l_t + log(S p_t).
  SoftmaxCase c;
  const LogUniformSampler sampler(8);
  const int64_t draws = 200000;
  const auto ids = sampler.sample(draws, 11, 0);
  std::vector<double> logQ;
  for (const int32_t id : ids) logQ.push_back(std::log(static_cast<double>(draws) * sampler.prob(id)));
  const std::vector<int32_t> targets{1, 7, 3, 3, 0};
  const std::vector<double> mask{1, 1, 1, 0, 1};
  std::vector<double> targetQ;
  for (const int32_t t : targets) targetQ.push_back(std::log(static_cast<double>(draws) * sampler.prob(t)));
  const std::vector<double> h = c.feeds[0].second.toDoubles(), w = c.feeds[1].second.toDoubles(),
                            b = c.feeds[2].second.toDoubles();
  double expected = 0;
  for (size_t i = 0; i < 5; ++i) {
    std::vector<double> logits(8);
    double z = 0;
    for (size_t k = 0; k < 8; ++k) {
      logits[k] = b[k];
      for (size_t d = 0; d < 3; ++d) logits[k] += h[i * 3 + d] * w[k * 3 + d];
      z += std::exp(logits[k]);
    }
    const double lt = logits[static_cast<size_t>(targets[i])];
    const double tq = targetQ[i];
    expected += mask[i] * (std::log(z - std::exp(lt) + std::exp(lt - tq)) - lt + tq);
  }
  expected /= 4;
  CHECK(c.sampled(ids, logQ, targetQ) == doctest::Approx(expected).epsilon(0.01));
  // Uncorrected, the many duplicates of frequent ids dominate the normaliser.
  CHECK(std::abs(c.sampled(ids, std::vector<double>(ids.size(), 0.0), targetQ) - expected) > 1.0);
}

TEST_CASE("the LM builds with batches of the placeholders' shapes") {
  TinyLm lm(tinyConfig());
  CHECK(lm.model.vocabSize() == 34);
  const data::Batch b = lm.model.trainData().next();
  const Tensor& tokens = b.at("tokens");
  REQUIRE(tokens.rank() == 2);
  CHECK(tokens.shape()[0] == 4);
  CHECK(b.at("targets").shape() == tokens.shape());
  CHECK(b.at("targets_logq").shape() == tokens.shape());
  CHECK(b.at("candidates").shape() == Shape{12});
  CHECK(b.at("candidates_logq").shape() == Shape{12});
  CHECK(lm.model.loss().shape().rank() == 0);
  CHECK(lm.model.evalLossSum().shape().rank() == 0);
  double words = 0;
  for (const double m : b.at("targets_mask").toDoubles()) words += m;
  CHECK(lm.model.itemsIn(b) == std::pair<std::string, double>{"words", words});
  CHECK(lm.g.find("embedding/table") != nullptr);
  CHECK(lm.g.find("softmax/weight")->outputs[0].shape == Shape{34, 7});
  // The loss starts near log(vocab) (the full softmax's) and is finite.
  Session s(lm.g, {1});
  CHECK(std::isfinite(run(s, lm.model.loss(), b)));
  const auto metrics = lm.model.evaluate(s, 0);
  CHECK(metrics.at("perplexity") == doctest::Approx(std::exp(metrics.at("loss"))));
  CHECK(metrics.at("perplexity") == doctest::Approx(34).epsilon(0.3));
  CHECK(metrics.at("true_perplexity") > 1.0);
  CHECK(metrics.at("true_perplexity") < metrics.at("perplexity"));
}

TEST_CASE("one training step on a fixed batch lowers the loss (full and sampled softmax)") {
  for (const int64_t sampled : {int64_t{0}, int64_t{12}}) {
    LmConfig config = tinyConfig();
    config.sampled = sampled;
    config.projection = 5;
    TinyLm lm(config);
    Node* step = optim::Adam(0.01).minimize(lm.model.loss(), {1.0, {}, std::nullopt});
    Session s(lm.g, {1});
    const data::Batch b = lm.model.trainData().next();
    const double before = run(s, lm.model.loss(), b);
    s.run({}, feedsFor(lm.g, b), {step});
    CHECK_MESSAGE(run(s, lm.model.loss(), b) < before, "sampled " << sampled);
  }
}

TEST_CASE("LM gradients match finite differences (f64)") {
  for (const int64_t sampled : {int64_t{0}, int64_t{12}}) {
    LmConfig config = tinyConfig();
    config.sampled = sampled;
    config.projection = sampled ? 4 : 0;
    TinyLm lm(config, "f64");
    Session s(lm.g, {1});
    const data::Batch b = lm.model.trainData().next();
    for (const char* v : {"embedding/table", "lstm/wx", "lstm/wh", "softmax/weight", "softmax/bias"}) {
      checkVariableGradient(s, lm.model.loss(), v, b);
    }
    if (sampled) checkVariableGradient(s, lm.model.loss(), "projection/weight", b);
  }
}

TEST_CASE("the LM trains on a text corpus and holds out its last lines") {
  const auto dir = std::filesystem::temp_directory_path() / ("weft_lm_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "corpus.txt").string();
  {
    std::ofstream out(file);
    for (int i = 0; i < 40; ++i) out << "the cat sat on the mat number " << i % 7 << "\n";
  }
  LmConfig config = tinyConfig();
  config.minCount = 2;
  TinyLm lm(config, "f32", file);
  CHECK(lm.model.vocabSize() == 4 + 6 + 7);
  Session s(lm.g, {1});
  const auto metrics = lm.model.evaluate(s, 0);
  CHECK(metrics.count("perplexity") == 1);
  CHECK(metrics.count("true_perplexity") == 0);
  LmModel missing;
  Graph g;
  CommonOptions common;
  common.data = (dir / "none.txt").string();
  CHECK(contains(errorOf([&] { missing.build(g, common); }), "none.txt"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("the LM trains on a directory of shards with a word list and a held-out directory, as 1B-Word ships") {
  TempDir dir;
  std::filesystem::create_directories(dir.path / "train");
  std::filesystem::create_directories(dir.path / "heldout");
  for (int shard = 0; shard < 3; ++shard) {
    std::string lines;
    for (int i = 0; i < 20; ++i) lines += "the cat sat on mat " + std::to_string((shard + i) % 5) + "\n";
    dir.write("train/news.en-0000" + std::to_string(shard), lines);
  }
  dir.write("heldout/news.en.heldout-00000", "the cat sat\nthe dog sat\n");
  const std::string vocab =
      dir.write("vocab.txt", "<S> 60\n</S> 60\n<UNK> 0\nthe 60\ncat 60\nsat 60\non 60\nmat 60\n0 12\n1 12\n");
  LmConfig config = tinyConfig();
  config.sampled = 0;
  config.vocabFile = vocab;
  config.heldoutData = (dir.path / "heldout").string();
  TinyLm lm(config, "f32", (dir.path / "train").string());
  CHECK(lm.model.vocabSize() == 4 + 7);  // the word list's seven words, not the corpus's counts
  Session s(lm.g, {1});
  const data::Batch b = lm.model.trainData().next();
  CHECK(b.at("tokens").shape()[0] == config.batchSize);
  const auto metrics = lm.model.evaluate(s, 0);
  CHECK(std::isfinite(metrics.at("perplexity")));
  config.heldoutData = (dir.path / "train" / "news.en-00000").string() + "-missing";
  LmModel missing;
  missing.config() = config;
  Graph g;
  CommonOptions common;
  common.data = (dir.path / "train").string();
  CHECK(contains(errorOf([&] { missing.build(g, common); }), "news.en-00000-missing"));
}

TEST_CASE("--streams: a corpus's batches take an equal share of every stream; what cannot be cut is refused") {
  TempDir dir;
  std::string lines;
  for (int i = 0; i < 42; ++i) {  // sentence i: 3 + 1 + i / 10 words
    lines += "the cat sat";
    for (int w = 0; w <= i / 10; ++w) lines += " x";
    lines += "\n";
  }
  const std::string corpus = dir.write("corpus.txt", lines);  // 40 training sentences, 2 held out
  const auto refusal = [&](LmConfig config, const std::string& data) {
    return errorOf([&] { TinyLm lm(config, "f32", data); });
  };
  LmConfig config = tinyConfig();
  config.streams = 4;
  TinyLm lm(config, "f32", corpus);
  for (int step = 0; step < 6; ++step) {
    // Row j holds a sentence of stream j, sentences [10 j, 10 j + 10) of j + 4 words and </s>.
    const data::Batch b = lm.model.trainData().next();
    const std::vector<double> mask = b.at("targets_mask").toDoubles();
    const int64_t width = b.at("targets_mask").shape()[1];
    for (int64_t row = 0; row < 4; ++row) {
      double words = 0;
      for (int64_t t = 0; t < width; ++t) words += mask[static_cast<size_t>(row * width + t)];
      CHECK(words == static_cast<double>(row + 5));
    }
  }
  CHECK(lm.model.trainData().batchesPerEpoch() == 10);
  config.streams = 3;
  CHECK(contains(refusal(config, corpus), "lm: --streams 3 must divide the batch of 4"));
  config.streams = 41;
  config.batchSize = 82;
  CHECK(contains(refusal(config, corpus), "lm: --streams 41 must be 1 to the corpus's 40 training sentences"));
  config.batchSize = 4;
  config.streams = 2;
  CHECK(contains(refusal(config, ""), "lm: --streams 2 reads a text corpus in streams; the built-in language"));
  config.streams = 1;
  config.maxLength = 70000;
  CHECK(contains(refusal(config, corpus), "lm: --max-length 70000 must be 1 to 65535 for a text corpus"));
}

TEST_CASE("the LM's options and defaults") {
  LmModel m;
  std::vector<std::string> names;
  for (const auto& o : m.options()) names.push_back(o.name);
  for (const char* n :
       {"embed", "hidden", "projection", "sampled", "vocab", "train-sentences", "min-count", "max-vocab"}) {
    CHECK_MESSAGE(std::find(names.begin(), names.end(), n) != names.end(), n);
  }
  CHECK(m.config().vocab >= 50000);
  CHECK(m.defaultOptimizer().clipNorm > 0);
  CHECK(m.targetMetric() == "perplexity");
  CHECK(!m.higherIsBetter());
  CHECK(makeLmModel() != nullptr);
}
