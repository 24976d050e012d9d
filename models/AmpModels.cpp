#include "models/AmpModels.h"

#include "data/GaussianMixture.h"
#include "data/Graphs.h"
#include "data/ListReduction.h"
#include "data/Trees.h"
#include "nn/Layers.h"

#include <fmt/format.h>

#include <algorithm>

namespace weft::models {
namespace {

Output listStepInput(Graph& g, Output h, Output token, int64_t vocab, int64_t embedding, DType dtype) {
  return concat({h, nn::Embedding(g, "embedding", vocab, embedding, dtype)(token)}, 1);
}

Output listStep(Graph& g, Output x, int64_t in, int64_t hidden, DType dtype) {
  return relu(nn::Linear(g, "linear", in, hidden, true, dtype)(x));
}

Output columns(Output x, int64_t from, int64_t width) { return slice(x, {0, from}, {-1, width}); }

/// [h, c] of a cell from its gates: c = i * u + sum over children of f_k * c_k, h = o * tanh(c).
Output cellState(Output i, Output o, Output u, Output carried) {
  Output c = mul(sigmoid(i), tanh(u));
  if (carried.valid()) c = add(c, carried);
  return concat({mul(sigmoid(o), tanh(c)), c}, 1);
}

Output treeLeaf(Graph& g, Output word, int64_t vocab, int64_t embedding, int64_t hidden, DType dtype) {
  Output x = nn::Embedding(g, "embedding", vocab, embedding, dtype)(word);
  Output gates = nn::Linear(g, "leaf", embedding, 3 * hidden, true, dtype)(x);
  return cellState(columns(gates, 0, hidden), columns(gates, hidden, hidden), columns(gates, 2 * hidden, hidden), {});
}

Output treeBranch(Graph& g, Output children, int64_t hidden, DType dtype) {
  Output rows = reshape(children, {2, 2 * hidden});
  Output left = slice(rows, {0, 0}, {1, -1}), right = slice(rows, {1, 0}, {1, -1});
  Output gates = nn::Linear(g, "branch", 2 * hidden, 5 * hidden, true, dtype)(
      concat({columns(left, 0, hidden), columns(right, 0, hidden)}, 1));
  auto gate = [&](int k) { return columns(gates, k * hidden, hidden); };
  Output carried = add(mul(sigmoid(gate(1)), columns(left, hidden, hidden)),
                       mul(sigmoid(gate(2)), columns(right, hidden, hidden)));
  return cellState(gate(0), gate(3), gate(4), carried);
}

Output ggsnnMessage(Graph& g, Output sourceStates, int64_t type, int64_t hidden, DType dtype) {
  return nn::Linear(g, fmt::format("type{}", type), hidden, hidden, true, dtype)(columns(sourceStates, 0, hidden));
}

Output ggsnnPropagate(Graph& g, Output messages, Output states, Output destinations, int64_t hidden, DType dtype) {
  Output h = columns(states, 0, hidden);
  Output incoming = scatterAdd(zerosLike(h), destinations, messages);
  return concat({nn::GRUCell(g, "update", hidden, hidden, dtype)(incoming, h), columns(states, hidden, hidden)}, 1);
}

using amp::Instance;
using amp::Port;
using amp::State;

Tensor idTensor(int64_t id) { return Tensor::fromVector<int64_t>({id}, {1}); }

/// The mean cross-entropy of logits (rows, classes) against the labels, with hits and count for
/// accuracy: every row, or the rows `scored` marks with 1.
amp::LossSpec classification(std::function<Tensor(const State&, const Instance&)> labels, int64_t rows,
                             std::function<Tensor(const State&, const Instance&)> scored = nullptr) {
  amp::LossSpec spec;
  spec.stateInputs.push_back({"labels", {i64, {rows}}, std::move(labels)});
  if (scored) spec.stateInputs.push_back({"scored", {f32, {rows}}, std::move(scored)});
  spec.build = [](Graph&, const amp::Inputs& in) {
    Output logits = in.payloads[0], y = in.fromState[0];
    Output hit = cast(equal(argmax(logits, 1), y), f32);
    Output weight = in.fromState.size() > 1 ? in.fromState[1] : onesLike(hit);
    return amp::LossOutputs{nn::meanSparseCrossEntropy(logits, y), sum(mul(hit, weight)), sum(weight)};
  };
  return spec;
}

/// A model whose instances are of type T: its two splits, and how the controller pumps one in.
template <typename T>
class ModelOf : public AmpModel {
 public:
  int64_t trainSize() const override { return static_cast<int64_t>(train_.size()); }
  int64_t evalSize() const override { return static_cast<int64_t>(eval_.size()); }
  amp::Pumped trainInstance(int64_t i) const override { return pump(train_.at(static_cast<size_t>(i))); }
  amp::Pumped evalInstance(int64_t i) const override { return pump(eval_.at(static_cast<size_t>(i))); }

