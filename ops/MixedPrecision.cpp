// keepActivationsLow (see the header): one walk in topological order, remembering for each f32
// value the 16-bit value it was widened from.
#include "ops/MixedPrecision.h"

#include "core/Half.h"
#include "core/OpRegistry.h"
#include "ops/Ops.h"

#include <map>
#include <optional>
#include <set>
#include <vector>

namespace weft {
namespace {

class Lowering {
 public:
  explicit Lowering(Graph& g) : g_(g) {
    for (const GradientLink& link : g.gradientLinks()) {
      for (const Output& o : {link.dense, link.values})
        if (o.valid()) gradients_.insert(o);
    }
    for (const char* key : {kBackwardCollection, kLossScaledCollection}) {
      for (const Node* n : g.collection(key)) memberships_[n].push_back(key);
    }
  }

  LowPrecisionReport run() {
    for (Node* n : g_.topologicalOrder()) {
      if (n->op == "Cast") visitCast(n);
      else if (!n->def->halfInputs.empty()) lower(n);
    }
    return report_;
  }

 private:
  /// A widening cast records its 16-bit source; a narrowing cast of a value that exists in
  /// that 16-bit type hands its readers that value.
  void visitCast(Node* cast) {
    const Output from = cast->inputs[0], to = cast->output(0);
    if (isHalfPrecision(from.dtype()) && to.dtype() == f32) {
      low_[to] = from;
      return;
    }
    if (from.dtype() != f32 || !isHalfPrecision(to.dtype())) return;
    const auto it = low_.find(from);
    if (it == low_.end() || it->second.dtype() != to.dtype()) return;
    if (g_.replaceUses(to, it->second) > 0) ++report_.castsBypassed;
  }

  /// The indices of n's inputs that may be 16-bit.
  static std::vector<int> halfInputsOf(const Node* n) {
    std::vector<int> inputs;
    for (int i : n->def->halfInputs) {
      if (i != OpDef::kAllInputs) {
        inputs.push_back(i);
        continue;
      }
      for (int j = 0; j < static_cast<int>(n->inputs.size()); ++j) inputs.push_back(j);
    }
    return inputs;
  }

  /// The 16-bit values n's marked inputs were widened from, when all were, from one type.
  std::optional<std::vector<std::pair<int, Output>>> lowInputs(const Node* n) const {
    std::vector<std::pair<int, Output>> inputs;
    for (int i : halfInputsOf(n)) {
      const Output in = n->inputs[static_cast<size_t>(i)];
      const auto it = low_.find(in);
      if (in.dtype() != f32 || it == low_.end()) return std::nullopt;
      if (!inputs.empty() && it->second.dtype() != inputs.front().second.dtype()) return std::nullopt;
      inputs.emplace_back(i, it->second);
    }
    return inputs;
  }

  void lower(Node* n) {
    for (int o : n->def->halfOutputs) {
      if (n->outputs[static_cast<size_t>(o)].dtype != f32 || gradients_.count(n->output(o))) return;
    }
    const auto inputs = lowInputs(n);
    if (!inputs || inputs->empty()) return;
    // The casts back to f32 for n's other readers belong where n does.
    auto placed = g_.onDevice(n->device);
    auto staged = g_.stage(n->stage);
    g_.retype(n, *inputs, [&](Output half) {
      const Output wide = cast(half, f32);
      wide.node()->gradientOf = n->gradientOf;
      const auto it = memberships_.find(n);
      if (it != memberships_.end()) {
        for (const char* key : it->second) g_.addToCollection(key, wide.node());
      }
      low_[wide] = half;
      return wide;
    });
    ++report_.opsLowered;
  }

  Graph& g_;
  std::map<Output, Output> low_;  // f32 value -> the 16-bit value it widens
  std::set<Output> gradients_;
  std::map<const Node*, std::vector<const char*>> memberships_;  // the collections a pass reads
  LowPrecisionReport report_;
};

}  // namespace

LowPrecisionReport keepActivationsLow(Graph& g) { return Lowering(g).run(); }

}  // namespace weft
