// The AMP graph and its multi-core runtime (amp/AmpGraph.h, dist/amp/AmpRuntime.h): synchronous
// training equals batched (or unrolled) training, gradients through every control and batching
// node equal finite differences, every forward message is answered once, the asynchrony knobs are
// obeyed, replicas synchronise, and bad graphs and failing nodes are refused by name.
#include "tests/TestUtil.h"

#include "core/Device.h"
#include "dist/amp/AmpRuntime.h"
#include "dist/amp/AmpWire.h"
#include "nn/Layers.h"
#include "ops/Ops.h"
#include "optim/Optimizer.h"

#include <random>

using namespace weft;

namespace {

Tensor rowVector(const std::vector<double>& v) { return Tensor::fromVector(v, {1, static_cast<int64_t>(v.size())}); }

/// A labelled feature vector.
struct Example : amp::Instance {
  std::vector<double> x;
  int64_t label = 0;
};

amp::StateInput labelInput() {
  return {"label", {i64, {1}}, [](const amp::State&, const amp::Instance& i) {
            return Tensor::fromVector<int64_t>({i.as<Example>().label}, {1});
          }};
}

amp::LossSpec crossEntropy() {
  return {[](Graph&, const amp::Inputs& in) {
            Output logits = in.payloads[0];
            Output hit = cast(equal(argmax(logits, 1), in.fromState[0]), f64);
            return amp::LossOutputs{nn::meanSparseCrossEntropy(logits, in.fromState[0]), sum(hit),
                                    scalarLike(sum(hit), 1)};
          },
          {labelInput()}};
}

amp::TransformSpec linear(const std::string& name, int64_t in, int64_t out, bool activate) {
  return {[=](Graph& g, const amp::Inputs& x) {
    Output y = nn::Linear(g, name, in, out, true, f64)(x.payloads[0]);
    return activate ? tanh(y) : y;
  }};
}

/// Copies every variable of a runtime into a session whose graph names it the same without the
/// AMP node's prefix ("fc1/fc1/weight" -> "fc1/weight").
void copyVariables(const amp::Runtime& runtime, Session& session) {
  for (const auto& [name, value] : runtime.variables()) {
    std::string inner = name.substr(name.find('/') + 1);
    if (session.graph().find(inner) != nullptr) session.setVariable(inner, value);
  }
}

void checkSameVariables(const amp::Runtime& runtime, Session& session, double tol) {
  int compared = 0;
  for (const auto& [name, value] : runtime.variables()) {
    std::string inner = name.substr(name.find('/') + 1);
    if (session.graph().find(inner) == nullptr || inner.find("global_step") != std::string::npos) continue;
    CHECK_MESSAGE(relativeDifference(value, session.variable(inner)) < tol, name);
    ++compared;
  }
  CHECK(compared > 0);
}

std::vector<std::shared_ptr<Example>> examples(int count, int features, int classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<std::shared_ptr<Example>> out;
  for (int i = 0; i < count; ++i) {
    auto e = std::make_shared<Example>();
    for (int f = 0; f < features; ++f) e->x.push_back(normal(rng));
    e->label = static_cast<int64_t>(rng() % static_cast<uint64_t>(classes));
    out.push_back(e);
  }
  return out;
}

// ---- a static MLP ----

struct Mlp {
  amp::Graph g;
  amp::Port x;
  Mlp() {
    x = g.input("x", {f64, {1, 4}});
    amp::Port h = g.transform("fc1", {x}, linear("fc1", 4, 5, true));
    amp::Port logits = g.transform("fc2", {h}, linear("fc2", 5, 3, false));
    g.loss("loss", logits, crossEntropy());
  }
};

/// The same network on whole batches: the mean loss over the batch, SGD.
struct BatchedMlp {
  Graph g;
  Output x, y, loss;
  Node* step;
  explicit BatchedMlp(double lr) {
    x = g.placeholder("x", f64, {-1, 4});
    y = g.placeholder("y", i64, {-1});
    Output h = tanh(nn::Linear(g, "fc1", 4, 5, true, f64)(x));
    loss = nn::meanSparseCrossEntropy(nn::Linear(g, "fc2", 5, 3, true, f64)(h), y);
    step = optim::SGD(lr).minimize(loss);
  }
  void train(Session& s, const std::vector<std::shared_ptr<Example>>& data, size_t from, size_t count) {
    std::vector<double> xs;
    std::vector<int64_t> ys;
    for (size_t i = from; i < from + count; ++i)
      xs.insert(xs.end(), data[i]->x.begin(), data[i]->x.end()), ys.push_back(data[i]->label);
    s.run({},
          {{x, Tensor::fromVector(xs, {static_cast<int64_t>(count), 4})},
           {y, Tensor::fromVector(ys, {static_cast<int64_t>(count)})}},
          {step});
  }
};

std::function<amp::Pumped(int64_t)> pumpExamples(const std::vector<std::shared_ptr<Example>>& data, amp::Port x,
                                                 size_t from = 0) {
  return [&data, x, from](int64_t i) {
    const auto& e = data[from + static_cast<size_t>(i)];
    return amp::Pumped{e, {{x, rowVector(e->x), {}}}};
  };
}

void checkMlpEqualsBatched(amp::AmpOptions options) {
  const double lr = 0.3;
  const int batch = 4, batches = 3;
  auto data = examples(batch * batches, 4, 3, 5);
  Mlp mlp;
  options.optimizer = std::make_shared<optim::SGD>(lr);
  amp::Runtime runtime(mlp.g, options);
  BatchedMlp ref(lr);
  Session session(ref.g);
  copyVariables(runtime, session);
  runtime.train(batch * batches, pumpExamples(data, mlp.x));
  for (int b = 0; b < batches; ++b) ref.train(session, data, static_cast<size_t>(b * batch), batch);
  checkSameVariables(runtime, session, 1e-12);
}

// ---- a recurrent loop: phi, cell, step + 1, cond(step < length) ----

struct Sequence : amp::Instance {
  std::vector<std::vector<double>> xs;  // [length][2]
  int64_t label = 0;
};

struct Rnn {
  amp::Graph g;
  amp::Port h0;
  explicit Rnn(int replicas = 1) {
    h0 = g.input("h0", {f64, {1, 3}});
    amp::Port h = g.phi("loop", {h0});
    amp::TransformSpec cell{
        [](Graph& w, const amp::Inputs& in) {
          return tanh(nn::Linear(w, "cell", 5, 3, true, f64)(concat({in.payloads[0], in.fromState[0]}, 1)));
        },
        {{"x", {f64, {1, 2}}, [](const amp::State& s, const amp::Instance& i) {
            return rowVector(i.as<Sequence>().xs.at(static_cast<size_t>(s.step)));
          }}}};
    amp::Port next = g.replicated("cell", h, replicas, cell);
    amp::Port moved = g.stateUpdate(
        "step", next, [](const amp::State& s, const amp::Instance&) { amp::State n = s; ++n.step; return n; },
        [](const amp::State& s, const amp::Instance&) { amp::State n = s; --n.step; return n; });
    auto branch = g.cond("more", moved, 2, [](const amp::State& s, const amp::Instance& i) {
      return s.step < static_cast<int32_t>(i.as<Sequence>().xs.size()) ? 0 : 1;
    });
    g.addPhiInput(h, branch[0]);
    amp::Port logits = g.transform("out", {branch[1]}, linear("out", 3, 2, false));
    g.loss("loss", logits,
           {[](Graph&, const amp::Inputs& in) {
              return amp::LossOutputs{nn::meanSparseCrossEntropy(in.payloads[0], in.fromState[0]), {}, {}};
            },
            {{"label", {i64, {1}}, [](const amp::State&, const amp::Instance& i) {
                return Tensor::fromVector<int64_t>({i.as<Sequence>().label}, {1});
              }}}});
  }
};

std::vector<std::shared_ptr<Sequence>> sequences(int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<std::shared_ptr<Sequence>> out;
  for (int i = 0; i < count; ++i) {
    auto s = std::make_shared<Sequence>();
    size_t length = 1 + rng() % 4;
    for (size_t t = 0; t < length; ++t) s->xs.push_back({normal(rng), normal(rng)});
    s->label = static_cast<int64_t>(rng() % 2);
    out.push_back(s);
  }
  return out;
}

std::function<amp::Pumped(int64_t)> pumpSequences(const std::vector<std::shared_ptr<Sequence>>& data, amp::Port h0) {
  return [&data, h0](int64_t i) {
    return amp::Pumped{data[static_cast<size_t>(i)], {{h0, Tensor::zeros(f64, {1, 3}), {}}}};
  };
}

/// The RNN unrolled over each sequence of a batch, with the mean loss over sequences.
struct UnrolledRnn {
  Graph g;
  Output loss;
  Node* step;
  UnrolledRnn(const std::vector<std::shared_ptr<Sequence>>& batch, double lr) {
    nn::Linear cell(g, "cell", 5, 3, true, f64), out(g, "out", 3, 2, true, f64);
    std::vector<Output> losses;
    for (const auto& s : batch) {
      Output h = g.constant(Tensor::zeros(f64, {1, 3}));
      for (const auto& x : s->xs) h = tanh(cell(concat({h, g.constant(rowVector(x))}, 1)));
      losses.push_back(nn::meanSparseCrossEntropy(out(h), g.constant(Tensor::fromVector<int64_t>({s->label}, {1}))));
    }
    loss = div(addN(losses), g.scalar(static_cast<double>(batch.size()), f64));
    step = optim::SGD(lr).minimize(loss);
  }
};

/// Gradients that one SGD step of rate 1 on one instance applies: the variables before minus after.
std::map<std::string, Tensor> gradientsOfOneInstance(amp::Graph& graph, const std::function<amp::Pumped(int64_t)>& pump,
                                                     std::map<std::string, Tensor>& before) {
  amp::Runtime runtime(graph, {.minibatch = 1, .optimizer = std::make_shared<optim::SGD>(1.0)});
  before = runtime.variables();
  runtime.train(1, pump);
  std::map<std::string, Tensor> grads;
  for (const auto& [name, after] : runtime.variables()) {
    if (after.dtype() != f64) continue;
    Tensor g = before.at(name).clone();
    for (int64_t i = 0; i < g.numel(); ++i) g.data<double>()[i] -= after.data<double>()[i];
    grads[name] = g;
  }
  return grads;
}

/// Central differences of the evaluated loss of one instance, against the runtime's gradients.
void checkAgainstFiniteDifferences(amp::Graph& graph, const std::function<amp::Pumped(int64_t)>& pump) {
  std::map<std::string, Tensor> before;
  auto grads = gradientsOfOneInstance(graph, pump, before);
  amp::Runtime probe(graph, {.optimizer = std::make_shared<optim::SGD>(1.0)});
  const double h = 1e-6;
  int checked = 0;
  for (const auto& [name, value] : before) {
    if (name.find("global_step") != std::string::npos) continue;
    for (const auto& [other, v] : before) probe.setVariable(other, v);
    for (int64_t i = 0; i < value.numel(); ++i) {
      Tensor plus = value.clone(), minus = value.clone();
      plus.data<double>()[i] += h;
      minus.data<double>()[i] -= h;
      probe.setVariable(name, plus);
      double up = probe.evaluate(1, pump).loss;
      probe.setVariable(name, minus);
      double down = probe.evaluate(1, pump).loss;
      probe.setVariable(name, value);
      double numeric = (up - down) / (2 * h);
      double analytic = grads.at(name).data<double>()[i];
      CHECK_MESSAGE(std::abs(numeric - analytic) < 1e-6 * std::max(1.0, std::abs(numeric)),
                    name << "[" << i << "]: finite differences " << numeric << ", runtime " << analytic);
      ++checked;
    }
  }
  CHECK(checked > 10);
}

// ---- message passing over an instance's own graph: ungroup, flatmap, group, broadcast, concat, split ----

struct SmallGraph : amp::Instance {
  int nodes = 0;
  std::vector<std::pair<int, int>> edges;  // (source, destination)
  std::vector<double> features;           // [nodes][2]
  std::vector<double> targets;            // per node
  int inDegree(int v) const {
    int d = 0;
    for (const auto& e : edges) d += e.second == v;
    return d;
  }
};

/// A ring (so every node has an edge in and out) plus random chords.
std::vector<std::shared_ptr<SmallGraph>> smallGraphs(int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<std::shared_ptr<SmallGraph>> out;
  for (int i = 0; i < count; ++i) {
    auto g = std::make_shared<SmallGraph>();
    g->nodes = 2 + static_cast<int>(rng() % 4);
    for (int v = 0; v < g->nodes; ++v) g->edges.push_back({v, (v + 1) % g->nodes});
    for (int extra = static_cast<int>(rng() % 3); extra > 0; --extra)
      g->edges.push_back({static_cast<int>(rng() % static_cast<uint64_t>(g->nodes)),
                          static_cast<int>(rng() % static_cast<uint64_t>(g->nodes))});
    for (int v = 0; v < 2 * g->nodes; ++v) g->features.push_back(normal(rng));
    for (int v = 0; v < g->nodes; ++v) g->targets.push_back(normal(rng));
    out.push_back(g);
  }
  return out;
}

struct MessagePassing {
  amp::Graph g;
  amp::Port features;
  MessagePassing() {
    features = g.input("features", {f64, {-1, 2}});
    amp::Port node = g.ungroup("nodes", features, [](const amp::State& s, const amp::Instance& i) {
      std::vector<amp::State> states;
      for (int v = 0; v < i.as<SmallGraph>().nodes; ++v) states.push_back({s.instance, 0, 0, v, 0});
      return states;
    });
    amp::Port embedded =
        g.transform("embed", {node}, {[](Graph& w, const amp::Inputs& in) {
                      return tanh(nn::Linear(w, "embed", 2, 3, true, f64)(reshape(in.payloads[0], {1, 2})));
                    }});
    auto copies = g.broadcast("copies", embedded, 2);
    amp::Port perEdge = g.flatmap("out_edges", copies[0], [](const amp::State& s, const amp::Instance& i) {
      std::vector<amp::State> states;
      const auto& edges = i.as<SmallGraph>().edges;
      for (size_t e = 0; e < edges.size(); ++e)
        if (edges[e].first == s.item) states.push_back({s.instance, 0, 0, static_cast<int32_t>(e), 1});
      return states;
    });
    amp::Port message = g.transform("message", {perEdge}, linear("message", 3, 3, true));
    amp::Port incoming = g.group(
        "by_destination", message,
        {[](const amp::State& s, const amp::Instance& i) {
           return amp::State{s.instance, 0, 0, i.as<SmallGraph>().edges.at(static_cast<size_t>(s.item)).second, 0};
         },
         [](const amp::State& key, const amp::Instance& i) { return i.as<SmallGraph>().inDegree(key.item); },
         [](const amp::State& s) { return static_cast<int64_t>(s.item); }});
    amp::Port summed =
        g.transform("sum", {incoming}, {[](Graph&, const amp::Inputs& in) { return sum(in.payloads[0], {0}); }});
    amp::Port joined = g.concat("join", {copies[1], summed});
    auto parts = g.split("parts", joined, {2, 4});
    amp::Port a = g.transform("read_a", {parts[0]}, linear("read_a", 2, 1, false));
    amp::Port b = g.transform("read_b", {parts[1]}, linear("read_b", 4, 1, false));
    amp::Port both = g.concat("both", {a, b});
    g.loss("loss", both,
           {[](Graph&, const amp::Inputs& in) {
              Output err = sub(sum(in.payloads[0]), reshape(in.fromState[0], {}));
              return amp::LossOutputs{mul(err, err), {}, {}};
            },
            {{"target", {f64, {1}}, [](const amp::State& s, const amp::Instance& i) {
                return Tensor::fromVector<double>({i.as<SmallGraph>().targets.at(static_cast<size_t>(s.item))}, {1});
              }}}});
  }
};

std::function<amp::Pumped(int64_t)> pumpGraphs(const std::vector<std::shared_ptr<SmallGraph>>& data, amp::Port in) {
  return [&data, in](int64_t i) {
    const auto& g = data[static_cast<size_t>(i)];
    return amp::Pumped{g, {{in, Tensor::fromVector(g->features, {g->nodes, 2}), {}}}};
  };
}

void checkEveryMessageAnswered(const amp::EpochReport& report) {
  for (const amp::NodeReport& n : report.nodes)
    for (size_t o = 0; o < n.sent.size(); ++o)
      CHECK_MESSAGE(n.sent[o] == n.answered[o], n.name << " output " << o << ": " << n.sent[o] << " sent, "
                                                       << n.answered[o] << " answered");
}

amp::Node& nodeNamed(amp::Graph& g, const std::string& name) {
  for (const amp::Node& n : g.nodes())
    if (n.name == name) return g.node(n.id);
  FAIL("no node " << name);
  return g.node(0);
}

amp::StateMap keepState() {
  return [](const amp::State& s, const amp::Instance&) { return s; };
}

const amp::NodeReport& nodeReport(const amp::EpochReport& r, const std::string& name) {
  for (const amp::NodeReport& n : r.nodes)
    if (n.name == name) return n;
  FAIL("no node " << name);
  return r.nodes[0];
}

}  // namespace

