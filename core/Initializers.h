// A variable's first value, drawn from the initializer its attributes record (Graph::variable):
// a function of the graph seed and the variable's name only, made on the host.
#pragma once

#include "core/Graph.h"
#include "core/Tensor.h"

namespace weft {

Tensor initialValue(const Graph& graph, const Node& variable);

}  // namespace weft
