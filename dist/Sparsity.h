// How a sparse variable is synchronised under Architecture::Auto, decided from its measured
// sparsity: the sparsity-aware paper's Table 3 gives the bytes each machine moves per step on
// the parameter servers and by a dense AllReduce; a variable whose pushes touch so many of its
// rows that the AllReduce moves fewer bytes through the busiest machine is summed densely
// instead of served (its sparse update still sees only the rows touched; dist/Transform.h).
//
//     config.sparsity = dist::measureSparsity(graph, feedsOfAFewBatchesPerWorker);
//     Runner runner = dist::get_runner(graph, spec, config);
//     for (const auto& c : runner.sparsityChoices()) fmt::print("{}\n", c.describe());
#pragma once

#include "core/Graph.h"
#include "core/Session.h"

#include <map>
#include <string>
#include <vector>

namespace weft::dist {

struct ServerPlan;

/// The paper's alpha of every sparse gradient of `graph`, by variable name: the fraction of the
/// variable's rows a worker's gradient touches, averaged over the feeds (each a worker's part of
/// a batch). Runs only what the gradients' ids depend on (for an embedding, its lookups' ids), in
/// a session of its own.
std::map<std::string, double> measureSparsity(Graph& graph, const std::vector<FeedMap>& feeds);

/// Bytes per step through the busiest machine for one sparse variable.
struct SyncBytes {
  double servers = 0;    ///< on the parameter servers
  double allReduce = 0;  ///< summed by a dense AllReduce
};

/// Table 3's bytes for one sparse variable of w = `bytes` bytes whose pushes touch a fraction
/// `alpha` of its rows, on machines whose servers hold shares[h] of its rows (one share per
/// machine, summing to 1). On the servers machine h moves 2 alpha w (shares[h] (N - 1) + 1 -
/// shares[h]): pulls and pushes of the rows it serves, from the N - 1 others, and of the rows the
/// others serve. By AllReduce each machine moves 4 (w + c) (N - 1) / N, where c = `countBytes`
/// are the per-row counts of ids summed beside the rows. One machine moves nothing either way.
SyncBytes sparseSyncBytes(double alpha, double bytes, double countBytes, const std::vector<double>& shares);

/// What chooseBySparsity decided for one variable, and why.
struct SparsityChoice {
  std::string variable;
  double alpha = 0;
  SyncBytes bytes;
  int machines = 0;
  bool allReduce = false;
  /// "sparse variable 'emb': alpha 0.83 on 4 machines; the busiest machine moves 1200000 bytes a
  /// step on the servers, 900000 by AllReduce: AllReduce".
  std::string describe() const;
};

/// For each served sparse variable of `plan` with a measured alpha: which way moves fewer bytes through
/// the busiest of `machines` machines, where server s runs on machine serverHosts[s]. One
/// machine moves nothing between machines either way: its variables stay on the servers.
std::vector<SparsityChoice> chooseBySparsity(const ServerPlan& plan, const std::map<std::string, double>& alphas,
                                             const std::vector<int>& serverHosts, int machines);

}  // namespace weft::dist