 protected:
  virtual amp::Pumped pump(const std::shared_ptr<T>& instance) const = 0;

  std::vector<std::shared_ptr<T>> train_, eval_;
};

// ---- mlp ----

class AmpMlp : public ModelOf<FeaturesInstance> {
 public:
  std::vector<ModelOption> options() override {
    return {{"hidden", "hidden units of each layer", &hidden_},
            {"train-size", "training examples", &trainCount_},
            {"eval-size", "held-out examples", &evalCount_}};
  }
  OptimizerSpec defaultOptimizer() const override { return {"adam", 1e-3}; }
  int64_t defaultEpochs() const override { return 10; }
  double targetAccuracy() const override { return 0.95; }
  std::string accuracyOf() const override { return "examples"; }

  void build(const AmpModelOptions& o) override {
    WEFT_CHECK(o.data.empty(), "mlp --amp: trains on its generated task only (no --data)");
    data::GaussianMixtureSpec spec;
    train_ = load(data::gaussianMixture(spec, trainCount_, o.seed), o.dtype);
    eval_ = load(data::gaussianMixture(spec, evalCount_, o.seed + 1000003), o.dtype);
    x_ = graph_.input("x", {o.dtype, {1, spec.dim}});
    Port h = x_;
    const int64_t hidden = hidden_, classes = spec.classes;
    const DType dtype = o.dtype;
    int64_t width = spec.dim;
    for (int layer = 1; layer <= 2; ++layer) {
      h = graph_.transform(
          fmt::format("fc{}", layer), {h}, {[=](Graph& g, const amp::Inputs& in) {
            return relu(nn::Linear(g, fmt::format("fc{}", layer), width, hidden, true, dtype)(in.payloads[0]));
          }});
      width = hidden;
    }
    Port logits = graph_.transform("fc3", {h}, {[=](Graph& g, const amp::Inputs& in) {
                                     return nn::Linear(g, "fc3", hidden, classes, true, dtype)(in.payloads[0]);
                                   }});
    graph_.loss(
        "loss", logits,
        classification([](const State&, const Instance& i) { return idTensor(i.as<FeaturesInstance>().label); }, 1));
  }


 private:
  static std::vector<std::shared_ptr<FeaturesInstance>> load(const data::ClassificationData& d, DType dtype) {
    std::vector<std::shared_ptr<FeaturesInstance>> out;
    int64_t n = d.labels.numel(), dim = d.features.shape()[1];
    const std::vector<double> all = d.features.toDoubles();
    for (int64_t i = 0; i < n; ++i) {
      auto f = std::make_shared<FeaturesInstance>();
      const auto row = all.begin() + i * dim;
      f->x = Tensor::fromVector(std::vector<double>(row, row + dim), {1, dim}).cast(dtype);
      f->label = static_cast<int64_t>(d.labels.at(i));
      out.push_back(f);
    }
    return out;
  }
  amp::Pumped pump(const std::shared_ptr<FeaturesInstance>& f) const override { return {f, {{x_, f->x, {}}}}; }

  int64_t hidden_ = 64, trainCount_ = 20000, evalCount_ = 1000;
  Port x_;
};

// ---- list_reduction ----

class AmpListReduction : public ModelOf<TokenListInstance> {
 public:
  std::vector<ModelOption> options() override {
    return {{"hidden", "RNN state width", &hidden_},
            {"embedding", "token embedding width", &embedding_},
            {"max-length", "most digits in a list", &maxLength_},
            {"train-size", "training lists", &trainCount_},
            {"eval-size", "held-out lists", &evalCount_}};
  }
  OptimizerSpec defaultOptimizer() const override { return {"adam", 1e-3}; }
  int64_t defaultEpochs() const override { return 30; }
  double targetAccuracy() const override { return 0.8; }
  std::string accuracyOf() const override { return "examples"; }

