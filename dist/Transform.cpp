// The distribution pass (see the header).
#include "dist/Transform.h"

#include "core/Error.h"
#include "core/OpRegistry.h"
#include "dist/collective/CollectiveOps.h"
#include "dist/Placement.h"
#include "dist/server/ServerOps.h"
#include "ops/Ops.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_set>

namespace weft::dist {

namespace {

/// Every node the gradient outputs depend on, themselves included: the backward pass.
std::unordered_set<const Node*> backwardNodes(const std::vector<GradientLink>& links) {
  std::unordered_set<const Node*> seen;
  std::vector<const Node*> stack;
  for (const GradientLink& l : links) {
    for (const Output& o : {l.dense, l.indices, l.values})
      if (o.valid()) stack.push_back(o.node());
  }
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    for (const Output& in : n->inputs) stack.push_back(in.node());
    for (const Node* c : n->controlInputs) stack.push_back(c);
  }
  return seen;
}

/// Redirects `from` to `to` in every node that consumes it after the backward pass.
class Rewirer {
 public:
  Rewirer(Graph& graph, const std::vector<GradientLink>& links) : backward_(backwardNodes(links)) {
    for (const auto& n : graph.nodes())
      if (!backward_.count(n.get())) after_.push_back(n.get());
  }
  /// Whether anything after the backward pass consumes `o`.
  bool consumed(const Output& o) const {
    return std::any_of(after_.begin(), after_.end(), [&](const Node* n) {
      return std::find(n->inputs.begin(), n->inputs.end(), o) != n->inputs.end();
    });
  }
  void redirect(const std::vector<std::pair<Output, Output>>& replacements) {
    replacements.at(0).first.graph().replaceUses(replacements, after_);
  }

 private:
  std::unordered_set<const Node*> backward_;
  std::vector<Node*> after_;  // taken before any collective exists, so those are never redirected
};

size_t byteSize(const Output& o) {
  const int64_t n = o.shape().numel();
  WEFT_CHECK(n >= 0, "the gradient {} has shape {}: a dense gradient needs a static shape to be bucketed",
             o.name(), o.shape().str());
  return static_cast<size_t>(n) * dtypeSize(o.dtype());
}

/// A sparse gradient summed by a dense AllReduce, for a sparse variable whose pushes touch so
/// many of its rows that the dense sum moves fewer bytes (see chooseBySparsity). Each row's count
/// of ids is summed beside it, and the sparse update still receives sparse rows: exactly the rows
/// some worker touched, as one process's update would (lazy optimizers decay only those).
std::pair<Output, Output> allReduceRows(const GradientLink& l, const TransformOptions& options, double scale) {
  Graph& g = l.indices.graph();
  auto scope = g.scope(l.variable->name + "/allreduced_rows");
  const int64_t rows = l.variable->output().shape()[0];
  const Output counts = unsortedSegmentSum(onesLike(cast(l.indices, l.values.dtype())), l.indices, rows);
  const std::vector<Output> summed =
      allReduce({unsortedSegmentSum(l.values, l.indices, rows), counts}, options.hostRing, scale);
  return touchedRows(summed[0], summed[1], l.indices.dtype());
}

}  // namespace

// A batch norm fused with its ReLU (ops/Fusion.h) normalises from the summed moments with the
// ReLU applied ("relu"), and its gradient op's ReLU mask is applied to dy before the moments.
int synchronizeBatchNorm(Graph& graph, int64_t hostRing) {
  std::vector<Node*> forward, backward;
  for (const auto& n : graph.nodes()) {
    if (n->op == "BatchNormTrain" || n->op == "BatchNormReluTrain") forward.push_back(n.get());
    if (n->op == "BatchNormGrad" || n->op == "BatchNormReluGrad") backward.push_back(n.get());
  }
  std::map<Output, Output> totalMomentsOf;  // a replacement's invstd output -> its summed moments
  for (Node* n : forward) {
    auto scope = graph.scope(n->name + "/synchronized");
    const Output x = n->inputs[0];
    const Output total = allReduce({batchNormMoments(x)}, hostRing, 1.0)[0];
    Attrs attrs = n->attrs;
    attrs.set("relu", n->op == "BatchNormReluTrain");
    Node* replacement = graph.addNode("BatchNormFromMoments", {x, n->inputs[1], n->inputs[2], total}, attrs);
    for (int i = 0; i < 4; ++i) graph.replaceUses(n->output(i), replacement->output(i));
    totalMomentsOf[replacement->output(3)] = total;
  }
  for (Node* n : backward) {
    auto scope = graph.scope(n->name + "/synchronized");
    const auto moments = totalMomentsOf.find(n->inputs[4]);  // invstd of its forward op
    WEFT_CHECK(moments != totalMomentsOf.end(), "{} does not read the statistics of a BatchNormTrain", n->describe());
    const bool relu = n->op == "BatchNormReluGrad";
    const Output dy = relu ? graph.addNode("ReluGrad", {n->inputs[0], n->inputs[5]})->output(0) : n->inputs[0];
    const auto statGrads = n->inputs.begin() + (relu ? 6 : 5);  // dmean, dvar when given
    std::vector<Output> gradInputs{dy, n->inputs[1], n->inputs[3], n->inputs[4]};
    gradInputs.insert(gradInputs.end(), statGrads, n->inputs.end());
    const Output local = graph.addNode("BatchNormGradMoments", gradInputs)->output(0);
    const Output total = allReduce({local}, hostRing, 1.0)[0];
    Node* replacement = graph.addNode("BatchNormGradFromMoments", {dy, n->inputs[1], n->inputs[2], n->inputs[3],
                                                                    n->inputs[4], local, total, moments->second});
    for (int i = 0; i < 3; ++i) graph.replaceUses(n->output(i), replacement->output(i));
  }
  return static_cast<int>(forward.size());
}

