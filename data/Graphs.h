// Graph data for graph networks: the weft text graph format (docs/graph-format.md) with a
// checking loader and a writer, a seeded typed-edge reachability task, and batching of graphs
// into one disjoint graph per batch.
//
// A graph is an Example with the fields
//   "features"   f32 [n, F]   node features
//   "edges"      i32 [e, 2]   directed edges (source, destination), node ids in [0, n)
//   "edge_types" i32 [e]      edge types in [0, K)
//   "labels"     i64 [n]      node labels (optional)
//   "target"     f32 []       graph-level target (optional)
#pragma once

#include "data/Dataset.h"

#include <string>
#include <vector>

namespace weft::data {

/// Limits of a graph file: what a file says decides what a model allocates (a weight matrix per
/// edge type, a logit per label), so these are refused with a message before anything is built.
inline constexpr int64_t kMaxGraphFeatures = 65536;  ///< features= in the header
inline constexpr int64_t kMaxEdgeTypes = 1024;       ///< edge_types= in the header
inline constexpr int64_t kMaxNodeLabel = 65535;      ///< a node label (classes: the largest + 1)
inline constexpr uint64_t kMaxGraphFileBytes = uint64_t{4} << 30;

/// What every graph of a file has: its header line.
struct GraphFileInfo {
  int64_t features = 1;   // F: features per node
  int64_t edgeTypes = 1;  // K: edge types are 0 .. K-1
  bool nodeLabels = false;
  bool graphTarget = false;
};

struct GraphFile {
  GraphFileInfo info;
  Dataset graphs;
};

/// Reads a graph file, checking everything; a bad file throws naming the file, the line and
/// the offending value (a node id, an edge type, a field; raw bytes escaped), and a count over
/// the limits above is refused. Only a regular file of at most kMaxGraphFileBytes is read.
GraphFile loadGraphs(const std::string& path);
/// Writes graphs in the format loadGraphs reads (floats printed to round-trip exactly).
void saveGraphs(const std::string& path, const GraphFileInfo& info, const std::vector<Example>& graphs);

/// The generated GGSNN task: a directed graph with typed edges and one marked source node. Each
/// node is labelled 2 if the source reaches it using edges of type 0 only, else 1 if the source
/// reaches it at all, else 0 (the source itself is 2). Features are one-hot [is source, is not].
/// Graphs whose shortest paths (over all edges or type-0 edges) exceed maxDepth are redrawn, so
/// maxDepth propagation steps suffice.
struct ReachabilitySpec {
  int64_t minNodes = 6;
  int64_t maxNodes = 14;
  double edgesPerNode = 1.5;
  int64_t edgeTypes = 3;
  int64_t maxDepth = 4;
};
constexpr int64_t kReachabilityClasses = 3;
constexpr int64_t kReachabilityFeatures = 2;

/// `count` graphs; graph i is a function of (spec, seed, i) alone.
std::vector<Example> typedReachability(const ReachabilitySpec& spec, int64_t count, uint64_t seed);

/// The bAbI task 15 (basic deduction: "Sheep are afraid of wolves. Gertrude is a sheep. What is
/// Gertrude afraid of?") as a graph, enlarged as the AMPNet paper enlarges bAbI graphs. Nodes
/// 0 .. species-1 are species, each afraid of another species (an edge of type 1 from it to
/// the feared one); the remaining nodes are individuals, each of one species (an edge of type 0
/// from the individual to its species). One individual is asked about (features [1, 0]; every
/// other node [0, 1]); the answer node, the species its species is afraid of, is labelled 1 and
/// every other node 0. Answering takes two hops, each along one edge type.
struct DeductionSpec {
  int64_t species = 6;
  int64_t individuals = 14;
};
constexpr int64_t kDeductionFeatures = 2;
constexpr int64_t kDeductionEdgeTypes = 2;

/// `count` graphs; graph i is a function of (spec, seed, i) alone.
std::vector<Example> basicDeduction(const DeductionSpec& spec, int64_t count, uint64_t seed);

/// Concatenates graphs into one disjoint graph: node fields are stacked, edges are offset by the
/// nodes before them, "target" becomes [B], and "node_graph" i32 [N] gives each node's graph.
/// All graphs must have the same fields and feature width.
Batch collateGraphs(const std::vector<const Example*>& graphs);

/// Part `index` of `count` of a batch from collateGraphs, by whole graphs (each part takes
/// batch-size / count consecutive graphs, their nodes and their edges, renumbered from 0); a
/// "node_count" field is kept as it is. How data-parallel workers share a batch of graphs;
/// throws when the graphs do not divide evenly.
Batch sliceGraphs(const Batch& batch, int64_t index, int64_t count);

/// Batches of `batchSize` graphs through collateGraphs, epoch after epoch, in an order that is a
/// function of (seed, epoch); the last partial batch of an epoch is dropped. With countNodes,
/// each batch also holds "node_count", f64 []: its nodes, to normalise a per-node loss by the
/// nodes of the whole batch when workers each take a part of it.
class GraphBatcher : public BatchSource {
 public:
  GraphBatcher(Dataset graphs, int64_t batchSize, uint64_t seed, bool shuffle = true, bool countNodes = false);

  /// From now on each batch is part `index` of `count` of the batch it would be, as sliceGraphs
  /// cuts it, and only that part's graphs are collated; "node_count" is the whole batch's nodes
  /// divided by `count`. Throws when the batch size is not a multiple of `count`.
  bool readPart(int64_t index, int64_t count) override;
  Batch next() override;
  int64_t position() const override { return position_; }
  void seek(int64_t position) override;
  int64_t batchesPerEpoch() const override { return perEpoch_; }
  uint64_t dataHash() const override { return graphs_.hash(); }

 private:
  const std::vector<size_t>& orderOf(int64_t epoch);

  Dataset graphs_;
  int64_t batchSize_;
  uint64_t seed_;
  bool shuffle_;
  bool countNodes_;
  int64_t perEpoch_;
  int64_t part_ = 0;
  int64_t parts_ = 1;
  int64_t position_ = 0;
  int64_t epoch_ = -1;
  std::vector<size_t> order_;
};

}  // namespace weft::data