TEST_CASE("synchronous training of a static MLP equals batched training on the mean loss") {
  SUBCASE("one active key") { checkMlpEqualsBatched({.workers = 2, .maxActiveKeys = 1, .minibatch = 4}); }
  SUBCASE("several active keys and workers") {
    checkMlpEqualsBatched({.workers = 3, .maxActiveKeys = 3, .minibatch = 4});
  }
  SUBCASE("one active key and an update every minibatch's gradients, asynchronously") {
    checkMlpEqualsBatched({.workers = 2, .maxActiveKeys = 1, .minUpdateFrequency = 4});
  }
}

TEST_CASE("synchronous training of a loop (phi, state update, cond) equals the RNN unrolled over each sequence") {
  const double lr = 0.5;
  auto data = sequences(6, 3);
  Rnn rnn;
  amp::Runtime runtime(rnn.g, {.workers = 2, .maxActiveKeys = 2, .minibatch = 3,
                               .optimizer = std::make_shared<optim::SGD>(lr)});
  std::vector<std::shared_ptr<Sequence>> first(data.begin(), data.begin() + 3), second(data.begin() + 3, data.end());
  UnrolledRnn a(first, lr), b(second, lr);
  Session sa(a.g), sb(b.g);
  copyVariables(runtime, sa);
  runtime.train(6, pumpSequences(data, rnn.h0));
  sa.run(a.step);
  for (const char* name : {"cell/weight", "cell/bias", "out/weight", "out/bias"})
    sb.setVariable(name, sa.variable(name));
  sb.run(b.step);
  checkSameVariables(runtime, sb, 1e-12);
}