DistributedGraph distributeAllReduce(Graph& graph, const TransformOptions& options) {
  const std::vector<GradientLink> links = graph.gradientLinks();
  Rewirer rewirer(graph, links);
  DistributedGraph result;
  const double denseScale = options.averageDense ? 1.0 / options.workers : 1.0;
  const double sparseScale = options.averageSparse ? 1.0 / options.workers : 1.0;

  std::vector<const GradientLink*> dense;
  for (const GradientLink& l : links) {
    if (std::find(options.served.begin(), options.served.end(), l.variable) != options.served.end()) continue;
    if (l.sparse && std::find(options.allReducedSparse.begin(), options.allReducedSparse.end(), l.variable) !=
                        options.allReducedSparse.end()) {
      if (!rewirer.consumed(l.indices) && !rewirer.consumed(l.values)) continue;
      auto [indices, values] = allReduceRows(l, options, sparseScale);
      rewirer.redirect({{l.indices, indices}, {l.values, values}});
      result.variables.push_back({l.variable, false, byteSize(l.variable->output()), -1});
    } else if (l.sparse) {
      if (!rewirer.consumed(l.indices) && !rewirer.consumed(l.values)) continue;
      auto [indices, values] =
          allGatherRows(l.indices, l.values, options.hostRing, options.workers, sparseScale, l.variable->name,
                        l.variable->output().shape()[0]);
      rewirer.redirect({{l.indices, indices}, {l.values, values}});
      result.variables.push_back({l.variable, true, byteSize(l.variable->output()), -1});
    } else if (rewirer.consumed(l.dense)) {
      dense.push_back(&l);
    }
  }
  // Buckets in the order the backward pass produces the gradients (the graph's topological
  // order), one per dtype and kind of device: a gradient on a GPU sums through the dense backend
  // there when it is the GPU workers' NCCL group, any other through the host's ring.
  std::map<const Node*, size_t> position;
  for (const Node* n : graph.topologicalOrder()) position.emplace(n, position.size());
  std::stable_sort(dense.begin(), dense.end(), [&](const GradientLink* a, const GradientLink* b) {
    return position.at(a->dense.node()) < position.at(b->dense.node());
  });
  using BucketKey = std::pair<DType, bool>;  // dtype, summed on the GPU
  std::map<BucketKey, std::vector<const GradientLink*>> open;
  std::map<BucketKey, size_t> openBytes;
  auto flush = [&](const BucketKey& key) {
    std::vector<const GradientLink*>& bucket = open[key];
    if (bucket.empty()) return;
    std::vector<Output> grads;
    for (const GradientLink* l : bucket) grads.push_back(l->dense);
    const auto& [dtype, onGpu] = key;
    const std::vector<Output> reduced =
        allReduce(grads, onGpu ? options.denseBackend : options.hostRing, denseScale, onGpu,
                  onGpu || dtype != DType::F32 ? dtype : options.wireDType);
    for (size_t i = 0; i < bucket.size(); ++i) {
      rewirer.redirect({{bucket[i]->dense, reduced[i]}});
      result.variables.push_back({bucket[i]->variable, false, byteSize(bucket[i]->dense), result.buckets});
    }
    ++result.buckets;
    bucket.clear();
    openBytes[key] = 0;
  };
  for (const GradientLink* l : dense) {
    const bool onGpu = options.denseOnGpu && l->dense.node()->device.rfind("cuda", 0) == 0;
    const BucketKey key{l->dense.dtype(), onGpu};
    open[key].push_back(l);
    openBytes[key] += byteSize(l->dense);
    if (openBytes[key] >= options.bucketBytes) flush(key);
  }
  for (auto& [key, bucket] : open) flush(key);
  return result;
}