  void build(const AmpModelOptions& o) override {
    WEFT_CHECK(o.data.empty(), "list_reduction --amp: trains on its generated task only (no --data)");
    data::ListReductionSpec spec{1, maxLength_};
    train_ = load(data::listReduction(spec, trainCount_, o.seed));
    eval_ = load(data::listReduction(spec, evalCount_, o.seed + 1000003));
    const int64_t hidden = hidden_, embedding = embedding_;
    const DType dtype = o.dtype;
    h0_ = graph_.input("h0", {dtype, {1, hidden}});
    Port h = graph_.phi("loop", {h0_});
    Port x = graph_.transform(
        "lookup", {h},
        {[=](Graph& g, const amp::Inputs& in) {
           return listStepInput(g, in.payloads[0], in.fromState[0], data::kListVocab, embedding, dtype);
         },
         {{"token", {i64, {1}}, [](const State& s, const Instance& i) {
             return idTensor(i.as<TokenListInstance>().tokens.at(static_cast<size_t>(s.step)));
           }}}});
    Port next = graph_.replicated("linear", x, o.replicas, {[=](Graph& g, const amp::Inputs& in) {
                                    return listStep(g, in.payloads[0], hidden + embedding, hidden, dtype);
                                  }});
    Port moved = graph_.stateUpdate(
        "step", next, [](const State& s, const Instance&) { State n = s; ++n.step; return n; },
        [](const State& s, const Instance&) { State n = s; --n.step; return n; });
    auto more = graph_.cond("more", moved, 2, [](const State& s, const Instance& i) {
      return s.step < static_cast<int32_t>(i.as<TokenListInstance>().tokens.size()) ? 0 : 1;
    });
    graph_.addPhiInput(h, more[0]);
    Port logits =
        graph_.transform("output", {more[1]}, {[=](Graph& g, const amp::Inputs& in) {
                           return nn::Linear(g, "output", hidden, data::kListClasses, true, dtype)(in.payloads[0]);
                         }});
    graph_.loss(
        "loss", logits,
        classification([](const State&, const Instance& i) { return idTensor(i.as<TokenListInstance>().label); }, 1));
    dtype_ = dtype;
  }


 private:
  static std::vector<std::shared_ptr<TokenListInstance>> load(const std::vector<data::Example>& examples) {
    std::vector<std::shared_ptr<TokenListInstance>> out;
    for (const data::Example& e : examples) {
      auto t = std::make_shared<TokenListInstance>();
      t->tokens = e.at("tokens").toVector<int64_t>();
      t->label = static_cast<int64_t>(e.at("labels").item());
      out.push_back(t);
    }
    return out;
  }
  amp::Pumped pump(const std::shared_ptr<TokenListInstance>& t) const override {
    return {t, {{h0_, Tensor::zeros(dtype_, {1, hidden_}), {}}}};
  }

  int64_t hidden_ = 128, embedding_ = 16, maxLength_ = 5, trainCount_ = 8000, evalCount_ = 500;
  Port h0_;
  DType dtype_ = f32;
};

// ---- ggsnn ----

class AmpGgsnn : public ModelOf<GraphInstance> {
 public:
  std::vector<ModelOption> options() override {
    return {{"task", "reachability (a class per node) or deduction (bAbI 15: select the answer node)", &task_},
            {"hidden", "node state width", &hidden_},
            {"propagation-steps", "propagation steps", &steps_},
            {"train-size", "training graphs (generated task)", &trainCount_},
            {"eval-size", "held-out graphs (generated task)", &evalCount_},
            {"min-nodes", "fewest nodes of a generated reachability graph", &minNodes_},
            {"max-nodes", "most nodes of a generated reachability graph", &maxNodes_},
            {"species", "species of a generated deduction graph", &species_},
            {"individuals", "individuals of a generated deduction graph", &individuals_}};
  }
  OptimizerSpec defaultOptimizer() const override { return {"adam", 5e-3}; }
  int64_t defaultEpochs() const override { return 20; }
  double targetAccuracy() const override { return selecting() ? 0.98 : 0.999; }
  std::string accuracyOf() const override { return selecting() ? "answers" : "nodes"; }