TEST_CASE("gradients through cond, phi and a loop equal finite differences") {
  auto data = sequences(1, 8);
  data[0]->xs.resize(3, {0.3, -0.2});
  Rnn rnn;
  checkAgainstFiniteDifferences(rnn.g, pumpSequences(data, rnn.h0));
}

TEST_CASE("gradients through ungroup, flatmap, group, broadcast, concat and split equal finite differences") {
  auto data = smallGraphs(1, 4);
  MessagePassing mp;
  checkAgainstFiniteDifferences(mp.g, pumpGraphs(data, mp.features));
}

TEST_CASE("every forward message is answered by one backward message, on random instances and interleavings") {
  auto graphs = smallGraphs(40, 17);
  MessagePassing mp;
  amp::Runtime a(mp.g, {.workers = 3, .maxActiveKeys = 6, .minUpdateFrequency = 2,
                        .optimizer = std::make_shared<optim::SGD>(0.01)});
  for (int epoch = 0; epoch < 2; ++epoch) checkEveryMessageAnswered(a.train(40, pumpGraphs(graphs, mp.features)));

  auto seqs = sequences(40, 23);
  Rnn rnn(2);
  amp::Runtime b(rnn.g, {.workers = 3, .maxActiveKeys = 8, .minUpdateFrequency = 3,
                         .optimizer = std::make_shared<optim::SGD>(0.01)});
  amp::EpochReport r = b.train(40, pumpSequences(seqs, rnn.h0));
  checkEveryMessageAnswered(r);
  int64_t steps = 0;
  for (const auto& s : seqs) steps += static_cast<int64_t>(s->xs.size());
  CHECK(nodeReport(r, "cell/replica0").forwards + nodeReport(r, "cell/replica1").forwards == steps);
}

