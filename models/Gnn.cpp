// GGSNN and GCN node classifiers, and the "gnn" zoo model on the typed-reachability task.
#include "models/Gnn.h"

#include "data/Graphs.h"

#include <algorithm>
#include <string>

namespace weft::models {
namespace {

/// Column `k` of an (E, 2) edge list, as (E).
Output edgeColumn(Output edges, int64_t k) { return reshape(slice(edges, {0, k}, {-1, 1}), {-1}); }

/// T steps of typed message passing with GRU updates, from zero-padded features.
Output ggsnnStates(Graph& g, const GnnConfig& c, Output x, Output src, Output dst, Output types) {
  WEFT_CHECK(c.hidden >= c.features, "gnn: hidden size {} is smaller than the {} node features (they are zero-padded)",
             c.hidden, c.features);
  // One matmul gives every node's message for every edge type: row v*K + k of the reshaped
  // product is node v's message along an edge of type k.
  nn::Linear message(g, "message", c.hidden, c.edgeTypes * c.hidden, true, c.dtype);
  nn::GRUCell update(g, "update", c.hidden, c.hidden, c.dtype);
  const Output messageRow = src * static_cast<double>(c.edgeTypes) + types;
  const Output h0 = pad(x, {0, 0, 0, c.hidden - c.features});
  Output h = h0;
  for (int64_t t = 0; t < c.steps; ++t) {
    auto segment = g.recompute(c.recompute);
    const Output perType = reshape(message(h), {-1, c.hidden});
    const Output incoming = scatterAdd(zerosLike(h), dst, gather(perType, messageRow));
    h = update(incoming, h);
  }
  return concat({h, h0}, 1);  // the readout sees the final and the initial state, as in GGSNN
}

/// `steps` GCN layers: relu(Linear(normalised aggregation)).
Output gcnStates(Graph& g, const GnnConfig& c, Output x, Output src, Output dst) {
  Output h = x;
  int64_t width = c.features;
  for (int64_t l = 0; l < c.steps; ++l) {
    auto segment = g.recompute(c.recompute);
    nn::Linear layer(g, "gcn" + std::to_string(l + 1), width, c.hidden, true, c.dtype);
    h = relu(layer(gcnAggregate(h, src, dst)));
    width = c.hidden;
  }
  return h;
}

}  // namespace

Output gcnAggregate(Output h, Output src, Output dst) {
  const Output nodeOnes = reshape(slice(onesLike(h), {0, 0}, {-1, 1}), {-1});
  const Output degree = stopGradient(scatterAdd(nodeOnes, dst, cast(onesLike(src), h.dtype())));
  const Output invSqrt = rsqrt(degree);
  const Output weight = gather(invSqrt, src) * gather(invSqrt, dst);
  const Output self = h * expandDims(reciprocal(degree), 1);
  return scatterAdd(self, dst, gather(h, src) * expandDims(weight, 1));
}

GnnGraph buildGnn(Graph& g, const GnnConfig& c) {
  WEFT_CHECK(c.kind == "ggsnn" || c.kind == "gcn", "gnn: unknown kind '{}' (known: ggsnn, gcn)", c.kind);
  WEFT_CHECK(c.features >= 1 && c.edgeTypes >= 1 && c.classes >= 2 && c.hidden >= 1 && c.steps >= 1,
             "gnn: invalid config (features {}, edge types {}, classes {}, hidden {}, steps {})", c.features,
             c.edgeTypes, c.classes, c.hidden, c.steps);
  g.setSeed(c.seed);
  GnnGraph m;
  m.features = g.placeholder("features", f32, {-1, c.features});
  m.edges = g.placeholder("edges", i32, {-1, 2});
  m.edgeTypes = g.placeholder("edge_types", i32, {-1});
  m.labels = g.placeholder("labels", i64, {-1});
  m.nodeGraph = g.placeholder("node_graph", i32, {-1});
  const Output x = cast(m.features, c.dtype);
  const Output src = edgeColumn(m.edges, 0), dst = edgeColumn(m.edges, 1);
  const Output states = c.kind == "ggsnn" ? ggsnnStates(g, c, x, src, dst, m.edgeTypes) : gcnStates(g, c, x, src, dst);
  nn::Linear hidden(g, "readout", states.shape()[1], c.hidden, true, c.dtype);
  nn::Linear out(g, "logits", c.hidden, c.classes, true, c.dtype);
  m.logits = out(tanh(hidden(states)));
  m.loss = nn::meanSparseCrossEntropy(m.logits, m.labels);
  m.accuracy = nn::accuracy(m.logits, m.labels);
  m.hits = cast(equal(argmax(m.logits, -1), m.labels), i64);
  return m;
}

namespace {

/// Evaluation counts: a graph counts as right when all its nodes are.
struct Tally {
  double nodes = 0, nodeHits = 0, graphs = 0, graphHits = 0, loss = 0;

  void add(double meanLoss, const std::vector<int64_t>& hits, const std::vector<int32_t>& nodeGraph,
           size_t graphCount) {
    std::vector<char> allRight(graphCount, 1);
    for (size_t v = 0; v < hits.size(); ++v) {
      if (hits[v] != 1) allRight[static_cast<size_t>(nodeGraph[v])] = 0;
    }
    loss += meanLoss * static_cast<double>(hits.size());
    nodes += static_cast<double>(hits.size());
    nodeHits += static_cast<double>(std::count(hits.begin(), hits.end(), 1));
    graphs += static_cast<double>(graphCount);
    graphHits += static_cast<double>(std::count(allRight.begin(), allRight.end(), 1));
  }
};

class GnnZooModel : public ZooModel {
 public:
  std::vector<ModelOption> options() override {
    return {{"kind", "ggsnn (gated graph network) or gcn (graph convolutions)", &config_.kind},
            {"hidden", "node state width", &config_.hidden},
            {"propagation-steps", "propagation steps (ggsnn) or layers (gcn)", &config_.steps},
            {"train-size", "generated training graphs", &trainSize_},
            {"test-size", "generated held-out graphs", &testSize_},
            {"max-nodes", "largest generated graph", &task_.maxNodes},
            {"max-depth", "longest shortest path in a generated graph (keep <= --propagation-steps)", &task_.maxDepth}};
  }
  OptimizerSpec defaultOptimizer() const override { return {"adam", 3e-3, 0.9, 0, 5.0}; }
  int64_t defaultSteps() const override { return 1000; }

