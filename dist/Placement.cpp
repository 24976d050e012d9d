// The parameter-server placement plan (see the header).
#include "dist/Placement.h"

#include "core/Error.h"
#include "core/OpRegistry.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <set>

namespace weft::dist {

namespace {

using Consumers = std::map<const Node*, std::vector<Node*>>;

Consumers consumersOf(const Graph& graph) {
  Consumers out;
  for (const auto& n : graph.nodes()) {
    std::set<const Node*> seen;
    for (const Output& in : n->inputs)
      if (seen.insert(in.node()).second) out[in.node()].push_back(n.get());
  }
  return out;
}

bool isNormOp(const Node* n) { return n->op == "SquaredNorm" || n->op == "SparseSquaredNorm"; }

std::vector<Output> gradientOutputs(const GradientLink& g) {
  return g.sparse ? std::vector<Output>{g.indices, g.values} : std::vector<Output>{g.dense};
}

bool readsAny(const Node* n, const std::vector<Output>& outputs) {
  return std::any_of(n->inputs.begin(), n->inputs.end(), [&](const Output& in) {
    return std::find(outputs.begin(), outputs.end(), in) != outputs.end();
  });
}

/// The op that writes `variable` and is computed from its gradient: the optimizer's update.
Node* updateOf(const Node* variable, const std::set<const Node*>& fromGradient, const Consumers& consumers) {
  auto it = consumers.find(variable);
  if (it == consumers.end()) return nullptr;
  for (Node* n : it->second) {
    for (int m : n->def->mutatedInputs)
      if (n->inputs[static_cast<size_t>(m)].node() == variable && fromGradient.count(n)) return n;
  }
  return nullptr;
}

/// Nodes computed from the gradient, not looking past squared-norm ops (those become requests).
std::set<const Node*> descendants(const GradientLink& g, const Consumers& consumers) {
  std::set<const Node*> seen;
  std::vector<const Node*> stack;
  for (const Output& o : gradientOutputs(g)) {
    auto it = consumers.find(o.node());
    if (it == consumers.end()) continue;
    for (const Node* c : it->second)  // readers of this output, not of the node's other outputs
      if (!isNormOp(c) && readsAny(c, {o}) && seen.insert(c).second) stack.push_back(c);
  }
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    auto it = consumers.find(n);
    if (it == consumers.end()) continue;
    for (const Node* c : it->second)
      if (!isNormOp(c) && seen.insert(c).second) stack.push_back(c);
  }
  return seen;
}

std::set<const Node*> ancestors(const Node* node) {
  std::set<const Node*> seen;
  std::vector<const Node*> stack{node};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const Output& in : n->inputs)
      if (seen.insert(in.node()).second) stack.push_back(in.node());
  }
  return seen;
}

