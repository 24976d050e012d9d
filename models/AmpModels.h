// The models of the AMPNet paper as AMP graphs (amp/AmpGraph.h), trained by `weft train MODEL
// --amp`: an MLP (a static sanity check), list reduction as a vanilla RNN loop with a replicable
// heavy layer, a GGSNN that passes messages over each instance's own graph, and a Tree-LSTM over
// binarised sentiment trees. The instance types are public, so tests can build the same
// computation unrolled into one static graph and compare.
#pragma once

#include "data/Trees.h"
#include "amp/AmpGraph.h"
#include "models/ZooModel.h"

#include <memory>
#include <string>
#include <vector>

namespace weft::models {

/// What every AMP model takes from the command line.
struct AmpModelOptions {
  uint64_t seed = 1;
  std::string data;  ///< a real data file (see README); empty: the built-in generator
  DType dtype = f32;
  int replicas = 1;  ///< copies of the model's heaviest transform (list_reduction)
};

class AmpModel {
 public:
  virtual ~AmpModel() = default;

  /// The model's own options (read before build()).
  virtual std::vector<ModelOption> options() { return {}; }
  virtual OptimizerSpec defaultOptimizer() const = 0;
  virtual int64_t defaultEpochs() const = 0;
  /// The held-out accuracy a run should reach (docs/convergence.md).
  virtual double targetAccuracy() const = 0;
  /// What the accuracy counts: "examples", "nodes", "roots".
  virtual std::string accuracyOf() const = 0;

  /// Loads or generates the data and builds the graph.
  virtual void build(const AmpModelOptions& options) = 0;
  amp::Graph& graph() { return graph_; }

  /// What throughput counts besides instances ("nodes" of a graph or tree), and their mean per
  /// training instance; "" when an instance is the only item.
  virtual std::pair<std::string, double> itemsPerInstance() const { return {"", 1.0}; }

  virtual int64_t trainSize() const = 0;
  virtual int64_t evalSize() const = 0;
  /// Instance i of the training or held-out split, as the controller pumps it in.
  virtual amp::Pumped trainInstance(int64_t i) const = 0;
  virtual amp::Pumped evalInstance(int64_t i) const = 0;

 protected:
  amp::Graph graph_;
};

/// The AMP models by the zoo's names (gnn is the GGSNN; tree_lstm exists only as an AMP model).
std::vector<std::string> ampModelNames();
/// A fresh model by name, "ggsnn" also naming the GGSNN (throws naming the known ones).
std::unique_ptr<AmpModel> makeAmpModel(const std::string& name);

// ---- the instances each model pumps in ----

/// mlp: one feature row and its class.
struct FeaturesInstance : amp::Instance {
  Tensor x;  ///< (1, F)
  int64_t label = 0;
};

/// list_reduction: the reduction token, then the digits; the answer.
struct TokenListInstance : amp::Instance {
  std::vector<int64_t> tokens;
  int64_t label = 0;
};

/// ggsnn: a graph with typed edges and a class per node (or, for node selection, the answer).
struct GraphInstance : amp::Instance {
  int32_t nodes = 0;
  std::vector<int64_t> source, destination, type, labels;
  int64_t answer = -1;  ///< the node to select (--task deduction)
  Tensor features;                                ///< (n, F)
  std::vector<std::vector<int32_t>> outEdges;     ///< per node, ascending
  std::vector<std::vector<int32_t>> edgesOfType;  ///< per type, ascending
};

/// tree_lstm: a binarised tree with a sentiment class per node.
struct TreeInstance : amp::Instance {
  data::Tree tree;
};

}  // namespace weft::models