  void build(const AmpModelOptions& o) override {
    WEFT_CHECK(task_ == "reachability" || task_ == "deduction",
               "ggsnn --amp: unknown --task '{}' (reachability, deduction)", task_);
    std::vector<data::Example> trainGraphs, evalGraphs;
    if (o.data.empty() && selecting()) {
      const data::DeductionSpec spec{species_, individuals_};
      trainGraphs = data::basicDeduction(spec, trainCount_, o.seed);
      evalGraphs = data::basicDeduction(spec, evalCount_, o.seed + 1000003);
      features_ = data::kDeductionFeatures;
      edgeTypes_ = data::kDeductionEdgeTypes;
      classes_ = 2;
    } else if (o.data.empty()) {
      data::ReachabilitySpec spec;
      spec.minNodes = minNodes_;
      spec.maxNodes = maxNodes_;
      trainGraphs = data::typedReachability(spec, trainCount_, o.seed);
      evalGraphs = data::typedReachability(spec, evalCount_, o.seed + 1000003);
      features_ = data::kReachabilityFeatures;
      edgeTypes_ = spec.edgeTypes;
      classes_ = data::kReachabilityClasses;
    } else {
      data::GraphFile file = data::loadGraphs(o.data);
      WEFT_CHECK(file.info.nodeLabels, "ggsnn --amp: {} has no node labels", o.data);
      size_t held = std::max<size_t>(1, file.graphs.size() / 10);
      WEFT_CHECK(file.graphs.size() > held, "ggsnn --amp: {} has {} graph(s); it needs at least 2", o.data,
                 file.graphs.size());
      for (size_t i = 0; i < file.graphs.size(); ++i)
        (i + held < file.graphs.size() ? trainGraphs : evalGraphs).push_back(file.graphs[i]);
      features_ = file.info.features;
      edgeTypes_ = file.info.edgeTypes;
      classes_ = 2;
      for (size_t i = 0; i < file.graphs.size(); ++i)
        for (int64_t l : file.graphs[i].at("labels").toVector<int64_t>()) classes_ = std::max(classes_, l + 1);
    }
    WEFT_CHECK(hidden_ >= features_,
               "ggsnn --amp: hidden {} is smaller than the {} node features (they are zero-padded)", hidden_,
               features_);
    train_ = load(trainGraphs, o.dtype);
    eval_ = load(evalGraphs, o.dtype);
    buildGraph(o.dtype);
  }

  std::pair<std::string, double> itemsPerInstance() const override {
    double nodes = 0;
    for (const auto& g : train_) nodes += g->nodes;
    return {"nodes", train_.empty() ? 0.0 : nodes / static_cast<double>(train_.size())};
  }

