// The AMP models (models/AmpModels.h): synchronous AMP training of each equals training the same
// network unrolled over each minibatch into one static graph (float64), and asynchronous training
// reaches each model's accuracy target.
#include "tests/TestUtil.h"

#include "dist/amp/AmpRuntime.h"
#include "models/AmpModels.h"
#include "nn/Layers.h"
#include "ops/Ops.h"
#include "optim/Optimizer.h"

#include <numeric>
#include <random>

using namespace weft;

namespace {

constexpr double kLearningRate = 0.1;
constexpr int kBatch = 4, kBatches = 2;

std::unique_ptr<models::AmpModel> smallModel(const std::string& name, const std::map<std::string, int64_t>& settings,
                                             int replicas = 1, DType dtype = f64) {
  auto model = models::makeAmpModel(name);
  for (const models::ModelOption& o : model->options())
    if (auto it = settings.find(o.name); it != settings.end()) *std::get<int64_t*>(o.target) = it->second;
  model->build({3, "", dtype, replicas});
  return model;
}

Tensor ids(const std::vector<int64_t>& v) { return Tensor::fromVector(v, {static_cast<int64_t>(v.size())}); }

/// Builds the loss of one minibatch (its instances) unrolled into `g`, with variables named as the
/// AMP transforms name theirs inside their subgraphs.
using Reference = std::function<Output(Graph& g, const std::vector<const amp::Instance*>& batch)>;

/// Trains kBatches minibatches synchronously with AMP and with the unrolled reference (SGD), and
/// compares every variable.
void checkSyncEqualsUnrolled(models::AmpModel& model, const Reference& reference, int workers, int keys) {
  amp::Runtime runtime(model.graph(), {.workers = workers, .maxActiveKeys = keys, .minibatch = kBatch,
                                       .optimizer = std::make_shared<optim::SGD>(kLearningRate)});
  auto inner = [](const std::string& name) { return name.substr(name.find('/') + 1); };
  std::map<std::string, Tensor> current;
  for (const auto& [name, value] : runtime.variables()) current[inner(name)] = value;
  runtime.train(kBatch * kBatches, [&](int64_t i) { return model.trainInstance(i); });

  for (int b = 0; b < kBatches; ++b) {
    std::vector<amp::Pumped> pumped;
    std::vector<const amp::Instance*> batch;
    for (int i = 0; i < kBatch; ++i) pumped.push_back(model.trainInstance(b * kBatch + i));
    for (const amp::Pumped& p : pumped) batch.push_back(p.instance.get());
    Graph g;
    Node* step = optim::SGD(kLearningRate).minimize(reference(g, batch));
    Session s(g);
    for (Node* v : g.trainableVariables()) {
      REQUIRE_MESSAGE(current.count(v->name) == 1, "the reference's variable " << v->name << " is not the model's");
      s.setVariable(v->name, current.at(v->name));
    }
    s.run(step);
    for (Node* v : g.trainableVariables()) current[v->name] = s.variable(v).clone();
  }
  int compared = 0;
  for (const auto& [name, value] : runtime.variables()) {
    if (value.dtype() != f64) continue;  // step counters
    CHECK_MESSAGE(relativeDifference(value, current.at(inner(name))) < 1e-10, name);
    ++compared;
  }
  CHECK(compared >= 4);
}

Output meanOf(Graph& g, const std::vector<Output>& losses) {
  return div(addN(losses), g.scalar(static_cast<double>(losses.size()), f64));
}

Output cell(Output i, Output o, Output u, Output carried) {
  Output c = mul(sigmoid(i), tanh(u));
  if (carried.valid()) c = add(c, carried);
  return concat({mul(sigmoid(o), tanh(c)), c}, 1);
}

Output cols(Output x, int64_t from, int64_t width) { return slice(x, {0, from}, {-1, width}); }

/// Trains asynchronously until the held-out accuracy reaches the model's target; the epochs taken.
int64_t epochsToTarget(models::AmpModel& model, amp::AmpOptions options, int64_t maxEpochs) {
  amp::Runtime runtime(model.graph(), options);
  std::vector<int64_t> order(static_cast<size_t>(model.trainSize()));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(7);
  for (int64_t epoch = 1; epoch <= maxEpochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    runtime.train(model.trainSize(), [&](int64_t i) { return model.trainInstance(order[static_cast<size_t>(i)]); });
    double accuracy = runtime.evaluate(model.evalSize(), [&](int64_t i) { return model.evalInstance(i); }).accuracy;
    MESSAGE("epoch " << epoch << ": held-out accuracy " << accuracy);
    if (accuracy >= model.targetAccuracy()) return epoch;
  }
  return maxEpochs + 1;
}

}  // namespace

