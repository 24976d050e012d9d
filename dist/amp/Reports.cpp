// What an epoch reports (loss, accuracy, each node's counts, staleness and busy time, gathered
// from every process), and why a stalled run stalled.
#include "dist/amp/AmpRuntime.h"

#include "core/Error.h"
#include "dist/amp/Payloads.h"
#include "dist/amp/RuntimeState.h"

#include <fmt/format.h>

#include <algorithm>

namespace weft::amp {

/// Why nothing moves: the worker busy in one node the longest, or the nodes holding messages
/// that wait for others which will never come.
std::string Runtime::Impl::stallReport() {
  int worst = -1, worstNode = -1;
  int64_t since = 0;
  for (size_t i = 0; i < workers.size(); ++i) {
    int node = workers[i]->currentNode.load();
    int64_t at = workers[i]->currentSince.load();
    if (node >= 0 && (worst < 0 || at < since)) worst = static_cast<int>(i), since = at, worstNode = node;
  }
  std::string where = worst < 0 ? std::string()
                                : fmt::format(": worker {} is stuck in '{}'", processes.rank * options.workers + worst,
                                              nodes[static_cast<size_t>(worstNode)].spec->name);
  return fmt::format("amp: no message was processed for {:.0f} s{}", seconds(options.timeout), where);
}

/// The messages of `instance` (all, when -1) that nodes hold; read after the workers stopped.
std::string Runtime::Impl::heldMessages(int64_t instance) {
  std::string out;
  auto mine = [&](const State& s) { return instance < 0 || s.instance == instance; };
  for (const NodeRt& n : nodes) {
    for (const auto& [state, j] : n.joins)
      if (mine(state))
        out +=
            fmt::format("\n  {} '{}' holds {} of {} message(s) for {}", kindName(n.spec->kind), n.spec->name, j.arrived,
                        j.expected > 0 ? j.expected : static_cast<int>(n.spec->inputs.size()), state.str());
    for (const auto& [state, j] : n.gradJoins)
      if (mine(state) && j.arrived > 0)
        out += fmt::format("\n  {} '{}' holds {} of {} gradient(s) for {}", kindName(n.spec->kind), n.spec->name,
                           j.arrived, j.expected > 0 ? j.expected : n.spec->outputs, state.str());
  }
  return out;
}

ProcessReport Runtime::Impl::localReport() {
  ProcessReport r;
  for (const NodeRt& n : nodes) {
    if (!isLocal(n)) continue;
    r.nodes.push_back({n.spec->id, n.forwards, n.backwards, n.updatesReported, n.gradients, n.stalenessSum,
                       n.stalenessMax, n.stalenessCount, n.busy, n.sent, n.answered});
  }
  for (const auto& w : workers) r.workerBusy.push_back(w->busy);
  for (NodeRt& n : nodes)
    if (n.compiled && n.spec->kind == NodeKind::Transform)
      for (weft::Node* v : n.compiled->graph->variables())
        r.variables.push_back({n.spec->name + "/" + v->name, hostCopy(n.compiled->session->variable(v))});
  return r;
}

EpochReport Runtime::Impl::summarise(int64_t count, Clock::time_point start, double activeTime, int peak) {
  EpochReport report;
  report.instances = count;
  report.seconds = seconds(Clock::now() - start);
  report.instancesPerSecond = report.seconds > 0 ? static_cast<double>(count) / report.seconds : 0;
  report.meanActiveKeys = report.seconds > 0 ? activeTime / report.seconds : 0;
  report.peakActiveKeys = peak;
  for (ReplicaGroup& g : replicaGroups) report.replicaSyncs += g.rounds.exchange(0);
  double loss = 0, hits = 0, scored = 0;
  for (const auto& r : records) loss += r->loss, hits += r->hits, scored += r->count;
  if (processes.rank != 0) loss = epochTotals.loss, hits = epochTotals.hits, scored = epochTotals.count;
  report.loss = count > 0 ? loss / static_cast<double>(count) : 0;
  report.accuracy = scored > 0 ? hits / scored : 0;
  // This process's counts, then (at the controller) every other process's report.
  ProcessReport mine = localReport();
  std::vector<ProcessReport> all{mine};
  if (processes.rank == 0)
    for (int r = 1; r < processes.count; ++r) all.push_back(decodeReport(reports[static_cast<size_t>(r)]));
  for (const NodeRt& n : nodes) {
    NodeReport nr;
    nr.name = n.spec->name;
    nr.worker = n.worker;
    nr.sent.assign(static_cast<size_t>(n.spec->outputs), 0);
    nr.answered = nr.sent;
    report.nodes.push_back(nr);
  }
  std::vector<int64_t> stalenessSum(nodes.size(), 0), stalenessCount(nodes.size(), 0);
  for (const ProcessReport& p : all) {
    for (double busy : p.workerBusy) report.workerUtilisation.push_back(report.seconds > 0 ? busy / report.seconds : 0);
    for (const auto& c : p.nodes) {
      WEFT_CHECK(c.node >= 0 && c.node < static_cast<int>(nodes.size()) &&
                     c.sent.size() == report.nodes[static_cast<size_t>(c.node)].sent.size(),
                 "amp: a process reported node {}, which the graph does not have", c.node);
      NodeReport& nr = report.nodes[static_cast<size_t>(c.node)];
      nr.forwards += c.forwards, nr.backwards += c.backwards, nr.updates += c.updates, nr.gradients += c.gradients;
      nr.maxStaleness = std::max(nr.maxStaleness, c.stalenessMax);
      nr.busySeconds += c.busy;
      for (size_t o = 0; o < c.sent.size(); ++o) nr.sent[o] += c.sent[o], nr.answered[o] += c.answered[o];
      stalenessSum[static_cast<size_t>(c.node)] += c.stalenessSum;
      stalenessCount[static_cast<size_t>(c.node)] += c.stalenessCount;
    }
    if (&p != &all.front())
      for (const auto& [name, value] : p.variables) remoteVariables[name] = value;
  }
  for (size_t i = 0; i < nodes.size(); ++i)
    report.nodes[i].meanStaleness =
        stalenessCount[i] > 0 ? static_cast<double>(stalenessSum[i]) / static_cast<double>(stalenessCount[i]) : 0;
  return report;
}

std::string EpochReport::summary() const {
  std::string workers;
  for (double u : workerUtilisation) workers += fmt::format(" {:.0f}%", 100 * u);
  std::string stale;
  for (const NodeReport& n : nodes)
    if (n.gradients > 0) stale += fmt::format(" {} {:.2f}", n.name, n.meanStaleness);
  return fmt::format("loss {:.4f} accuracy {:.4f} | {:.1f} instances/s | active keys {:.2f} | workers{}{}", loss,
                     accuracy, instancesPerSecond, meanActiveKeys, workers,
                     stale.empty() ? "" : " | staleness" + stale);
}

}  // namespace weft::amp