TEST_CASE(
    "a transform updates after every min_update_frequency gradients, and its own frequency overrides the default") {
  auto data = examples(30, 4, 3, 2);
  Mlp mlp;
  nodeNamed(mlp.g, "fc2").transform.minUpdateFrequency = 7;
  amp::Runtime runtime(mlp.g, {.workers = 2, .maxActiveKeys = 4, .minUpdateFrequency = 4,
                               .optimizer = std::make_shared<optim::SGD>(0.1)});
  amp::EpochReport r = runtime.train(30, pumpExamples(data, mlp.x));
  CHECK(nodeReport(r, "fc1").gradients == 30);
  CHECK(nodeReport(r, "fc1").updates == 30 / 4);
  CHECK(nodeReport(r, "fc2").updates == 30 / 7);
}

TEST_CASE("at most max_active_keys instances are in flight, and more keys keep more in flight") {
  auto data = examples(40, 4, 3, 9);
  Mlp mlp;
  amp::Runtime one(mlp.g, {.workers = 2, .maxActiveKeys = 1, .optimizer = std::make_shared<optim::SGD>(0.1)});
  amp::EpochReport r1 = one.train(40, pumpExamples(data, mlp.x));
  CHECK(r1.peakActiveKeys == 1);
  Mlp mlp5;
  amp::Runtime five(mlp5.g, {.workers = 2, .maxActiveKeys = 5, .optimizer = std::make_shared<optim::SGD>(0.1)});
  amp::EpochReport r5 = five.train(40, pumpExamples(data, mlp5.x));
  CHECK(r5.peakActiveKeys <= 5);
  CHECK(r5.peakActiveKeys >= 2);
}

