// Graph networks over batches of disjoint graphs (data/Graphs.h): a gated graph sequence network
// (GGSNN, Li et al. 2016: typed-edge messages summed per node, GRU updates) and a graph
// convolutional network (GCN, Kipf & Welling 2017), as node classifiers.
#pragma once

#include "models/ZooModel.h"
#include "nn/Layers.h"

#include <memory>
#include <string>

namespace weft::models {

struct GnnConfig {
  std::string kind = "ggsnn";  // ggsnn or gcn
  int64_t features = 2;        // F
  int64_t edgeTypes = 3;       // K (the GCN ignores types)
  int64_t classes = 3;
  int64_t hidden = 32;  // node state width (GGSNN: >= F, features are zero-padded)
  int64_t steps = 5;    // GGSNN propagation steps, or GCN layers
  uint64_t seed = 1;
  DType dtype = f32;
  Recompute recompute = Recompute::None;  // each propagation step (layer) a recompute segment of this mode
};

struct GnnGraph {
  // placeholders named like collateGraphs' fields
  Output features;   // (N, F) f32
  Output edges;      // (E, 2) i32
  Output edgeTypes;  // (E) i32
  Output labels;     // (N) i64
  Output nodeGraph;  // (N) i32: fed with every batch; evaluation groups nodes by graph on the host
  Output logits;     // (N, classes)
  Output loss;       // mean cross-entropy over nodes
  Output accuracy;   // fraction of nodes classified correctly
  Output hits;       // (N) i64: 1 where a node is classified correctly
};

/// Builds the network in `g`.
GnnGraph buildGnn(Graph& g, const GnnConfig& config);

/// One GCN aggregation with self loops and symmetric normalisation: out[d] = h[d] / deg(d) + sum
/// over edges s -> d of h[s] / sqrt(deg(s) deg(d)), with deg(v) = 1 + in-degree(v).
Output gcnAggregate(Output h, Output src, Output dst);

/// The zoo's "gnn": node classification on the generated typed-reachability task, or on a graph
/// file (--data, with node labels; its last tenth is held out).
std::unique_ptr<ZooModel> makeGnnModel();

}  // namespace weft::models
