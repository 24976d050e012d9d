// Activation recomputation: the rewrite behind Graph::recompute scopes. gradients() calls it once
// the backward pass is built, so optimizers, the memory planner, fusions and the distribution
// pass all see the rewritten graph.
#pragma once

#include "core/Graph.h"

namespace weft {

/// Points the backward nodes (ids from `firstBackward` on) that read a value of a recompute scope
/// at a copy of the op that computed it. The copies are built from the values that flow into the
/// scope (and the scope's kept values, under Recompute::Selective), run after the gradient that
/// first reaches the scope (control inputs), and belong to the backward pass
/// (kBackwardCollection). A value that the forward pass of another segment reads is kept, not
/// recomputed: the other segment keeps it anyway. Returns how many ops were copied.
int recomputeInBackward(Graph& g, int firstBackward);

}  // namespace weft