TEST_CASE("staleness is zero with one active key and grows with more") {
  auto data = examples(60, 4, 3, 4);
  Mlp a, b;
  amp::Runtime sync(a.g, {.workers = 2, .maxActiveKeys = 1, .optimizer = std::make_shared<optim::SGD>(0.1)});
  CHECK(nodeReport(sync.train(60, pumpExamples(data, a.x)), "fc1").maxStaleness == 0);
  amp::Runtime async(b.g, {.workers = 2, .maxActiveKeys = 8, .optimizer = std::make_shared<optim::SGD>(0.1)});
  amp::EpochReport r = async.train(60, pumpExamples(data, b.x));
  CHECK(nodeReport(r, "fc1").maxStaleness >= 1);
}

TEST_CASE("replicas start equal and are averaged at the end of each epoch") {
  auto seqs = sequences(20, 5);
  Rnn rnn(2);
  amp::Runtime runtime(rnn.g, {.workers = 2, .maxActiveKeys = 4, .minUpdateFrequency = 2,
                               .optimizer = std::make_shared<optim::SGD>(0.1)});
  auto before = runtime.variables();
  CHECK(relativeDifference(before.at("cell/replica0/cell/weight"), before.at("cell/replica1/cell/weight")) == 0);
  runtime.train(20, pumpSequences(seqs, rnn.h0));
  auto after = runtime.variables();
  CHECK(relativeDifference(after.at("cell/replica0/cell/weight"), before.at("cell/replica0/cell/weight")) > 0);
  CHECK(relativeDifference(after.at("cell/replica0/cell/weight"), after.at("cell/replica1/cell/weight")) == 0);
}