namespace {

/// Points every reader of the served variable at the servers' value: lookups pull their rows,
/// anything else reads one pull of the whole variable. The update chain, the moving averages the
/// servers run and ops that write the variable are left alone.
void redirectReads(Graph& graph, const ServedVariable& v, int64_t client, int index) {
  const Output value = v.variable->output();
  Output pulled;
  const size_t existing = graph.size();  // the pull created below is not a reader to redirect
  for (size_t id = 0; id < existing; ++id) {
    Node* n = graph.node(static_cast<int>(id));
    if (std::find(v.chain.begin(), v.chain.end(), n) != v.chain.end()) continue;
    if (std::find(v.averages.begin(), v.averages.end(), n) != v.averages.end()) continue;
    for (size_t j = 0; j < n->inputs.size(); ++j) {
      if (n->inputs[j] != value) continue;
      const std::vector<int>& written = n->def->mutatedInputs;
      if (std::find(written.begin(), written.end(), static_cast<int>(j)) != written.end()) continue;
      if (n->op == "Gather" && j == 0) {
        turnIntoPull(n, client, index);
        break;
      }
      if (!pulled.valid()) pulled = pullVariable(value, client, index);
      graph.setInput(n, static_cast<int>(j), pulled);
    }
  }
}

}  // namespace

void distributeParameterServers(Graph& graph, const ServerPlan& plan, int64_t client) {
  for (size_t i = 0; i < plan.variables.size(); ++i) {
    const ServedVariable& v = plan.variables[i];
    const int index = static_cast<int>(i);
    redirectReads(graph, v, client, index);
    Node* push = v.squaredNorm;
    if (push != nullptr) {
      turnIntoPush(push, client, index);
    } else {
      push = pushGradient(v.sparse ? std::vector<Output>{v.gradient.indices, v.gradient.values}
                                   : std::vector<Output>{v.gradient.dense},
                          client, index);
    }
    Node* apply = applyRemote(graph, v.extras, client, index);
    graph.addControlInput(apply, push);
    graph.replaceControlInputs(v.update, apply);
    // The servers average the variable after their update: the worker's own average op drops
    // out, and what ran after it runs after the update and after what the average waited for.
    for (Node* average : v.averages) {
      std::vector<Node*> dependents;
      for (const auto& n : graph.nodes())
        if (std::find(n->controlInputs.begin(), n->controlInputs.end(), average) != n->controlInputs.end())
          dependents.push_back(n.get());
      graph.replaceControlInputs(average, apply);
      for (Node* n : dependents)
        for (Node* before : average->controlInputs) graph.addControlInput(n, before);
    }
  }
}

std::vector<GraphPass> dataParallelPasses(const TransformOptions& options, const ServerPlan& plan, int64_t client) {
  TransformOptions allReduced = options;
  for (const ServedVariable& v : plan.variables) allReduced.served.push_back(v.variable);
  std::vector<GraphPass> passes;
  passes.push_back(
      {"AllReduce", [allReduced](Graph& g, DistributedGraph& d) { d = distributeAllReduce(g, allReduced); }});
  if (!plan.empty()) {
    passes.push_back({"parameter servers", [&plan, client](Graph& g, DistributedGraph& d) {
                        distributeParameterServers(g, plan, client);
                        for (const ServedVariable& v : plan.variables)
                          d.variables.push_back(
                              {v.variable, v.sparse, static_cast<size_t>(v.rows()) * v.rowBytes(), -1, true});
                      }});
  }
  if (options.workers > 1 && options.synchronous) {
    passes.push_back({"batch normalisation", [ring = options.hostRing](Graph& g, DistributedGraph&) {
                        synchronizeBatchNorm(g, ring);
                      }});
  }
  return passes;
}

DistributedGraph applyPasses(Graph& graph, const std::vector<GraphPass>& passes) {
  DistributedGraph result;
  for (const GraphPass& pass : passes) {
    try {
      pass.run(graph, result);
      graph.verify();
    } catch (const std::exception& e) {
      WEFT_THROW("the {} pass: {}", pass.name, e.what());
    }
  }
  return result;
}

}  // namespace weft::dist
