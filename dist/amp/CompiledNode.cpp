#include "dist/amp/CompiledNode.h"

#include "core/Error.h"

#include "autodiff/Gradients.h"

#include <fmt/format.h>

#include <unordered_set>

namespace weft::amp {
namespace {

bool isBackward(const weft::Node* n, size_t forwardEnd) { return static_cast<size_t>(n->id) >= forwardEnd; }

std::vector<Output> keptValues(weft::Graph& g, size_t forwardEnd) {
  std::vector<Output> kept;
  std::unordered_set<Output, OutputHash> seen;
  for (const auto& n : g.nodes()) {
    if (!isBackward(n.get(), forwardEnd)) continue;
    for (const Output& in : n->inputs) {
      weft::Node* producer = in.node();
      if (isBackward(producer, forwardEnd) || producer->def->sourceKind != SourceKind::None) continue;
      if (seen.insert(in).second) kept.push_back(in);
    }
  }
  return kept;
}

}  // namespace

std::unique_ptr<Compiled> compileTransform(const amp::Node& node, const std::vector<TensorType>& inputs,
                                           optim::Optimizer* optimizer, bool needsGradients,
                                           const std::string& device) {
  auto c = std::make_unique<Compiled>();
  c->graph = std::make_unique<weft::Graph>();
  weft::Graph& g = *c->graph;
  const auto placed = g.onDevice(device);
  for (size_t i = 0; i < inputs.size(); ++i)
    c->payloads.push_back(g.placeholder(fmt::format("payload{}", i), inputs[i].dtype, inputs[i].shape));
  const auto& stateInputs = node.kind == NodeKind::Loss ? node.loss.stateInputs : node.transform.stateInputs;
  for (const StateInput& s : stateInputs) c->fromState.push_back(g.placeholder(s.name, s.type.dtype, s.type.shape));
  Inputs in{c->payloads, c->fromState};
  std::vector<Output> wrt;
  for (const Output& p : c->payloads)
    if (isFloating(p.dtype())) wrt.push_back(p);
  if (node.kind == NodeKind::Loss) {
    c->loss = node.loss.build(g, in);
    WEFT_CHECK(g.trainableVariables().empty(), "amp: loss '{}' has variables; put them in a transform before it",
               node.name);
    WEFT_CHECK(!wrt.empty(), "amp: loss '{}' gets a payload of dtype {}, which has no gradient", node.name,
               dtypeName(c->payloads[0].dtype()));
    c->lossGrad = toDense(gradients(c->loss.loss, {c->payloads[0]})[0]);
    WEFT_CHECK(c->lossGrad.valid(), "amp: loss '{}' does not depend on its payload", node.name);
  } else {
    c->y = node.transform.build(g, in);
    size_t forwardEnd = g.size();
    for (weft::Node* v : g.trainableVariables())
      c->params.push_back({v->name, v->output(), {}, {}, {}, {}, {}, {}, {}});
    if (needsGradients && isFloating(c->y.dtype())) {
      c->dy = g.placeholder("output_gradient", c->y.dtype(), c->y.shape());
      Output surrogate = sum(mul(c->y, c->dy));
      for (const Param& p : c->params) wrt.push_back(p.variable);
      std::vector<Grad> grads = gradients(surrogate, wrt);
      size_t k = 0;
      for (const Output& p : c->payloads) {
        if (!isFloating(p.dtype())) {
          c->inputGrads.emplace_back();
          continue;
        }
        const Grad& g = grads[k++];
        c->inputGrads.push_back(g.valid() ? toDense(g) : Output());
      }
      for (Param& p : c->params) p.grad = grads[k++];
      c->kept = keptValues(g, forwardEnd);
      std::vector<std::pair<Grad, Output>> updates;
      for (Param& p : c->params) {
        if (!p.grad.valid()) continue;
        const TensorType& t = p.variable.type();
        if (p.grad.isSparse()) {
          p.indicesPh = g.placeholder("sum/" + p.name + "/indices", p.grad.indices.dtype(), {-1});
          std::vector<int64_t> rowShape = t.shape.dims();
          rowShape[0] = -1;
          p.valuesPh = g.placeholder("sum/" + p.name + "/values", t.dtype, Shape(rowShape));
          updates.push_back({Grad::sparse(p.indicesPh, p.valuesPh, t.shape), p.variable});
        } else {
          p.densePh = g.placeholder("sum/" + p.name, t.dtype, t.shape);
          updates.push_back({Grad(p.densePh), p.variable});
        }
      }
      if (!updates.empty()) {
        WEFT_CHECK(optimizer != nullptr,
                   "amp: transform '{}' has variables but neither it nor the runtime names an optimizer", node.name);
        c->updateStep = optimizer->applyGradients(updates);
      }
    } else {
      c->inputGrads.assign(c->payloads.size(), Output());
    }
  }
  c->session = std::make_unique<Session>(g, SessionOptions{.threads = 1});
  return c;
}

}  // namespace weft::amp