TEST_CASE("replicas synchronising every k updates average once per k updates of each") {
  auto seqs = sequences(16, 6);
  for (auto& s : seqs) s->xs.resize(1, {0.1, 0.2});  // one step each: one gradient per instance and replica
  Rnn rnn(2);
  // One worker and one key: replica 0 and 1 alternate, each updating once per instance it gets.
  amp::Runtime runtime(rnn.g, {.workers = 1, .maxActiveKeys = 1, .minUpdateFrequency = 1,
                               .optimizer = std::make_shared<optim::SGD>(0.1), .replicaSyncEvery = 2});
  amp::EpochReport r = runtime.train(16, pumpSequences(seqs, rnn.h0));
  CHECK(nodeReport(r, "cell/replica0").updates == 8);
  CHECK(r.replicaSyncs == 4);  // posted at updates 2, 4, 6, 8 of each
}

TEST_CASE("evaluation runs forward only: no variable changes and no message is kept") {
  auto data = examples(10, 4, 3, 1);
  Mlp mlp;
  amp::Runtime runtime(mlp.g, {.workers = 2, .maxActiveKeys = 4, .optimizer = std::make_shared<optim::SGD>(0.1)});
  auto before = runtime.variables();
  amp::EpochReport r = runtime.evaluate(10, pumpExamples(data, mlp.x));
  CHECK(r.accuracy >= 0);
  CHECK(nodeReport(r, "fc1").backwards == 0);
  for (const auto& [name, value] : runtime.variables()) CHECK(relativeDifference(value, before.at(name)) == 0);
}

