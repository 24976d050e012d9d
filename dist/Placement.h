// Where each variable lives under the parameter-server architectures, computed the same way by
// every process of a job from its own copy of the model graph (so workers and servers agree
// without exchanging a plan).
//
// A variable goes to the servers when the architecture says so (AUTO: variables with sparse
// gradients; PS: every trained variable) and an optimizer update op writes it. A sparse one is
// split into row partitions (Partitioning: as many as its partitioner scope says, or the job's
// count when it is at least Partitioning::bytes); partitions are spread over the servers by
// bytes, largest first, each to the least loaded server.
//
// What the server runs for a variable is the optimizer's update op and the ops between the
// gradient and it (global-norm clipping's scaling, casts): the "chain". Its inputs besides the
// gradient, the variable and the optimizer slots (learning rate, step, clipping scale) are the
// "extras", which worker 0 sends with every step. A squared-norm op over the gradient (the
// first half of clipping by global norm) is answered by the servers: they hold the aggregated
// gradient.
#pragma once

#include "core/Graph.h"
#include "dist/Config.h"

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace weft::dist {

/// Rows of a variable held by one server. A variable in P partitions is dealt out row by row:
/// row r goes to partition r mod P as its row r / P. The frequent ids of a Zipfian vocabulary
/// are the low ones, so blocks of consecutive rows would put most of a step's rows, and most of
/// the traffic, on the server of the first block.
struct Partition {
  int variable = 0;  ///< index into ServerPlan::variables
  int64_t first = 0;   ///< the variable's row held as this partition's row 0
  int64_t stride = 1;  ///< the partition's row i is the variable's row first + i * stride
  int64_t rows = 0;
  int server = 0;
  size_t bytes = 0;
};

/// Copies partition `p`'s rows (of `rowBytes` each) out of the whole variable's bytes into
/// `packed` (p.bytes), or back.
void packRows(const Partition& p, size_t rowBytes, const uint8_t* whole, uint8_t* packed);
void unpackRows(const Partition& p, size_t rowBytes, const uint8_t* packed, uint8_t* whole);

/// A variable held by the servers.
struct ServedVariable {
  Node* variable = nullptr;
  bool sparse = false;
  GradientLink gradient;
  Node* update = nullptr;          ///< the optimizer's update op
  std::vector<Node*> slots;        ///< the other variables the update writes (momentum, Adam's m and v)
  /// AssignMovingAverage ops that average the variable into a shadow variable
  /// (optim::ExponentialMovingAverage): the servers hold the shadows next to the variable and run
  /// them after each update.
  std::vector<Node*> averages;
  std::vector<Node*> chain;        ///< from the gradient to the update (included), in topological order
  std::vector<Output> extras;      ///< what the chain reads besides gradient, variable and slots
  Node* squaredNorm = nullptr;     ///< SquaredNorm / SparseSquaredNorm of the gradient, if clipped
  std::vector<int> partitions;     ///< indices into ServerPlan::partitions, by first row
  int64_t rows() const { return variable->outputs[0].shape[0]; }
  /// Which of `partitions` (a position in it) holds `row`, and as which of its rows.
  size_t partitionOfRow(int64_t row) const { return static_cast<size_t>(row) % partitions.size(); }
  int64_t localRow(int64_t row) const { return row / static_cast<int64_t>(partitions.size()); }
  /// Bytes of one row of the variable.
  size_t rowBytes() const;
  /// What the servers hold besides the variable, in the order LOAD carries and FETCH returns it
  /// after the variable: the slots, then the moving averages' shadows.
  std::vector<Node*> heldState() const;
};

struct ServerPlan {
  std::vector<ServedVariable> variables;
  std::vector<Partition> partitions;
  int servers = 0;
  bool empty() const { return variables.empty(); }
  /// The served variable of `node`, or nullptr.
  const ServedVariable* find(const Node* node) const;
  /// The most partitions any variable is split into (0 without served variables).
  int largestPartitionCount() const;
};

/// The plan for `graph` (not modified) under `architecture` with `servers` servers; empty for
/// the AllReduce architecture. Throws naming the variable when one cannot be served (a gradient
/// used by something other than its update and clipping, slots of another shape, a variable
/// without rows).
/// Under Auto, the sparse variables named in `allReduced` are left out.
ServerPlan planServers(const Graph& graph, Architecture architecture, int servers, const Partitioning& partitioning,
                       const std::set<std::string>& allReduced = {});

/// The update of each variable of `links` that an update op writes, taken apart as planServers
/// does for a served variable (update, slots, chain, extras, squared norm, moving averages; no
/// partitions). Throws naming the variable when its update cannot be run apart from the rest of
/// the step, saying that it cannot be `purpose` ("served", "sharded").
std::vector<ServedVariable> describeUpdates(const Graph& graph, const std::vector<GradientLink>& links,
                                           const std::string& purpose);

/// planServers under `config`, with the choices of chooseBySparsity applied under Auto when
/// config.sparsity measures variables (server s runs on machine serverHosts[s] of `machines`):
/// the variables it gives to AllReduce leave the plan. `choices` receives every choice made.
ServerPlan planServersBySparsity(const Graph& graph, const Config& config, int servers,
                                 const std::vector<int>& serverHosts, int machines,
                                 std::vector<SparsityChoice>& choices);

}  // namespace weft::dist