TEST_CASE("mlp: synchronous AMP training equals batched training") {
  auto model = smallModel("mlp", {{"hidden", 6}, {"train-size", 8}, {"eval-size", 2}});
  checkSyncEqualsUnrolled(*model, [](Graph& g, const std::vector<const amp::Instance*>& batch) {
    std::vector<Output> rows;
    std::vector<int64_t> labels;
    for (const amp::Instance* i : batch) {
      rows.push_back(g.constant(i->as<models::FeaturesInstance>().x));
      labels.push_back(i->as<models::FeaturesInstance>().label);
    }
    Output h = concat(rows, 0);
    h = relu(nn::Linear(g, "fc1", 32, 6, true, f64)(h));
    h = relu(nn::Linear(g, "fc2", 6, 6, true, f64)(h));
    return nn::meanSparseCrossEntropy(nn::Linear(g, "fc3", 6, 10, true, f64)(h), g.constant(ids(labels)));
  }, 3, 4);
}

TEST_CASE("list_reduction: synchronous AMP training of the RNN loop equals the RNN unrolled over each list") {
  auto model = smallModel("list_reduction", {{"hidden", 5}, {"embedding", 3}, {"train-size", 8}, {"eval-size", 2}});
  checkSyncEqualsUnrolled(*model, [](Graph& g, const std::vector<const amp::Instance*>& batch) {
    nn::Embedding embedding(g, "embedding", 16, 3, f64);
    nn::Linear linear(g, "linear", 8, 5, true, f64), output(g, "output", 5, 10, true, f64);
    std::vector<Output> losses;
    for (const amp::Instance* i : batch) {
      const auto& list = i->as<models::TokenListInstance>();
      Output h = g.constant(Tensor::zeros(f64, {1, 5}));
      for (int64_t token : list.tokens) h = relu(linear(concat({h, embedding(g.constant(ids({token})))}, 1)));
      losses.push_back(nn::meanSparseCrossEntropy(output(h), g.constant(ids({list.label}))));
    }
    return meanOf(g, losses);
  }, 2, 2);
}

TEST_CASE("tree_lstm: synchronous AMP training equals the Tree-LSTM unrolled over each tree") {
  auto model = smallModel("tree_lstm",
                          {{"hidden", 4}, {"embedding", 3}, {"train-size", 8}, {"eval-size", 2}, {"max-leaves", 5}});
  checkSyncEqualsUnrolled(*model, [](Graph& g, const std::vector<const amp::Instance*>& batch) {
    const int64_t h = 4;
    nn::Embedding embedding(g, "embedding", data::compositionalVocab({}).size(), 3, f64);
    nn::Linear leaf(g, "leaf", 3, 3 * h, true, f64), branch(g, "branch", 2 * h, 5 * h, true, f64),
        classify(g, "classify", h, 5, true, f64);
    std::vector<Output> losses;
    for (const amp::Instance* i : batch) {
      const data::Tree& t = i->as<models::TreeInstance>().tree;
      std::vector<Output> state(static_cast<size_t>(t.size()));
      std::vector<Output> nodeLosses;
      for (int32_t v = 0; v < t.size(); ++v) {  // post-order: children first
        Output s;
        if (t.isLeaf(v)) {
          Output gates = leaf(embedding(g.constant(ids({t.word[static_cast<size_t>(v)]}))));
          s = cell(cols(gates, 0, h), cols(gates, h, h), cols(gates, 2 * h, h), {});
        } else {
          Output l = state[static_cast<size_t>(t.left[static_cast<size_t>(v)])],
                 r = state[static_cast<size_t>(t.right[static_cast<size_t>(v)])];
          Output gates = branch(concat({cols(l, 0, h), cols(r, 0, h)}, 1));
          Output carried =
              add(mul(sigmoid(cols(gates, h, h)), cols(l, h, h)), mul(sigmoid(cols(gates, 2 * h, h)), cols(r, h, h)));
          s = cell(cols(gates, 0, h), cols(gates, 3 * h, h), cols(gates, 4 * h, h), carried);
        }
        state[static_cast<size_t>(v)] = s;
        nodeLosses.push_back(
            nn::meanSparseCrossEntropy(classify(cols(s, 0, h)), g.constant(ids({t.label[static_cast<size_t>(v)]}))));
      }
      losses.push_back(addN(nodeLosses));
    }
    return meanOf(g, losses);
  }, 2, 3);
}