TEST_CASE("bad graphs are refused when verified, naming the node") {
  SUBCASE("a cycle without a state update") {
    amp::Graph g;
    amp::Port x = g.input("x", {f64, {1, 3}});
    amp::Port p = g.phi("p", {x});
    auto c = g.cond("c", g.transform("t", {p}, linear("t", 3, 3, true)), 2,
                    [](const amp::State&, const amp::Instance&) { return 1; });
    g.addPhiInput(p, c[0]);
    g.loss("l", c[1], crossEntropy());
    CHECK(contains(errorOf([&] { g.verify(); }), "has no state update"));
  }
  SUBCASE("a phi whose inputs receive copies of one message") {
    amp::Graph g;
    auto copies = g.broadcast("b", g.input("x", {f64, {1, 3}}), 2);
    amp::Port p = g.phi("p", {g.transform("t1", {copies[0]}, linear("t1", 3, 3, true)), copies[1]});
    g.loss("l", p, crossEntropy());
    std::string error = errorOf([&] { g.verify(); });
    CHECK(contains(error, "phi 'p' cannot tell its inputs"));
    CHECK(contains(error, "'b'"));
  }
  SUBCASE("an output no node reads") {
    amp::Graph g;
    auto copies = g.broadcast("b", g.input("x", {f64, {1, 3}}), 2);
    g.loss("l", copies[0], crossEntropy());
    g.transform("dead", {copies[1]}, linear("dead", 3, 3, true));
    CHECK(contains(errorOf([&] { g.verify(); }), "output 0 of 'dead' (transform) is read by no node"));
  }
  SUBCASE("a node that reaches no loss") {
    amp::Graph g;
    auto copies = g.broadcast("b", g.input("x", {f64, {1, 3}}), 2);
    g.loss("l", copies[0], crossEntropy());
    amp::Port spin = g.phi("spin", {copies[1]});
    g.addPhiInput(spin, g.stateUpdate("turn", spin, keepState(), keepState()));
    CHECK(contains(errorOf([&] { g.verify(); }), "node 'spin' reaches no loss"));
  }
  SUBCASE("a loss unreachable from the controller") {
    amp::Graph g;
    g.loss("l", g.input("x", {f64, {1, 3}}), crossEntropy());
    amp::Port island = g.phi("island", {});
    auto c = g.cond("c", g.stateUpdate("turn", island, keepState(), keepState()), 2,
                    [](const amp::State&, const amp::Instance&) { return 0; });
    g.addPhiInput(island, c[0]);
    g.loss("orphan", c[1], crossEntropy());
    CHECK(contains(errorOf([&] { g.verify(); }), "loss 'orphan' is unreachable from the controller"));
  }
  SUBCASE("an output read twice") {
    amp::Graph g;
    amp::Port x = g.input("x", {f64, {1, 3}});
    g.loss("a", x, crossEntropy());
    g.loss("b", x, crossEntropy());
    CHECK(contains(errorOf([&] { g.verify(); }), "read by both 'a' and 'b'"));
  }
  SUBCASE("a phi joining payloads of different shapes") {
    amp::Graph g;
    auto c = g.cond("c", g.input("x", {f64, {1, 3}}), 2, [](const amp::State&, const amp::Instance&) { return 0; });
    amp::Port p = g.phi("p", {c[0], g.transform("wider", {c[1]}, linear("wider", 3, 4, true))});
    g.loss("l", p, crossEntropy());
    CHECK(contains(errorOf([&] { g.verify(); }), "phi 'p' joins payloads"));
  }
  SUBCASE("a transform that cannot take its input's payload") {
    amp::Graph g;
    amp::Port t = g.transform("t", {g.input("x", {f64, {1, 3}})}, linear("t", 5, 3, true));
    g.loss("l", t, crossEntropy());
    std::string error = errorOf([&] { g.verify(); });
    CHECK(contains(error, "transform 't' cannot be built for payloads (f64[1, 3])"));
  }
}

TEST_CASE("a failing node stops the run with an error naming it, the worker and the instance") {
  auto data = examples(8, 4, 3, 1);
  data[5]->label = 7;  // out of range for 3 classes
  Mlp mlp;
  amp::Runtime runtime(mlp.g, {.workers = 2, .maxActiveKeys = 3, .optimizer = std::make_shared<optim::SGD>(0.1)});
  std::string error = errorOf([&] { runtime.train(8, pumpExamples(data, mlp.x)); });
  CHECK(contains(error, "loss 'loss'"));
  CHECK(contains(error, "instance 5"));
  CHECK(contains(error, "worker"));
  CHECK(contains(errorOf([&] { runtime.train(1, pumpExamples(data, mlp.x)); }), "failed earlier"));
}

