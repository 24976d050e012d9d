// A variable's first value, drawn from the initializer its attributes record (Graph::variable):
// a function of the graph seed and the variable's name only, made on the host.
#pragma once

#include "core/Graph.h"
#include "core/Tensor.h"

namespace weft {

/// Whether a sharded variable's (Graph::shardVariable) initial value is its whole or its shard.
enum class Whole { No, Yes };

/// The variable's initial value: of a shard, the elements of the whole value it holds (each
/// element is drawn from its index in the whole, so a shard costs only its own elements).
Tensor initialValue(const Graph& graph, const Node& variable, Whole whole = Whole::No);

}  // namespace weft
