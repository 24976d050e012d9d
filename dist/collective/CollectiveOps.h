// Graph ops that run a worker's collectives. Each collective is a pair: a Start op (launches
// asynchronously, so the executor runs it as soon as its inputs exist and the transfer overlaps
// the rest of the step) that hands its inputs to the backend and outputs a ticket, and a Wait op
// that waits for the ticket's result and outputs it.
//
//   AllReduceStart(x_1..x_k) -> ticket      AllReduceWait(ticket, x_1..x_k) -> scale * sum_ranks x_i
//   AllGatherStart(indices, values) -> ticket
//   AllGatherWait(ticket, indices, values) -> (every rank's indices, scale * every rank's values)
//   ReduceScatterStart(g_1..g_k) -> ticket
//   ReduceScatterWait(ticket) -> this rank's shard of scale * sum_ranks g_i, each a vector (the
//                                g_i's sizes and dtype in attributes: the start packed them)
//   ShardGatherStart(v_1..v_k) -> ticket     (this rank's shard of each variable)
//   ShardGatherWait(ticket, v_1..v_k) -> v_1..v_k with every rank's shard of each (assigned to them)
//   GatherWholeStart(s) -> ticket, whole     (s: this rank's shard of a tensor of "whole_shape";
//                                             the ring fills `whole` in the background)
//   GatherWholeWait(ticket, whole) -> whole, once every rank's shard is in it (in place)
//
// The last three pairs are ZeRO's (dist/Transform.h): rank r's shard of a tensor of n elements is
// its flattened elements [n r / N, n (r + 1) / N) (shardOf). They run on the host's ring, named by
// "communicator", and are built for one rank ("rank", "world_size"), whose shard shapes they infer.
//
// Attributes: "backend" (AllReduce: CollectiveBackend::id(), the ring or the NCCL group),
// "communicator" (AllGather: the host ring's id), "scale" (Wait ops), "world_size" (AllGather).
//
// An AllReduce of GPU tensors runs on their GPU through the job's NCCL group (dist/collective/Nccl.h); its
// ticket is then only a place in the GPU's memory that pairs Start and Wait, and neither op
// blocks the host.
#pragma once

#include "core/Graph.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace weft::dist {

/// Registers the collective ops (idempotent).
void registerCollectiveOps();

/// Sums tensors of one dtype over every rank, times `scale`; one fused transfer for all of them.
/// Through collective backend `backend`: the host's ring, or with `onGpu` the NCCL group, on the
/// GPU the tensors live on. With `wire` bf16 or f16 (f32 tensors on the host's ring), the sums
/// travel between ranks in 16 bits and accumulate in f32 (Ring::allReduceSum); without it, in
/// the tensors' own dtype.
std::vector<Output> allReduce(const std::vector<Output>& xs, int64_t backend, double scale, bool onGpu = false,
                              std::optional<DType> wire = std::nullopt);
/// Concatenates every rank's sparse rows in rank order (every rank must have as many), values
/// times `scale`. The rows are the gradient of `variable`, of `variableRows` rows: each step's
/// rows are counted in the communicator's traffic.
std::pair<Output, Output> allGatherRows(Output indices, Output values, int64_t communicator, int worldSize,
                                        double scale, const std::string& variable, int64_t variableRows);

/// Rank `rank`'s shard of `numel` elements among `ranks` ranks.
struct ShardRange {
  int64_t offset = 0;
  int64_t count = 0;
};
ShardRange shardOf(int64_t numel, int rank, int ranks);

/// This rank's shard of the sum of each of `xs` (one dtype) over the ranks, times `scale`: one
/// reduce-scatter for all of them on the host's ring `communicator`.
std::vector<Output> reduceScatter(const std::vector<Output>& xs, int64_t communicator, int rank, int ranks,
                                  double scale);
/// Fills in every other rank's shard of `variables` (each rank updated its own) once `after` ran:
/// one all-gather on the host's ring, whose values are assigned to them. Returns the assigns.
std::vector<Node*> gatherShards(const std::vector<Output>& variables, const std::vector<Node*>& after,
                                int64_t communicator, int rank, int ranks);

/// The whole value of a tensor of shape `whole` from `shard`, this rank's shard of it, with
/// every other rank's (ZeRO stage 3's gather of a sharded parameter before its readers): one
/// all-gather on the host's ring, launched once `after` ran (when given). Its result is a value
/// of the step, so the memory planner frees it after its last reader.
Output gatherWhole(Output shard, const Shape& whole, Node* after, int64_t communicator, int rank, int ranks);
/// Sparse rows from dense `rows` [R, ...] and a count per row [R]: ids (`indexDType`, R of
/// them) and values like `rows`, where row r with a non-zero count is (r, rows[r]) and every
/// other row is (the first counted row, zeros). A sparse update summing rows by id therefore
/// touches exactly the counted rows, each with its value. Throws when no row is counted.
std::pair<Output, Output> touchedRows(Output rows, Output counts, DType indexDType);

}  // namespace weft::dist