/// Fills update, slots, chain, extras and squaredNorm; false when no update op writes the variable.
bool describeUpdate(ServedVariable& v, const Consumers& consumers, const std::map<const Node*, size_t>& position,
                    const std::string& purpose) {
  const std::set<const Node*> fromGradient = descendants(v.gradient, consumers);
  v.update = updateOf(v.variable, fromGradient, consumers);
  if (v.update == nullptr) return false;
  const std::string& name = v.variable->name;
  for (int m : v.update->def->mutatedInputs) {
    Node* written = v.update->inputs[static_cast<size_t>(m)].node();
    if (written == v.variable) continue;
    WEFT_CHECK(written->outputs[0].shape.dims() == v.variable->outputs[0].shape.dims(),
               "variable '{}' cannot be {}: its update {} also writes '{}' of shape {}, not the variable's {}",
               name, purpose, v.update->describe(), written->name, written->outputs[0].shape.str(),
               v.variable->outputs[0].shape.str());
    v.slots.push_back(written);
  }
  const std::set<const Node*> feedsUpdate = ancestors(v.update);
  for (const Node* n : fromGradient)
    if (feedsUpdate.count(n)) v.chain.push_back(const_cast<Node*>(n));
  v.chain.push_back(v.update);
  std::sort(v.chain.begin(), v.chain.end(),
            [&](const Node* a, const Node* b) { return position.at(a) < position.at(b); });

  const std::vector<Output> grad = gradientOutputs(v.gradient);
  for (const Output& o : grad) {
    for (Node* c : consumers.at(o.node())) {
      if (!readsAny(c, {o})) continue;
      if (isNormOp(c)) {
        WEFT_CHECK(v.squaredNorm == nullptr || v.squaredNorm == c, "the gradient of '{}' has two norms: {} and {}",
                   name, v.squaredNorm->describe(), c->describe());
        v.squaredNorm = c;
      } else if (std::find(v.chain.begin(), v.chain.end(), c) == v.chain.end()) {
        WEFT_THROW("variable '{}' cannot be {}: its gradient is also read by {}, which is neither its update nor "
                   "clipping",
                   name, purpose, c->describe());
      }
    }
  }
  for (Node* n : consumers.at(v.variable)) {
    if (n->op != "AssignMovingAverage" || n->inputs[1] != v.variable->output()) continue;
    const Node* shadow = n->inputs[0].node();
    WEFT_CHECK(shadow->op == "Variable" && shadow->outputs[0].shape.dims() == v.variable->outputs[0].shape.dims(),
               "variable '{}' cannot be {}: its moving average {} writes '{}' of shape {}, not a variable of its "
               "shape {}", name, purpose, n->describe(), shadow->name, shadow->outputs[0].shape.str(),
               v.variable->outputs[0].shape.str());
    v.averages.push_back(n);
  }
  std::set<Output> extras;
  for (const Node* n : v.chain) {
    for (const Output& in : n->inputs) {
      const bool internal = std::find(v.chain.begin(), v.chain.end(), in.node()) != v.chain.end();
      const bool state =
          in.node() == v.variable || std::find(v.slots.begin(), v.slots.end(), in.node()) != v.slots.end();
      const bool gradient = std::find(grad.begin(), grad.end(), in) != grad.end();
      if (internal || state || gradient || !extras.insert(in).second) continue;
      WEFT_CHECK(in.shape().isFullyDefined(), "variable '{}' cannot be {}: {} reads {} of unknown shape {}", name,
                 purpose, n->describe(), in.name(), in.shape().str());
      v.extras.push_back(in);
    }
  }
  return true;
}

/// How many partitions `v` is split into under `rule` and the partitioner scope it was made in.
int64_t partitionCount(const Graph& graph, const ServedVariable& v, int servers, const Partitioning& rule) {
  if (!v.sparse) return 1;
  const std::optional<int> requested = graph.requestedPartitions(v.variable);
  const int64_t jobCount = rule.count > 0 ? rule.count : servers;
  int64_t count = 1;
  if (requested) {
    count = *requested == Graph::kJobPartitions ? jobCount : *requested;
  } else if (static_cast<size_t>(v.rows()) * v.rowBytes() >= rule.bytes) {
    count = jobCount;
  }
  return std::clamp<int64_t>(count, 1, v.rows());
}

/// Splits every variable into partitions and spreads them over the servers.
void partition(const Graph& graph, ServerPlan& plan, const Partitioning& rule) {
  for (size_t i = 0; i < plan.variables.size(); ++i) {
    ServedVariable& v = plan.variables[i];
    const int64_t rows = v.rows();
    const int64_t parts = partitionCount(graph, v, plan.servers, rule);
    for (int64_t k = 0; k < parts; ++k) {
      Partition p;
      p.variable = static_cast<int>(i);
      p.first = k;
      p.stride = parts;
      p.rows = (rows - k + parts - 1) / parts;
      p.bytes = static_cast<size_t>(p.rows) * v.rowBytes();
      v.partitions.push_back(static_cast<int>(plan.partitions.size()));
      plan.partitions.push_back(p);
    }
  }
  std::vector<size_t> order(plan.partitions.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return plan.partitions[a].bytes > plan.partitions[b].bytes; });
  std::vector<size_t> load(static_cast<size_t>(plan.servers), 0);
  for (size_t i : order) {
    const auto least = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    plan.partitions[i].server = least;
    load[static_cast<size_t>(least)] += plan.partitions[i].bytes;
  }
}

}  // namespace

void packRows(const Partition& p, size_t rowBytes, const uint8_t* whole, uint8_t* packed) {
  if (p.stride == 1) return (void)std::memcpy(packed, whole + static_cast<size_t>(p.first) * rowBytes, p.bytes);
  for (int64_t i = 0; i < p.rows; ++i)
    std::memcpy(packed + static_cast<size_t>(i) * rowBytes,
                whole + static_cast<size_t>(p.first + i * p.stride) * rowBytes, rowBytes);
}