TEST_CASE("transforms placed on a GPU the machine lacks stop the run, naming the transform and the device" *
          doctest::skip(cudaDeviceCount() > 0)) {
  auto data = examples(4, 4, 3, 1);
  Mlp mlp;
  amp::Runtime runtime(mlp.g, {.workers = 2, .device = "cuda:0", .maxActiveKeys = 2,
                               .optimizer = std::make_shared<optim::SGD>(0.1)});
  const std::string error = errorOf([&] { runtime.train(4, pumpExamples(data, mlp.x)); });
  CHECK(contains(error, "failed in transform"));
  CHECK(contains(error, "cuda:0, which is not available"));
}

TEST_CASE("messages waiting for partners that never come are reported, not waited on forever") {
  auto graphs = smallGraphs(2, 3);
  MessagePassing mp;
  nodeNamed(mp.g, "by_destination").group.count = [](const amp::State&, const amp::Instance&) { return 99; };
  amp::Runtime runtime(mp.g, {.workers = 2, .maxActiveKeys = 2, .optimizer = std::make_shared<optim::SGD>(0.1)});
  std::string error = errorOf([&] { runtime.train(2, pumpGraphs(graphs, mp.features)); });
  INFO(error);
  CHECK(contains(error, "can go no further"));
  CHECK(contains(error, "group 'by_destination' holds"));
}

TEST_CASE("a payload of the wrong type is refused at the input, naming it") {
  Mlp mlp;
  amp::Runtime runtime(mlp.g, {.optimizer = std::make_shared<optim::SGD>(0.1)});
  auto e = std::make_shared<Example>();
  std::string error = errorOf([&] {
    runtime.train(1, [&](int64_t) { return amp::Pumped{e, {{mlp.x, Tensor::zeros(f64, {1, 5}), {}}}}; });
  });
  CHECK(contains(error, "input 'x', which takes f64[1, 4]"));
}

TEST_CASE("credit splits exactly at any depth, and the shares add back to the whole") {
  // A chain of 500 halvings, each returning one half: a loss at every step of a long sequence.
  amp::Credit held = amp::Credit::whole(), returned;
  for (int step = 0; step < 500; ++step) {
    std::vector<amp::Credit> halves = held.split(2);
    returned.add(halves[0]);
    held = halves[1];
    CHECK_FALSE(held.empty());
  }
  CHECK_FALSE(returned.isWhole());
  returned.add(held);
  CHECK(returned.isWhole());
  // Uneven splits: seven shares of a third.
  amp::Credit third = amp::Credit::whole().split(3)[1], sum;
  for (const amp::Credit& c : third.split(7)) sum.add(c);
  std::vector<amp::Credit> rest = amp::Credit::whole().split(3);
  sum.add(rest[0]);
  sum.add(rest[2]);
  CHECK(sum.isWhole());
  sum.add(rest[2]);
  CHECK(sum.exceedsWhole());
  CHECK(contains(errorOf([] { amp::Credit::fromParts(3, {2}); }), "not reduced"));
}

TEST_CASE("a loop with a loss at every one of 300 steps finishes: fan-out depth does not run out") {
  amp::Graph g;
  amp::Port h0 = g.input("h0", {f64, {1, 3}});
  amp::Port h = g.phi("loop", {h0});
  amp::Port next = g.transform("cell", {h}, linear("cell", 3, 3, true));
  amp::Port moved = g.stateUpdate(
      "step", next, [](const amp::State& s, const amp::Instance&) { amp::State n = s; ++n.step; return n; },
      [](const amp::State& s, const amp::Instance&) { amp::State n = s; --n.step; return n; });
  auto more = g.cond("more", moved, 2, [](const amp::State& s, const amp::Instance&) { return s.step < 300 ? 0 : 1; });
  auto copies = g.broadcast("outputs", more[0], 2);
  g.addPhiInput(h, copies[1]);
  g.loss("step_loss", copies[0], crossEntropy());
  g.loss("final_loss", more[1], crossEntropy());
  amp::Runtime runtime(g, {.workers = 2, .maxActiveKeys = 2, .optimizer = std::make_shared<optim::SGD>(0.01)});
  auto data = examples(3, 4, 3, 2);
  amp::EpochReport r = runtime.train(3, [&](int64_t i) {
    return amp::Pumped{data[static_cast<size_t>(i)], {{h0, Tensor::zeros(f64, {1, 3}), {}}}};
  });
  CHECK(nodeReport(r, "step_loss").forwards == 3 * 299);
  checkEveryMessageAnswered(r);
}
