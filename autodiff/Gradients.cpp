#include "autodiff/Gradients.h"

#include "autodiff/Recompute.h"
#include "ops/Ops.h"

#include <algorithm>
#include <map>
#include <set>

namespace weft {
namespace {

Output denseFromSparse(const Grad& g) {
  return unsortedSegmentSum(g.values, g.indices, g.denseShape[0]);
}

/// Sums a gradient's contributions; stays sparse only when all of them are sparse.
Grad aggregate(const std::vector<Grad>& parts, bool keepSparse) {
  bool allSparse = keepSparse;
  for (const Grad& p : parts) allSparse = allSparse && p.isSparse();
  if (allSparse) {
    if (parts.size() == 1) return parts[0];
    std::vector<Output> indices, values;
    for (const Grad& p : parts) {
      indices.push_back(cast(p.indices, i64));
      values.push_back(p.values);
    }
    return Grad::sparse(concat(indices, 0), concat(values, 0), parts[0].denseShape);
  }
  std::vector<Output> dense;
  for (const Grad& p : parts) dense.push_back(p.isSparse() ? denseFromSparse(p) : p.dense);
  return addN(dense);
}

}  // namespace

Output toDense(const Grad& g) {
  WEFT_CHECK(g.valid(), "toDense of an empty gradient");
  return g.isSparse() ? denseFromSparse(g) : g.dense;
}

std::vector<Grad> gradients(Output loss, const std::vector<Output>& xs) {
  registerAllOps();
  Graph& g = loss.graph();
  WEFT_CHECK(isFloating(loss.dtype()) && loss.shape().numel() == 1,
             "gradients: the loss {} must be a floating scalar, got {}", loss.name(), loss.type().str());
  // The graph's nodes up to the loss in topological order (taken before the backward nodes are
  // added); flags are indexed by node id.
  std::vector<Node*> order = g.topologicalOrder();
  order.resize(static_cast<size_t>(std::find(order.begin(), order.end(), loss.node()) - order.begin()) + 1);
  const size_t n = g.size();

  // Nodes on a path from some x to the loss.
  std::set<Output> targets(xs.begin(), xs.end());
  std::vector<char> fromX(n, 0), toLoss(n, 0);
  for (const Node* node : order) {
    char& reached = fromX[static_cast<size_t>(node->id)];
    for (size_t i = 0; i < node->outputs.size() && !reached; ++i) {
      reached = targets.count(Output(const_cast<Node*>(node), static_cast<int>(i))) != 0;
    }
    for (const Output& in : node->inputs) reached = reached || fromX[static_cast<size_t>(in.node()->id)];
  }
  toLoss[static_cast<size_t>(loss.node()->id)] = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (!toLoss[static_cast<size_t>((*it)->id)]) continue;
    for (const Output& in : (*it)->inputs) toLoss[static_cast<size_t>(in.node()->id)] = 1;
  }

  std::map<Output, std::vector<Grad>> contributions;
  contributions[loss].push_back(onesLike(loss));
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* node = *it;
    const auto id = static_cast<size_t>(node->id);
    if (!fromX[id] || !toLoss[id]) continue;
    bool anyInputFromX = false;
    for (const Output& in : node->inputs) anyInputFromX = anyInputFromX || fromX[static_cast<size_t>(in.node()->id)];
    if (!anyInputFromX) continue;

    // A gradient belongs to its forward op's pipeline stage, the sum of its outputs' gradients too.
    auto staged = g.stage(node->stage);
    const size_t firstOfNode = g.size();
    GradContext ctx{node, std::vector<Output>(node->outputs.size())};
    bool any = false;
    for (size_t i = 0; i < node->outputs.size(); ++i) {
      auto it = contributions.find(Output(node, static_cast<int>(i)));
      if (it == contributions.end()) continue;
      ctx.outputGrads[i] = aggregate(it->second, false).dense;
      any = true;
    }
    if (!any || node->def->noGrad) continue;
    WEFT_CHECK(static_cast<bool>(node->def->gradFn), "no gradient is defined for {}", node->describe());
    auto scope = g.scope("gradients/" + node->name);
    auto placed = g.onDevice(node->device);  // a gradient runs where its forward op does
    std::vector<Grad> inputGrads = node->def->gradFn(ctx);
    WEFT_CHECK(inputGrads.size() == node->inputs.size(), "gradient of {} returned {} grads for {} inputs",
               node->describe(), inputGrads.size(), node->inputs.size());
    for (size_t j = 0; j < inputGrads.size(); ++j) {
      const Output& in = node->inputs[j];
      const Grad& gr = inputGrads[j];
      if (!gr.valid() || !fromX[static_cast<size_t>(in.node()->id)] || !isFloating(in.dtype())) continue;
      const Shape& got = gr.isSparse() ? gr.denseShape : gr.dense.shape();
      WEFT_CHECK(got.compatibleWith(in.shape()), "gradient of {} for input {} has shape {}, the input {}",
                 node->describe(), j, got.str(), in.shape().str());
      contributions[in].push_back(gr);
    }
    for (size_t id = firstOfNode; id < g.size(); ++id) g.node(static_cast<int>(id))->gradientOf = node;
  }

  std::vector<Grad> result;
  auto unstaged = g.stage(-1);  // a variable's gradient sum: the cut places it with its readers
  for (const Output& x : xs) {
    auto it = contributions.find(x);
    if (it == contributions.end()) {
      result.emplace_back();
      continue;
    }
    const bool isVariable = x.node()->op == "Variable";
    Grad grad = aggregate(it->second, isVariable);
    if (isVariable) {
      GradientLink link;
      link.variable = x.node();
      link.sparse = grad.isSparse();
      link.dense = grad.dense;
      link.indices = grad.indices;
      link.values = grad.values;
      link.denseShape = grad.isSparse() ? grad.denseShape : x.shape();
      g.addGradientLink(link);
    }
    result.push_back(grad);
  }
  for (size_t id = n; id < g.size(); ++id) g.addToCollection(kBackwardCollection, g.node(static_cast<int>(id)));
  recomputeInBackward(g, static_cast<int>(n));
  return result;
}

}  // namespace weft
