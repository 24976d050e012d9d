// Sparse synchronisation chosen from measured sparsity (see the header).
#include "dist/Sparsity.h"

#include "core/Error.h"
#include "dist/Placement.h"
#include "ops/RowIds.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace weft::dist {

std::map<std::string, double> measureSparsity(Graph& graph, const std::vector<FeedMap>& feeds) {
  std::vector<GradientLink> sparse;
  for (const GradientLink& l : graph.gradientLinks())
    if (l.sparse) sparse.push_back(l);
  std::map<std::string, double> alpha;
  if (sparse.empty() || feeds.empty()) return alpha;
  std::vector<Output> ids;
  for (const GradientLink& l : sparse) ids.push_back(l.indices);
  Session session(graph, SessionOptions{1, false});
  for (const FeedMap& feed : feeds) {
    const std::vector<Tensor> got = session.run(ids, feed);
    for (size_t i = 0; i < sparse.size(); ++i) {
      const std::vector<int64_t> rows = rowIds(got[i]);
      const auto distinct = static_cast<double>(std::set<int64_t>(rows.begin(), rows.end()).size());
      alpha[sparse[i].variable->name] += distinct / static_cast<double>(sparse[i].variable->output().shape()[0]);
    }
  }
  for (auto& [name, a] : alpha) a /= static_cast<double>(feeds.size());
  return alpha;
}

SyncBytes sparseSyncBytes(double alpha, double bytes, double countBytes, const std::vector<double>& shares) {
  const auto n = static_cast<double>(shares.size());
  SyncBytes out;
  if (shares.size() < 2) return out;  // nothing crosses between machines
  for (const double share : shares)
    out.servers = std::max(out.servers, 2 * alpha * bytes * (share * (n - 1) + 1 - share));
  out.allReduce = 4 * (bytes + countBytes) * (n - 1) / n;
  return out;
}

std::string SparsityChoice::describe() const {
  return fmt::format("sparse variable '{}': alpha {:.3f} on {} machines; the busiest machine moves {:.0f} bytes a step "
                     "on the servers, {:.0f} by AllReduce: {}",
                     variable, alpha, machines, bytes.servers, bytes.allReduce,
                     allReduce ? "AllReduce" : "servers");
}

std::vector<SparsityChoice> chooseBySparsity(const ServerPlan& plan, const std::map<std::string, double>& alphas,
                                             const std::vector<int>& serverHosts, int machines) {
  std::vector<SparsityChoice> out;
  for (const ServedVariable& v : plan.variables) {
    const auto alpha = alphas.find(v.variable->name);
    if (!v.sparse || alpha == alphas.end()) continue;
    std::vector<double> shares(static_cast<size_t>(std::max(machines, 1)), 0.0);
    for (const int p : v.partitions) {
      const Partition& part = plan.partitions[static_cast<size_t>(p)];
      const auto host = static_cast<size_t>(serverHosts.at(static_cast<size_t>(part.server)));
      WEFT_CHECK(host < shares.size(), "server {} runs on machine {} of {}", part.server, host, shares.size());
      shares[host] += static_cast<double>(part.rows) / static_cast<double>(v.rows());
    }
    const auto rows = static_cast<double>(v.rows());
    SparsityChoice c;
    c.variable = v.variable->name;
    c.alpha = alpha->second;
    c.machines = machines;
    c.bytes = sparseSyncBytes(c.alpha, static_cast<double>(v.rowBytes()) * rows,
                              static_cast<double>(dtypeSize(v.gradient.values.dtype())) * rows, shares);
    c.allReduce = machines > 1 && c.bytes.allReduce < c.bytes.servers;
    out.push_back(c);
  }
  return out;
}

}  // namespace weft::dist