void unpackRows(const Partition& p, size_t rowBytes, const uint8_t* packed, uint8_t* whole) {
  if (p.stride == 1) return (void)std::memcpy(whole + static_cast<size_t>(p.first) * rowBytes, packed, p.bytes);
  for (int64_t i = 0; i < p.rows; ++i)
    std::memcpy(whole + static_cast<size_t>(p.first + i * p.stride) * rowBytes,
                packed + static_cast<size_t>(i) * rowBytes, rowBytes);
}

size_t ServedVariable::rowBytes() const {
  const Shape& s = variable->outputs[0].shape;
  size_t n = dtypeSize(variable->outputs[0].dtype);
  for (int d = 1; d < s.rank(); ++d) n *= static_cast<size_t>(s[d]);
  return n;
}

std::vector<Node*> ServedVariable::heldState() const {
  std::vector<Node*> out = slots;
  for (const Node* average : averages) out.push_back(average->inputs[0].node());
  return out;
}

const ServedVariable* ServerPlan::find(const Node* node) const {
  for (const ServedVariable& v : variables)
    if (v.variable == node) return &v;
  return nullptr;
}

int ServerPlan::largestPartitionCount() const {
  size_t most = 0;
  for (const ServedVariable& v : variables) most = std::max(most, v.partitions.size());
  return static_cast<int>(most);
}

ServerPlan planServers(const Graph& graph, Architecture architecture, int servers, const Partitioning& partitioning,
                       const std::set<std::string>& allReduced) {
  ServerPlan plan;
  plan.servers = servers;
  if (architecture == Architecture::AllReduce) return plan;
  const Consumers consumers = consumersOf(graph);
  std::map<const Node*, size_t> position;  // in topological order, which the chain is copied in
  for (const Node* n : graph.topologicalOrder()) position.emplace(n, position.size());
  for (const GradientLink& link : graph.gradientLinks()) {
    if (architecture == Architecture::Auto && (!link.sparse || allReduced.count(link.variable->name))) continue;
    ServedVariable v;
    v.variable = link.variable;
    v.sparse = link.sparse;
    v.gradient = link;
    const Shape& shape = v.variable->outputs[0].shape;
    WEFT_CHECK(shape.rank() >= 1 && shape.isFullyDefined(),
               "variable '{}' of shape {} cannot be served: a served variable needs rows and a static shape",
               v.variable->name, shape.str());
    if (describeUpdate(v, consumers, position, "served")) plan.variables.push_back(std::move(v));
  }
  WEFT_CHECK(plan.empty() || servers > 0,
             "architecture '{}' puts {} variables on parameter servers, but the job has no server",
             architectureName(architecture), plan.variables.size());
  partition(graph, plan, partitioning);
  return plan;
}

std::vector<ServedVariable> describeUpdates(const Graph& graph, const std::vector<GradientLink>& links,
                                           const std::string& purpose) {
  const Consumers consumers = consumersOf(graph);
  std::map<const Node*, size_t> position;
  for (const Node* n : graph.topologicalOrder()) position.emplace(n, position.size());
  std::vector<ServedVariable> updates;
  for (const GradientLink& link : links) {
    ServedVariable v;
    v.variable = link.variable;
    v.sparse = link.sparse;
    v.gradient = link;
    if (describeUpdate(v, consumers, position, purpose)) updates.push_back(std::move(v));
  }
  return updates;
}

ServerPlan planServersBySparsity(const Graph& graph, const Config& config, int servers,
                                 const std::vector<int>& serverHosts, int machines,
                                 std::vector<SparsityChoice>& choices) {
  ServerPlan plan = planServers(graph, config.architecture, servers, config.partitioning);
  choices.clear();
  if (config.architecture != Architecture::Auto || config.sparsity.empty()) return plan;
  choices = chooseBySparsity(plan, config.sparsity, serverHosts, machines);
  std::set<std::string> allReduced;
  for (const SparsityChoice& c : choices)
    if (c.allReduce) allReduced.insert(c.variable);
  if (allReduced.empty()) return plan;
  return planServers(graph, config.architecture, servers, config.partitioning, allReduced);
}

}  // namespace weft::dist
