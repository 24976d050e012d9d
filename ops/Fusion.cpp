// fuseBatchNormRelu (see the header).
#include "ops/Fusion.h"

#include <vector>

namespace weft {
namespace {

/// The nodes that read `value` (a node reading it twice counts once).
std::vector<Node*> readersOf(const Graph& g, const Output& value) {
  std::vector<Node*> readers;
  for (const auto& n : g.nodes()) {
    for (const Output& in : n->inputs) {
      if (in != value) continue;
      readers.push_back(n.get());
      break;
    }
  }
  return readers;
}

/// Whether a node's results are read: by another node, or as effects (a node without outputs).
/// One that is not (a cast back to f32 that the mixed-precision rewrite left unread) runs only
/// when fetched, and then still finds the unfused op's value.
bool read(const Graph& g, const Node* n) {
  if (n->outputs.empty()) return true;
  for (const auto& other : g.nodes()) {
    for (const Output& in : other->inputs)
      if (in.node() == n) return true;
  }
  return false;
}

/// The one reader of `value` that runs `op`, when every other reader is itself unread; else
/// nullptr.
Node* onlyReader(const Graph& g, const Output& value, const char* op) {
  Node* found = nullptr;
  for (Node* n : readersOf(g, value)) {
    if (n->op != op) {
      if (read(g, n)) return nullptr;
    } else if (found) {
      return nullptr;
    } else {
      found = n;
    }
  }
  return found;
}

/// The gradient op `grad` of a batch norm fused into `fused` becomes BatchNormReluGrad, reading
/// the gradient that reached the ReLU, when only that ReLU's gradient feeds it.
bool fuseGradient(Graph& g, Node* grad, Node* fused) {
  Node* reluGrad = grad->inputs[0].node();
  if (reluGrad->op != "ReluGrad" || reluGrad->inputs[1] != fused->output(0) || reluGrad->stage != grad->stage ||
      !onlyReader(g, reluGrad->output(0), "BatchNormGrad")) {
    return false;
  }
  // BatchNormReluGrad: dy, x, gamma, mean, invstd, the ReLU's output[, dmean, dvar].
  std::vector<Output> inputs{reluGrad->inputs[0], grad->inputs[1], grad->inputs[2], grad->inputs[3], grad->inputs[4],
                             fused->output(0)};
  inputs.insert(inputs.end(), grad->inputs.begin() + 5, grad->inputs.end());
  g.rebuild(grad, "BatchNormReluGrad", std::move(inputs), grad->attrs);
  grad->gradientOf = fused;  // the gradient of the fused op now: a pipeline cut puts it in that op's stage
  return true;
}

}  // namespace

int fuseBatchNormRelu(Graph& g) {
  int fused = 0;
  for (Node* bn : g.topologicalOrder()) {
    if (bn->op != "BatchNormTrain") continue;
    Node* relu = onlyReader(g, bn->output(0), "Relu");
    if (!relu || relu->stage != bn->stage || relu->device != bn->device) continue;
    g.rebuild(relu, "BatchNormReluTrain", bn->inputs, bn->attrs);
    for (int i = 1; i < 4; ++i) g.replaceUses(bn->output(i), relu->output(i));
    for (Node* reader : readersOf(g, relu->output(3))) {  // invstd: read by the gradient op
      if (reader->op == "BatchNormGrad") fuseGradient(g, reader, relu);
    }
    ++fused;
  }
  return fused;
}

}  // namespace weft