TEST_CASE("ggsnn: synchronous AMP message passing equals the GGSNN unrolled over each graph") {
  auto model = smallModel("ggsnn", {{"hidden", 4},
                                    {"propagation-steps", 2},
                                    {"train-size", 8},
                                    {"eval-size", 2},
                                    {"min-nodes", 4},
                                    {"max-nodes", 6}});
  checkSyncEqualsUnrolled(*model, [](Graph& g, const std::vector<const amp::Instance*>& batch) {
    const int64_t h = 4, types = 3;
    std::vector<nn::Linear> message;
    for (int64_t k = 0; k < types; ++k) message.emplace_back(g, "type" + std::to_string(k), h, h, true, f64);
    nn::GRUCell update(g, "update", h, h, f64);
    nn::Linear readout(g, "readout", 2 * h, h, true, f64), logits(g, "logits", h, 3, true, f64);
    std::vector<Output> losses;
    for (const amp::Instance* i : batch) {
      const auto& graph = i->as<models::GraphInstance>();
      Output h0 = pad(g.constant(graph.features), {0, 0, 0, h - 2});
      Output state = h0;
      for (int step = 0; step < 2; ++step) {
        Output incoming = zerosLike(state);
        for (int64_t k = 0; k < types; ++k) {
          std::vector<int64_t> src, dst;
          for (size_t e = 0; e < graph.type.size(); ++e)
            if (graph.type[e] == k) src.push_back(graph.source[e]), dst.push_back(graph.destination[e]);
          if (src.empty()) continue;
          incoming = scatterAdd(incoming, g.constant(ids(dst)),
                                message[static_cast<size_t>(k)](gather(state, g.constant(ids(src)))));
        }
        state = update(incoming, state);
      }
      losses.push_back(
          nn::meanSparseCrossEntropy(logits(tanh(readout(concat({state, h0}, 1)))), g.constant(ids(graph.labels))));
    }
    return meanOf(g, losses);
  }, 3, 4);
}

TEST_CASE(
    "list_reduction with replicas of its heavy layer: every step runs on one replica, which all stay equal per epoch") {
  auto model = smallModel("list_reduction", {{"hidden", 8}, {"train-size", 40}, {"eval-size", 4}}, 3);
  amp::Runtime runtime(model->graph(), {.workers = 3, .maxActiveKeys = 6, .minUpdateFrequency = 4,
                                        .optimizer = std::make_shared<optim::SGD>(0.05)});
  amp::EpochReport r = runtime.train(40, [&](int64_t i) { return model->trainInstance(i); });
  int64_t steps = 0, replicaForwards = 0;
  for (int64_t i = 0; i < 40; ++i)
    steps += static_cast<int64_t>(model->trainInstance(i).instance->as<models::TokenListInstance>().tokens.size());
  for (const amp::NodeReport& n : r.nodes)
    if (n.name.rfind("linear/replica", 0) == 0) {
      CHECK(n.forwards > 0);
      replicaForwards += n.forwards;
    }
  CHECK(replicaForwards == steps);
  auto v = runtime.variables();
  CHECK(relativeDifference(v.at("linear/replica0/linear/weight"), v.at("linear/replica2/linear/weight")) == 0);
}

// Asynchronous updates interleave as the threads are scheduled, so the epochs a model takes vary
// from run to run (the GGSNN took 1 to 6 in fourteen runs, and more than 8 once on a loaded
// machine): the bounds are twice what was seen, and the convergence runs of docs/convergence.md
// measure the epochs themselves.
TEST_CASE("asynchronous training reaches each model's accuracy target") {
  amp::AmpOptions options{.workers = 2, .maxActiveKeys = 4, .minUpdateFrequency = 8};
  SUBCASE("mlp") {
    auto model = smallModel("mlp", {}, 1, f32);
    options.optimizer = std::make_shared<optim::Adam>(1e-3);
    CHECK(epochsToTarget(*model, options, 16) <= 16);
  }
  SUBCASE("ggsnn") {
    auto model = smallModel("ggsnn", {}, 1, f32);
    options.optimizer = std::make_shared<optim::Adam>(5e-3);
    CHECK(epochsToTarget(*model, options, 20) <= 20);
  }
  SUBCASE("list_reduction") {
    auto model = smallModel("list_reduction", {}, 1, f32);
    options.optimizer = std::make_shared<optim::Adam>(1e-3);
    CHECK(epochsToTarget(*model, options, 24) <= 24);
  }
  SUBCASE("ggsnn selecting the answer of basic deduction (bAbI 15, enlarged)") {
    auto model = models::makeAmpModel("ggsnn");
    for (const models::ModelOption& o : model->options())
      if (o.name == "task") *std::get<std::string*>(o.target) = "deduction";
    model->build({3, "", f32, 1});
    options.optimizer = std::make_shared<optim::Adam>(5e-3);
    CHECK(epochsToTarget(*model, options, 6) <= 6);
  }
  SUBCASE("tree_lstm") {
    auto model = smallModel("tree_lstm", {}, 1, f32);
    options.optimizer = std::make_shared<optim::Adam>(5e-3);
    CHECK(epochsToTarget(*model, options, 10) <= 10);
  }
}
