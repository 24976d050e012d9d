// The distribution pass: turns a single-device training graph into one worker's replica of the
// distributed graph. It reads the gradient <-> variable links autodiff recorded, classifies every
// variable by its gradient (dense, or sparse rows), and puts a collective between each gradient
// and everything that consumes it after the backward pass (the update ops, global-norm clipping,
// moving averages): what those ops see is then the gradient of the total batch, so the replica
// computes the same function as single-device training with every worker's batch together.
//
// Dense gradients are fused into buckets of about `bucketBytes` in the order the backward pass
// produces them, each bucket one asynchronous AllReduce (the host's ring, or NCCL for gradients
// on the GPU workers' GPUs) that overlaps the rest of the backward pass. Sparse gradients are
// gathered from every worker (AllGather, Horovod's way).
#pragma once

#include "core/Graph.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace weft::dist {

struct TransformOptions {
  int64_t hostRing = 0;      ///< the host's ring (Communicator::id()): AllGather, batch-norm moments
  /// The GPU workers' NCCL group when `denseOnGpu`: dense gradients on a GPU are summed there
  /// through it; every other dense gradient is summed over the host ring.
  int64_t denseBackend = 0;
  bool denseOnGpu = false;
  int workers = 1;
  bool averageDense = true;   ///< divide summed dense gradients by the worker count
  bool averageSparse = true;  ///< likewise for sparse rows
  size_t bucketBytes = size_t{4} << 20;
  /// How dense f32 gradient buckets summed over the host ring travel: f32, or bf16 / f16 (summed
  /// in f32). Batch-norm moments and sparse sums always travel in full.
  DType wireDType = DType::F32;
  /// False under the asynchronous modes: batch normalisation keeps each worker's own batch
  /// statistics, since their AllReduce would hold every worker to the same step.
  bool synchronous = true;
  /// Variables the parameter servers hold: the AllReduce pass leaves their gradients alone
  /// (dataParallelPasses adds its plan's).
  std::vector<const Node*> served;
  /// Sparse variables whose gradients a dense AllReduce sums (chooseBySparsity picked it over
  /// the servers); other sparse gradients are gathered by AllGather.
  std::vector<const Node*> allReducedSparse;
  /// ZeRO's sharded optimizer state (Config::sharding): this worker keeps its shard of every
  /// dense variable's optimizer slots, and of its gradient (see shardOptimizerState).
  bool shardOptimizer = false;
  /// With shardOptimizer, ZeRO stage 3: each worker holds only its shard of those variables
  /// too, and their readers read a whole gathered just before them (see distributeAllReduce).
  bool shardParameters = false;
  int rank = 0;  ///< this worker's rank on the host ring, whose shard it keeps
  /// Groups whose gradients never share a bucket or a sum of checks, by variable (the pipeline
  /// stage that updates it, in shardOverReplicas); every variable is in group 0 when absent.
  std::map<const Node*, int> shardGroups;
};

/// One synchronised variable.
struct SyncedVariable {
  Node* variable = nullptr;
  bool sparse = false;
  size_t bytes = 0;
  int bucket = -1;  ///< dense: the AllReduce (or reduce-scatter) bucket it travels in
  bool onServers = false;  ///< held and updated by the parameter servers
  bool sharded = false;    ///< its gradient reduce-scattered, its slots sharded (ZeRO)
};

/// What the pass did, for reports and tests.
struct DistributedGraph {
  std::vector<SyncedVariable> variables;
  int buckets = 0;
};