 private:
  void buildGraph(DType dtype) {
    const int64_t hidden = hidden_, features = features_, steps = steps_, classes = classes_;
    input_ = graph_.input("graph", {dtype, {-1, features}});
    Port initial = graph_.transform("embed", {input_}, {[=](Graph&, const amp::Inputs& in) {
                                      Output h0 = pad(in.payloads[0], {0, 0, 0, hidden - features});
                                      return concat({h0, h0}, 1);
                                    }});
    Port states = graph_.phi("iterate", {initial});
    auto copies = graph_.broadcast("states", states, 2);
    Port nodes = graph_.ungroup("nodes", copies[0], [](const State& s, const Instance& i) {
      std::vector<State> out;
      for (int32_t v = 0; v < i.as<GraphInstance>().nodes; ++v) out.push_back({s.instance, 0, s.iteration, v, 0});
      return out;
    });
    Port edges = graph_.flatmap("out_edges", nodes, [](const State& s, const Instance& i) {
      std::vector<State> out;
      for (int32_t e : i.as<GraphInstance>().outEdges.at(static_cast<size_t>(s.item)))
        out.push_back({s.instance, 0, s.iteration, e, 1});
      return out;
    });
    Port byType = graph_.group(
        "by_type", edges,
        {[](const State& s, const Instance& i) {
           return State{s.instance, 0, s.iteration,
                        static_cast<int32_t>(i.as<GraphInstance>().type.at(static_cast<size_t>(s.item))), 2};
         },
         [](const State& key, const Instance& i) {
           return static_cast<int>(i.as<GraphInstance>().edgesOfType.at(static_cast<size_t>(key.item)).size());
         },
         [](const State& s) { return static_cast<int64_t>(s.item); }});
    auto typed = graph_.cond("edge_type", byType, static_cast<int>(edgeTypes_),
                             [](const State& s, const Instance&) { return s.item; });
    std::vector<Port> messages;
    for (int64_t k = 0; k < edgeTypes_; ++k)
      messages.push_back(graph_.transform(fmt::format("type{}", k), {typed[static_cast<size_t>(k)]},
                                          {[=](Graph& g, const amp::Inputs& in) {
                                            Output rows = reshape(in.payloads[0], {-1, 2 * hidden});
                                            return ggsnnMessage(g, rows, k, hidden, dtype);
                                          }}));
    Port allTypes = edgeTypes_ > 1 ? graph_.phi("typed", messages) : messages[0];
    Port perEdge = graph_.ungroup("typed_edges", allTypes, [](const State& s, const Instance& i) {
      std::vector<State> out;
      for (int32_t e : i.as<GraphInstance>().edgesOfType.at(static_cast<size_t>(s.item)))
        out.push_back({s.instance, 0, s.iteration, e, 1});
      return out;
    });
    Port byInstance = graph_.group(
        "by_instance", perEdge,
        {[](const State& s, const Instance&) { return State{s.instance, 0, s.iteration, 0, 0}; },
         [](const State&, const Instance& i) { return static_cast<int>(i.as<GraphInstance>().source.size()); },
         [](const State& s) { return static_cast<int64_t>(s.item); }});
    amp::TransformSpec propagate{[=](Graph& g, const amp::Inputs& in) {
                                   return ggsnnPropagate(g, reshape(in.payloads[0], {-1, hidden}), in.payloads[1],
                                                         in.fromState[0], hidden, dtype);
                                 },
                                 {{"destinations", {i64, {-1}}, [](const State&, const Instance& i) {
                                     const auto& d = i.as<GraphInstance>().destination;
                                     return Tensor::fromVector(d, {static_cast<int64_t>(d.size())});
                                   }}}};
    Port updated = graph_.transform("propagate", {byInstance, copies[1]}, propagate);
    Port next = graph_.stateUpdate(
        "next_iteration", updated, [](const State& s, const Instance&) { State n = s; ++n.iteration; return n; },
        [](const State& s, const Instance&) { State n = s; --n.iteration; return n; });
    auto more =
        graph_.cond("more", next, 2, [steps](const State& s, const Instance&) { return s.iteration < steps ? 0 : 1; });
    graph_.addPhiInput(states, more[0]);
    // Node classification gives a row of logits per node; node selection one logit per node,
    // a row over the graph's nodes.
    const bool selecting = this->selecting();
    Port logits =
        graph_.transform("readout", {more[1]}, {[=](Graph& g, const amp::Inputs& in) {
                           Output h = tanh(nn::Linear(g, "readout", 2 * hidden, hidden, true, dtype)(in.payloads[0]));
                           Output out = nn::Linear(g, "logits", hidden, selecting ? 1 : classes, true, dtype)(h);
                           return selecting ? reshape(out, {1, -1}) : out;
                         }});
    if (selecting) {
      graph_.loss(
          "loss", logits,
          classification([](const State&, const Instance& i) { return idTensor(i.as<GraphInstance>().answer); }, 1));
      return;
    }
    graph_.loss("loss", logits, classification([](const State&, const Instance& i) {
                                  const auto& l = i.as<GraphInstance>().labels;
                                  return Tensor::fromVector(l, {static_cast<int64_t>(l.size())});
                                }, -1));
  }

