// Reverse-mode autodiff: builds the backward graph inside the forward graph and records, for
// every variable it differentiates, a GradientLink (dense, or sparse indices + values).
#pragma once

#include "core/OpRegistry.h"

#include <vector>

namespace weft {

/// Gradients of the scalar `loss` with respect to each of `xs` (variables or any outputs). A
/// gradient that reaches an x only through gathers stays sparse; an x that the loss does not
/// depend on gets an invalid Grad. Variables among xs get a GradientLink in the graph. Values of
/// recompute scopes (Graph::recompute) are recomputed for the backward pass (autodiff/Recompute.h).
///
///     auto grads = gradients(loss, {w, embedding});
///     // grads[1].isSparse(): indices and values of the embedding rows touched
std::vector<Grad> gradients(Output loss, const std::vector<Output>& xs);

/// The dense tensor a gradient stands for (sparse rows summed into zeros).
Output toDense(const Grad& g);

}  // namespace weft