/// Inserts the collectives into `graph` (in place). Gradients whose links have no consumer
/// outside the backward pass are left alone.
///
/// With `shardOptimizer` (ZeRO stages 1 and 2), every dense variable an update op writes is
/// sharded instead (throwing, naming it, where its gradient is read by more than its update,
/// clipping and loss scaling's check, or on the way by anything but element-wise ops with
/// scalars): its bucket is reduce-scattered, so the worker receives
/// its shard of the summed gradient alone (the full one never exists after the bucket is sent);
/// its optimizer slots hold that shard of themselves (Graph::shardVariable); clipping's squared
/// norm is the sum over workers of the shards' norms, and loss scaling's AllFinite passes only
/// where every worker's check of its shards did (one AllReduce of them all); the update
/// writes the worker's shard of the variable ("shard_offset"), and an all-gather per bucket
/// fills in the other workers' shards before the step ends. Every worker keeps the whole
/// variable for its forward and backward passes. Rank r's shard of n elements is elements
/// [n r / N, n (r + 1) / N) of the flattened tensor (shardOf).
///
/// With `shardParameters` as well (ZeRO stage 3, FSDP), those variables hold their shard alone
/// and the update writes it whole, with no all-gather after it. Their readers read a whole
/// gathered for them (gatherWhole): one gather per variable for the forward's readers, another
/// for the backward's (autodiff's ops and what reads their values), and one for readers outside
/// the training step, such as an evaluation (which every worker must run, the gather being a
/// collective). Each gather is a value of the step, freed after its last reader; within each of
/// the three, a variable's gather starts when the first reader of the variable gathered before
/// it runs, overlapping that layer's compute. A reader that writes the variable is refused.
DistributedGraph distributeAllReduce(Graph& graph, const TransformOptions& options);

/// ZeRO stage 1 and 2 among the data-parallel replicas of a pipeline stage, whose other
/// gradients their runtime averages: shards, as distributeAllReduce does with `shardOptimizer`,
/// every dense variable of `options.shardGroups` (each its stage's), over the ring `hostRing` of
/// `workers` replicas, this one rank `rank`, averaging. Buckets and the checks' sums never mix
/// groups, so each stays within its stage. Other gradients are left alone. `links` are the
/// graph's gradient links as the step computes them (a pipeline may have moved some).
DistributedGraph shardOverReplicas(Graph& graph, const std::vector<GradientLink>& links,
                                   const TransformOptions& options);

struct ServerPlan;
/// Rewrites the worker's replica for the variables of `plan`, which the servers hold and update:
/// embedding lookups of a served variable become PullRows, its other readers read one
/// PullVariable, its gradient is pushed (the push answering clipping's squared norm when the
/// gradient is clipped), and its optimizer update becomes an ApplyRemote of the update's other
/// inputs. `client` is the ServerClient the ops use.
void distributeParameterServers(Graph& graph, const ServerPlan& plan, int64_t client);

/// Makes batch normalisation use the statistics of the total batch: every BatchNormTrain becomes
/// per-worker moments, an AllReduce of them and BatchNormFromMoments; every BatchNormGrad becomes
/// gradient moments, an AllReduce and BatchNormGradFromMoments (whose gamma and beta gradients
/// are the worker's part, for the gradient AllReduce to add). Runs after the other passes: it
/// redirects every reader of the replaced outputs, the collectives those passes added included.
/// Returns how many batch norms it synchronised.
int synchronizeBatchNorm(Graph& graph, int64_t hostRing);

/// One graph-to-graph pass of a replica: its name (for errors) and the rewrite, which records
/// what it did in the DistributedGraph.
struct GraphPass {
  std::string name;
  std::function<void(Graph&, DistributedGraph&)> run;
};

/// The passes that turn a single-device training graph into one data-parallel worker's
/// replica, in the order they must run: the AllReduce of dense gradients (and AllGather of sparse
/// ones the servers do not hold), the servers' reads, pushes and updates (with servers, `client`
/// being the ServerClient's id), then batch normalisation over the total batch, which redirects
/// the readers the earlier passes added too. `plan` must outlive the passes.
std::vector<GraphPass> dataParallelPasses(const TransformOptions& options, const ServerPlan& plan, int64_t client);

/// Runs `passes` on `graph` in order, verifying the graph after each (Graph::verify); an error
/// names the pass that failed or left the graph malformed.
DistributedGraph applyPasses(Graph& graph, const std::vector<GraphPass>& passes);

}  // namespace weft::dist