  std::vector<std::shared_ptr<GraphInstance>> load(const std::vector<data::Example>& graphs, DType dtype) const {
    std::vector<std::shared_ptr<GraphInstance>> out;
    for (size_t gi = 0; gi < graphs.size(); ++gi) {
      const data::Example& e = graphs[gi];
      auto g = std::make_shared<GraphInstance>();
      g->features = e.at("features").cast(dtype);
      g->nodes = static_cast<int32_t>(g->features.shape()[0]);
      g->labels = e.at("labels").toVector<int64_t>();
      if (selecting()) {
        WEFT_CHECK(
            std::count(g->labels.begin(), g->labels.end(), 1) == 1 &&
                std::count(g->labels.begin(), g->labels.end(), 0) == static_cast<std::ptrdiff_t>(g->labels.size()) - 1,
            "ggsnn --amp --task deduction: graph {} must label exactly one node 1 (the answer) and the others 0", gi);
        g->answer = std::find(g->labels.begin(), g->labels.end(), 1) - g->labels.begin();
      }
      std::vector<int32_t> edges = e.at("edges").toVector<int32_t>(), types = e.at("edge_types").toVector<int32_t>();
      WEFT_CHECK(!types.empty(), "ggsnn --amp: graph {} has no edges; every graph needs one to pass messages", gi);
      g->outEdges.resize(static_cast<size_t>(g->nodes));
      g->edgesOfType.resize(static_cast<size_t>(edgeTypes_));
      for (size_t k = 0; k < types.size(); ++k) {
        g->source.push_back(edges[2 * k]);
        g->destination.push_back(edges[2 * k + 1]);
        g->type.push_back(types[k]);
        g->outEdges[static_cast<size_t>(edges[2 * k])].push_back(static_cast<int32_t>(k));
        g->edgesOfType[static_cast<size_t>(types[k])].push_back(static_cast<int32_t>(k));
      }
      out.push_back(g);
    }
    return out;
  }
  amp::Pumped pump(const std::shared_ptr<GraphInstance>& g) const override { return {g, {{input_, g->features, {}}}}; }

  bool selecting() const { return task_ == "deduction"; }

  std::string task_ = "reachability";
  int64_t hidden_ = 32, steps_ = 5, trainCount_ = 2000, evalCount_ = 200, minNodes_ = 20, maxNodes_ = 40;
  int64_t species_ = 10, individuals_ = 30;
  int64_t features_ = 2, edgeTypes_ = 3, classes_ = 3;
  Port input_;
};

// ---- tree_lstm ----

class AmpTreeLstm : public ModelOf<TreeInstance> {
 public:
  std::vector<ModelOption> options() override {
    return {{"hidden", "cell width", &hidden_},
            {"embedding", "word embedding width", &embedding_},
            {"train-size", "training trees (generated task)", &trainCount_},
            {"eval-size", "held-out trees (generated task)", &evalCount_},
            {"max-leaves", "most words of a generated sentence", &maxLeaves_}};
  }
  OptimizerSpec defaultOptimizer() const override { return {"adam", 5e-3}; }
  int64_t defaultEpochs() const override { return 20; }
  double targetAccuracy() const override { return 0.9; }
  std::string accuracyOf() const override { return "roots"; }

  void build(const AmpModelOptions& o) override {
    std::vector<data::Tree> trainTrees, evalTrees;
    if (o.data.empty()) {
      data::CompositionalTreeSpec spec;
      spec.maxLeaves = maxLeaves_;
      vocab_ = data::compositionalVocab(spec);
      trainTrees = data::compositionalTrees(spec, trainCount_, o.seed);
      evalTrees = data::compositionalTrees(spec, evalCount_, o.seed + 1000003);
    } else {
      std::vector<data::Tree> all = data::loadTrees(o.data, vocab_, true);
      size_t held = std::max<size_t>(1, all.size() / 10);
      WEFT_CHECK(all.size() > held, "tree_lstm --amp: {} has {} tree(s); it needs at least 2", o.data, all.size());
      trainTrees.assign(all.begin(), all.end() - static_cast<std::ptrdiff_t>(held));
      evalTrees.assign(all.end() - static_cast<std::ptrdiff_t>(held), all.end());
    }
    for (auto* split : {&trainTrees, &evalTrees}) {
      auto& out = split == &trainTrees ? train_ : eval_;
      for (data::Tree& t : *split) {
        auto i = std::make_shared<TreeInstance>();
        i->tree = std::move(t);
        out.push_back(i);
      }
    }
    buildGraph(o.dtype);
    dtype_ = o.dtype;
  }

  std::pair<std::string, double> itemsPerInstance() const override {
    double nodes = 0;
    for (const auto& t : train_) nodes += t->tree.size();
    return {"nodes", train_.empty() ? 0.0 : nodes / static_cast<double>(train_.size())};
  }

