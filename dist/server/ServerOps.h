// Graph ops through which a worker's replica uses the variables the parameter servers hold. Each
// finds its ServerClient by the "client" attribute and its variable by "variable" (the index in
// the client's plan).
//
//   PullRows(variable, ids) -> rows       an embedding lookup (Gather) served by the servers:
//                                         only the rows the ids name travel, once each
//   PullVariable(variable) -> value       the whole variable, for every other reader
//   PushGradient(dense) | PushGradient(indices, values) -> squared norm
//                                         sends this worker's gradient to the partitions; the
//                                         result is the aggregated gradient's squared norm (the
//                                         servers answer once every worker has pushed), which
//                                         takes the place of the squared-norm op of clipping
//   ApplyRemote(extras...)                worker 0 sends the update's other inputs (learning
//                                         rate, step, clipping scale); the servers apply
//
// The variable input of the pulls is the worker's local copy, which is read only once the
// worker has left the job (its client is gone): Runner::finish() fills it with the servers'
// final values, so evaluation after training needs no server.
#pragma once

#include "core/Graph.h"

#include <cstdint>
#include <vector>

namespace weft::dist {

/// Registers the server ops (idempotent).
void registerServerOps();

Output pullVariable(Output variable, int64_t client, int index);
Node* pushGradient(const std::vector<Output>& gradient, int64_t client, int index);
Node* applyRemote(Graph& graph, const std::vector<Output>& extras, int64_t client, int index);
/// Rewrites a Gather of a served variable into a PullRows (same inputs and output), in place.
void turnIntoPull(Node* gather, int64_t client, int index);
/// Rewrites the squared norm of a served variable's gradient (clipping) into its PushGradient.
void turnIntoPush(Node* squaredNorm, int64_t client, int index);

}  // namespace weft::dist