  void build(Graph& g, const CommonOptions& common) override {
    loadData(common);
    config_.seed = common.seed;
    config_.dtype = dtypeFromName(common.dtype);
    config_.recompute = common.recompute;
    model_ = buildGnn(g, config_);
    batch_ = common.batchSize > 0 ? common.batchSize : 32;
    train_ = std::make_unique<data::GraphBatcher>(trainSet_, batch_, common.seed, true, true);
    // The training loss is over the nodes of the whole step (the batch's "node_count"), so that
    // workers with a part of the batch each divide by the same count.
    const Output stepNodes = cast(g.placeholder("node_count", f64, {}), config_.dtype);
    trainLoss_ = sum(sparseSoftmaxCrossEntropy(model_.logits, model_.labels)) /
                 maximum(stepNodes, scalarLike(stepNodes, 1.0));
  }
  Output loss() const override { return trainLoss_; }
  data::BatchSource& trainData() override { return *train_; }

  std::map<std::string, double> evaluate(Session& s, int64_t maxBatches) override {
    Tally tally;
    const auto batch = static_cast<size_t>(batch_);
    for (size_t begin = 0, b = 0; begin < testSet_.size() && (maxBatches <= 0 || static_cast<int64_t>(b) < maxBatches);
         begin += batch, ++b) {
      std::vector<data::Example> members;
      for (size_t i = begin; i < std::min(testSet_.size(), begin + batch); ++i) members.push_back(testSet_.example(i));
      const data::Batch feed = data::collateGraphs(data::pointersTo(members));
      const std::vector<Tensor> r = s.run({model_.loss, model_.hits}, feedsFor(s.graph(), feed));
      tally.add(r[0].item(), r[1].toVector<int64_t>(), feed.at("node_graph").toVector<int32_t>(), members.size());
    }
    WEFT_CHECK(tally.nodes > 0, "gnn: the held-out set is empty");
    return {{"accuracy", tally.nodeHits / tally.nodes},
            {"loss", tally.loss / tally.nodes},
            {"graph_accuracy", tally.graphHits / tally.graphs}};
  }
  std::string targetMetric() const override { return "accuracy"; }
  bool higherIsBetter() const override { return true; }
  data::Batch shard(const data::Batch& batch, int64_t index, int64_t count) const override {
    data::Batch part = data::sliceGraphs(batch, index, count);
    // Each worker divides its part's loss sum by the step's nodes per worker: the workers'
    // average gradient is then exactly the total batch's.
    part["node_count"] = Tensor::scalar(f64, batch.at("node_count").item() / static_cast<double>(count));
    return part;
  }
  std::pair<std::string, double> itemsIn(const data::Batch& b) const override {
    return {"nodes", b.at("node_count").item()};
  }

 private:
  static DType dtypeFromName(const std::string& name) {
    WEFT_CHECK(name == "f32" || name == "f64", "gnn: dtype '{}' is not supported (f32 or f64)", name);
    return name == "f32" ? f32 : f64;
  }

  /// The generated task, or a graph file split into training graphs and a held-out last tenth.
  void loadData(const CommonOptions& common) {
    if (common.data.empty()) {
      config_.features = data::kReachabilityFeatures;
      config_.edgeTypes = task_.edgeTypes;
      config_.classes = data::kReachabilityClasses;
      trainSet_ = data::Dataset(data::typedReachability(task_, trainSize_, common.seed * 2 + 100));
      testSet_ = data::Dataset(data::typedReachability(task_, testSize_, common.seed * 2 + 101));
      return;
    }
    const data::GraphFile file = data::loadGraphs(common.data);
    WEFT_CHECK(file.info.nodeLabels, "gnn: '{}' has no node labels (node_labels=0)", common.data);
    WEFT_CHECK(file.graphs.size() >= 2, "gnn: '{}' has {} graphs; at least 2 are needed", common.data,
               file.graphs.size());
    int64_t maxLabel = 1;
    for (size_t i = 0; i < file.graphs.size(); ++i) {
      for (const int64_t l : file.graphs[i].at("labels").toVector<int64_t>()) maxLabel = std::max(maxLabel, l);
    }
    config_.features = file.info.features;
    config_.edgeTypes = file.info.edgeTypes;
    config_.classes = maxLabel + 1;
    const size_t held = std::max<size_t>(1, file.graphs.size() / 10);
    trainSet_ = file.graphs.range(0, file.graphs.size() - held);
    testSet_ = file.graphs.range(file.graphs.size() - held, file.graphs.size());
  }

  GnnConfig config_;
  data::ReachabilitySpec task_;
  int64_t trainSize_ = 20000, testSize_ = 2000, batch_ = 32;
  GnnGraph model_;
  data::Dataset trainSet_, testSet_;
  std::unique_ptr<data::GraphBatcher> train_;
  Output trainLoss_;
};

}  // namespace

std::unique_ptr<ZooModel> makeGnnModel() { return std::make_unique<GnnZooModel>(); }

}  // namespace weft::models