 private:
  void buildGraph(DType dtype) {
    const int64_t hidden = hidden_, embedding = embedding_, vocab = vocab_.size();
    input_ = graph_.input("tree", {dtype, {1, 1}});
    Port leaves = graph_.flatmap("leaves", input_, [](const State& s, const Instance& i) {
      const data::Tree& t = i.as<TreeInstance>().tree;
      std::vector<State> out;
      for (int32_t v = 0; v < t.size(); ++v)
        if (t.isLeaf(v)) out.push_back({s.instance, 0, 0, v, 0});
      return out;
    });
    Port leafCells = graph_.transform(
        "leaf", {leaves},
        {[=](Graph& g, const amp::Inputs& in) { return treeLeaf(g, in.fromState[0], vocab, embedding, hidden, dtype); },
         {{"word", {i64, {1}}, [](const State& s, const Instance& i) {
             return idTensor(i.as<TreeInstance>().tree.word.at(static_cast<size_t>(s.item)));
           }}}});
    Port cells = graph_.phi("cells", {leafCells});
    auto atRoot = graph_.cond("root", cells, 2, [](const State& s, const Instance& i) {
      return s.item == i.as<TreeInstance>().tree.root() ? 0 : 1;
    });
    auto copies = graph_.broadcast("up", atRoot[1], 2);
    Port toParent = graph_.stateUpdate(
        "to_parent", copies[1],
        [](const State& s, const Instance& i) {
          const data::Tree& t = i.as<TreeInstance>().tree;
          int32_t parent = t.parent.at(static_cast<size_t>(s.item));
          return State{s.instance, 0, 0, parent, t.left.at(static_cast<size_t>(parent)) == s.item ? 0 : 1};
        },
        [](const State& s, const Instance& i) {
          const data::Tree& t = i.as<TreeInstance>().tree;
          int32_t child = (s.slot == 0 ? t.left : t.right).at(static_cast<size_t>(s.item));
          return State{s.instance, 0, 0, child, 0};
        });
    Port siblings = graph_.group(
        "siblings", toParent,
        {[](const State& s, const Instance&) {
           return State{s.instance, 0, 0, s.item, 0};
         },
         [](const State&, const Instance&) { return 2; }, [](const State& s) { return static_cast<int64_t>(s.slot); }});
    Port branch = graph_.transform("branch", {siblings}, {[=](Graph& g, const amp::Inputs& in) {
                                     return treeBranch(g, in.payloads[0], hidden, dtype);
                                   }});
    graph_.addPhiInput(cells, branch);
    Port scored = graph_.phi("scored", {atRoot[0], copies[0]});
    Port logits = graph_.transform("classify", {scored}, {[=](Graph& g, const amp::Inputs& in) {
                                     return nn::Linear(g, "classify", hidden, data::kSentimentClasses, true, dtype)(
                                         slice(in.payloads[0], {0, 0}, {-1, hidden}));
                                   }});
    graph_.loss("loss", logits,
                classification([](const State& s, const Instance& i) {
                                 return idTensor(i.as<TreeInstance>().tree.label.at(static_cast<size_t>(s.item)));
                               }, 1,
                               [](const State& s, const Instance& i) {
                                 return Tensor::full(f32, {1}, s.item == i.as<TreeInstance>().tree.root() ? 1.0 : 0.0);
                               }));
  }

  amp::Pumped pump(const std::shared_ptr<TreeInstance>& t) const override {
    return {t, {{input_, Tensor::zeros(dtype_, {1, 1}), {}}}};
  }

  int64_t hidden_ = 32, embedding_ = 16, trainCount_ = 2000, evalCount_ = 300, maxLeaves_ = 10;
  data::Vocab vocab_;
  Port input_;
  DType dtype_ = f32;
};

}  // namespace

std::vector<std::string> ampModelNames() { return {"gnn", "list_reduction", "mlp", "tree_lstm"}; }

std::unique_ptr<AmpModel> makeAmpModel(const std::string& name) {
  if (name == "mlp") return std::make_unique<AmpMlp>();
  if (name == "list_reduction") return std::make_unique<AmpListReduction>();
  if (name == "gnn" || name == "ggsnn") return std::make_unique<AmpGgsnn>();  // the zoo's name, and the paper's
  if (name == "tree_lstm") return std::make_unique<AmpTreeLstm>();
  std::string known;
  for (const std::string& n : ampModelNames()) known += (known.empty() ? "" : ", ") + n;
  WEFT_THROW("no AMP model '{}' (known: {})", name, known);
}

}  // namespace weft::models
