// Graph ops that run collectives on a worker's Communicator. Each collective is a pair: a Start
// op (launches asynchronously, so the executor runs it as soon as its inputs exist and the
// transfer overlaps the rest of the step) that hands a copy of its inputs to the communication
// thread and outputs a ticket, and a Wait op that blocks on the ticket and outputs the result.
//
//   AllReduceStart(x_1..x_k) -> ticket      AllReduceWait(ticket, x_1..x_k) -> scale * sum_ranks x_i
//   AllGatherStart(indices, values) -> ticket
//   AllGatherWait(ticket, indices, values) -> (every rank's indices, scale * every rank's values)
//
// Attributes: "communicator" (Communicator::id()), "scale" (Wait ops), "world_size" (AllGather).
//
// An AllReduce of GPU tensors runs on their GPU through the job's NCCL group (dist/Nccl.h) in
// builds with NCCL; its ticket is then only a place in the GPU's memory that pairs Start and
// Wait, and neither op blocks the host.
#pragma once

#include "core/Graph.h"

#include <cstdint>
#include <vector>

namespace weft::dist {

/// Registers the collective ops (idempotent).
void registerCollectiveOps();

/// Sums tensors of one dtype over every rank, times `scale`; one fused transfer for all of them.
/// On the host's ring, or with `onGpu` on the GPU the tensors live on, through the job's NCCL group.
std::vector<Output> allReduce(const std::vector<Output>& xs, int64_t communicator, double scale, bool onGpu = false);
/// Concatenates every rank's sparse rows in rank order (every rank must have as many), values
/// times `scale`. The rows are the gradient of `variable`, of `variableRows` rows: each step's
/// rows are counted in the communicator's traffic.
std::pair<Output, Output> allGatherRows(Output indices, Output values, int64_t communicator, int worldSize,
                                        double scale, const std::string& variable, int64_t variableRows);

}  // namespace weft::dist
