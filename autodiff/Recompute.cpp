#include "autodiff/Recompute.h"

#include "core/OpRegistry.h"

#include <map>
#include <set>

namespace weft {
namespace {

/// Products, convolutions, recurrent layers and the softmax losses: the ops whose values
/// Recompute::Selective keeps, as they cost far more to compute again than to hold.
bool costly(const std::string& op) {
  static const std::set<std::string> ops = {"MatMul",
                                            "BatchMatMul",
                                            "Conv2D",
                                            "LSTM",
                                            "GRUCell",
                                            "SampledSoftmaxCrossEntropy",
                                            "SoftmaxCrossEntropy",
                                            "SparseSoftmaxCrossEntropy"};
  return ops.count(op) != 0;
}

class Recomputer {
 public:
  Recomputer(Graph& g, int firstBackward) : g_(g), firstBackward_(firstBackward) {
    // A value that a forward op of another segment reads stays alive for that op: keep it.
    for (int id = 0; id < firstBackward_; ++id) {
      const Node* reader = g_.node(id);
      for (const Output& in : reader->inputs) {
        if (in.node()->recomputeSegment != reader->recomputeSegment) readAcross_.insert(in.node());
      }
    }
  }

  /// Whether the backward reads a copy of `n` rather than its value from the forward pass.
  bool recomputed(const Node* n) const {
    if (n->id >= firstBackward_ || n->recompute == Recompute::None || readAcross_.count(n)) return false;
    const OpDef& def = *n->def;
    if (def.sourceKind != SourceKind::None || !def.mutatedInputs.empty() || def.launchesAsync || n->outputs.empty() ||
        n->condition.valid()) {
      return false;
    }
    return n->recompute == Recompute::Full || !costly(n->op);
  }

  /// The gradients that must exist before segment `segment` is recomputed: those read by the
  /// first backward node that reads one of its values (it waits for them anyway).
  void noteFirstReader(const Node* original, Node* reader) {
    const int segment = original->recomputeSegment;
    if (anchors_.count(segment)) return;
    std::vector<Node*>& anchors = anchors_[segment];
    for (const Output& in : reader->inputs) {
      if (in.node()->id >= firstBackward_) anchors.push_back(in.node());
    }
  }

  /// The copy of `original`, reading copies of the recomputed values of its own segment.
  Node* copyOf(Node* original) {
    if (auto it = copies_.find(original); it != copies_.end()) return it->second;
    std::vector<Output> inputs;
    for (const Output& in : original->inputs) {
      Node* source = in.node();
      const bool sameSegment = source->recomputeSegment == original->recomputeSegment;
      inputs.push_back(sameSegment && recomputed(source) ? copyOf(source)->output(in.index()) : in);
    }
    Attrs attrs = original->attrs;
    // A random op draws from a stream named after its node: the copy draws the original's.
    if (original->def->drawsRandom && !attrs.has("stream")) attrs.set("stream", original->name);
    auto staged = g_.stage(original->stage);
    auto placed = g_.onDevice(original->device);
    Node* copy = g_.addNode(original->op, std::move(inputs), std::move(attrs), original->name + "/recomputed");
    copy->gradientOf = original;
    copy->recomputed = true;
    for (Node* before : original->controlInputs) g_.addControlInput(copy, before);
    for (Node* before : anchors_[original->recomputeSegment]) g_.addControlInput(copy, before);
    g_.addToCollection(kBackwardCollection, copy);
    copies_[original] = copy;
    return copy;
  }

  int copies() const { return static_cast<int>(copies_.size()); }

 private:
  Graph& g_;
  const int firstBackward_;
  std::set<const Node*> readAcross_;
  std::map<int, std::vector<Node*>> anchors_;
  std::map<Node*, Node*> copies_;
};

}  // namespace

int recomputeInBackward(Graph& g, int firstBackward) {
  Recomputer recomputer(g, firstBackward);
  // Which backward node reads which recomputed value, in creation order: the backward pass is
  // built from the loss back, so a segment's first reader is where the backward reaches it.
  std::map<Output, std::vector<Node*>> readers;
  const int end = static_cast<int>(g.size());
  for (int id = firstBackward; id < end; ++id) {
    Node* reader = g.node(id);
    for (const Output& in : reader->inputs) {
      if (!recomputer.recomputed(in.node())) continue;
      recomputer.noteFirstReader(in.node(), reader);
      std::vector<Node*>& list = readers[in];
      if (list.empty() || list.back() != reader) list.push_back(reader);
    }
  }
  for (const auto& [value, consumers] : readers) {
    const Output copy = recomputer.copyOf(value.node())->output(value.index());
    g.replaceUses(value, copy, consumers);
  }
  return recomputer.copies();
}

}  // namespace weft
