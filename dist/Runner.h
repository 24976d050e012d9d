// The entry point of distributed training: get_runner() takes a single-device training graph and
// returns a Runner that trains it across the job's workers, with no change to the model code
// beyond sharding its input (each worker feeds its own part of the total batch).
//
//     auto runner = weft::dist::get_runner(g, weft::dist::ResourceSpec::load("cluster.json"), cfg);
//     if (runner.served()) return runner.serverStatus();   // this process was a parameter server
//     for (...) runner.run({loss}, feedsFor(myShard), {step});
//
// A process learns its place in the job from the launcher's environment (dist/launch/Job.h); without
// it, and with a one-worker specification, the runner trains locally. get_runner is three steps
// that other runtimes reuse: joinJob (dist/launch/Job.h), serveJob in a server (dist/server/ServerProcess.h),
// and makeWorker, which builds a worker's replica with an explicit list of graph passes
// (dataParallelPasses, dist/Transform.h). With Config::pipeline.stages > 1 each worker runs one
// stage of a pipeline (dist/pipeline/PipelineStage.h) instead.
#pragma once

#include "core/Checkpoint.h"
#include "core/Session.h"
#include "dist/Config.h"
#include "dist/launch/Job.h"
#include "dist/Placement.h"
#include "dist/launch/ResourceSpec.h"
#include "dist/transport/Traffic.h"
#include "dist/Transform.h"

#include <functional>
#include <memory>
#include <optional>
#include <utility>

namespace weft::dist {

/// Whether a worker leaving the job (Runner::finish) copies the servers' final values of the
/// variables they hold into its session: a worker that reads no variable after its last step
/// leaves them, sparing the memory and the transfer of the whole served model.
enum class ServedValues { Pull, Leave };

/// Runs one worker's replica of the distributed graph.
class Runner {
 public:
  Runner(Runner&&) noexcept;
  Runner& operator=(Runner&&) noexcept;
  /// Waits for the other workers to finish their last step, then leaves the job.
  ~Runner();

  /// Session::run on this worker's replica: collectives inside the step synchronise it with the
  /// other workers, so every worker must run the same fetches and targets, step by step.
  std::vector<Tensor> run(const std::vector<Output>& fetches, const FeedMap& feeds = {},
                          const std::vector<Node*>& targets = {});
  void run(Node* target, const FeedMap& feeds = {}) { run({}, feeds, {target}); }
  /// A pipelined training step on `microbatches`, as many as Config::pipeline.microbatches,
  /// whose mean gradient is the step's (a model whose loss divides by the whole batch's count
  /// cuts its batch so: ZooModel::shard). run() cuts its feeds along their first axis instead.
  /// Returns each fetch's mean over the micro-batches. Without a pipeline: run() on the one
  /// micro-batch.
  std::vector<Tensor> runMicrobatches(const std::vector<Output>& fetches, const std::vector<FeedMap>& microbatches,
                                      const std::vector<Node*>& targets);

  /// The mean of `value` over the workers (every worker must call it at the same point), e.g.
  /// the total batch's loss from each worker's part. It waits for the slowest worker, so under
  /// the asynchronous modes it bounds how far apart the workers get.
  double meanOverWorkers(double value);
  /// Worker 0's `values` on every worker (every worker must call it at the same point, with as
  /// many values): what worker 0 alone read, such as the position of the checkpoint it resumes.
  std::vector<int64_t> fromWorker0(std::vector<int64_t> values);

  /// Runs `work` (its evaluation, say) on worker 0 alone while every other worker waits for it,
  /// however long it takes (bounded by no --timeout: a worker 0 that dies fails the wait, one that
  /// freezes is stopped by the launcher's heartbeat watch). Every worker calls it at the same
  /// point. Under the asynchronous modes the others go on at once.
  void runOnWorker0(const std::function<void()>& work);

  /// Leaves the job: waits until every worker has finished its last step, copies the servers'
  /// final values of the variables they hold into this worker's session (unless `values` is
  /// Leave, or the session holds them already), then says goodbye to the servers. Later runs are
  /// local to this worker (collectives fail; lookups of served variables read the local copy).
  /// Called by the destructor when not called before.
  void finish(ServedValues values = ServedValues::Pull);

  /// Makes worker 0's session hold the whole model's current values, to evaluate or save it:
  /// gathers a pipeline's other stages' variables into it, and pulls the servers' variables.
  /// Every worker calls it at the same point; the other workers' sessions stay as they are.
  void gatherModel();
  /// The whole values of the variables the workers keep shards of (Config::sharding), for
  /// saveCheckpoint, on worker 0 (empty elsewhere, and without sharding). Every worker calls it
  /// at the same point; each whole passes through every worker, one variable at a time.
  WholeValues gatherShards();
  /// Copies the servers' current values of the variables they hold, with their optimizer slots,
  /// into this worker's session (before saving a checkpoint). Nothing to do without servers.
  void pullVariables();
  /// Makes worker 0's values of the variables and their slots the job's (after worker 0 alone
  /// restored a checkpoint): the servers' values of those they hold, every worker's of the
  /// others, or a pipeline's stage 0's values every stage's. The variables workers keep shards
  /// of take their shard of `wholes`, worker 0's whole values of them (restoreCheckpoint's; on
  /// the other workers, anything). Every worker must call it at the same point.
  void publishVariables(const WholeValues& wholes = {});

  /// Whether this process was one of the job's servers: get_runner served until the workers
  /// left, and serverStatus() is the exit status the program should end with (0, or 1 after an
  /// error, which was printed). Such a runner has no session; run() throws.
  bool served() const;
  int serverStatus() const;

  /// This worker's rank (0 .. workers() - 1) and the number of workers.
  int rank() const;
  int workers() const;
  /// The pipeline's stage count (1 without a pipeline): a pipeline's workers each run one stage
  /// on the whole batch, rather than the whole model on a part of it.
  int stages() const;
  /// Data-parallel replicas of the model (or of the pipeline: workers() / stages()), and this
  /// worker's: each replica trains on its part of the total batch.
  int replicas() const;
  int replica() const;
  /// Whether the workers step together (false under the asynchronous modes, ASP, SSP and DSSP).
  bool synchronous() const;
  /// What the automatic pipeline cut measured and chose, or what each of the author's stages
  /// holds (after the first step, on worker 0; "" without a pipeline).
  std::string pipelinePlan() const;
  /// This pipeline stage's idle fraction of its steps so far (PipelineStage::idleFraction); 0
  /// without a pipeline.
  double pipelineIdleFraction() const;
  /// This pipeline stage's peak bytes kept for later runs (PipelineStage::peakKeptBytes).
  size_t pipelinePeakKeptBytes() const;
  /// This pipeline stage's updates made on a guess so far and those of them redone
  /// (post-validation, PipelineStage::updatesGuessed).
  std::pair<size_t, size_t> pipelineGuesses() const;
  Session& session();
  /// What the distribution pass did.
  const DistributedGraph& distribution() const;
  /// Under Config::sharding, what this worker holds of its sharded variables, measured on its
  /// session's tensors: "sharded optimizer state (1/N each): this worker holds A of B bytes of its
  /// K sharded variables; its variables take C bytes, D unsharded" (those its session has made,
  /// and its shards; "parameters and optimizer state" under Sharding::Parameters); "" without.
  std::string shardingReport();
  /// Whether the workers hold shards of the parameters (Sharding::Parameters in a job the
  /// launcher started, even of one worker): a run that reads them outside the training step (an
  /// evaluation) gathers them, so every worker must take part in it, before the job ends.
  bool shardsParameters() const;
  /// Which variables the parameter servers hold, in which partitions (empty without servers).
  const ServerPlan& serverPlan() const;
  /// Under Auto with Config::sparsity: how each measured sparse variable is synchronised, and why.
  const std::vector<SparsityChoice>& sparsityChoices() const;
  /// Bytes this worker sent and received, per kind, since it started.
  Traffic traffic() const;

  /// Under a cluster engine (get_runner(graph, config)), SIGTERM is the engine's request to stop
  /// (preemption, requeue, eviction). A worker ends on it at once, as by default, unless its
  /// program said, by this call, that it stops at a step of its own and checkpoints
  /// (dist::TrainingLoop does); from then on it is stopRequested(). Returns false where no
  /// engine started the job (nothing is caught). A server serves on until its workers stopped,
  /// then serverStatus() is kExitPreempted. In an elastic job (`weft launch --min-workers`)
  /// stopRequested() is also the launcher's request for a checkpoint (dist/launch/Preemption.h):
  /// a program of its own that honours it checkpoints and exits with kExitPreempted, which the
  /// launcher takes as the job stopping to be resized (0 would say the job finished).
  bool handleStopRequests();
  bool stopRequested() const;

 private:
  struct State;
  explicit Runner(std::unique_ptr<State> state);
  friend Runner makeWorker(JobContext, Graph&, const Config&);
  friend Runner get_runner(Graph&, const ResourceSpec&, const Config&);
  friend Runner get_runner(Graph&, const Config&);
  std::unique_ptr<State> state_;
};

/// This worker's replica of `graph` in the job it joined: rewrites the graph with
/// dataParallelPasses, makes its ring (or NCCL group), its client of the servers and its
/// session, and starts every worker from worker 0's variables.
Runner makeWorker(JobContext job, Graph& graph, const Config& config);

/// Distributes `graph` over the job's workers and returns this worker's runner; in a server
/// process it serves until the workers leave and returns a runner that says so (served()).
/// Throws when the job cannot be joined (no launcher environment for a multi-worker
/// specification, refused, timed out) or the graph cannot be distributed.
Runner get_runner(Graph& graph, const ResourceSpec& resources, const Config& config = {});
/// get_runner on the specification of the job `weft launch` started this process in
/// (ResourceSpec::fromEnvironment), or of the job a cluster engine started it in (srun, mpirun,
/// torchrun, a Kubernetes Job: dist/launch/EngineJob.h, with config.engine); a process started on its
/// own is a job of one worker, which trains locally. The same program thus runs alone, as every
/// process of a launched job, or under an engine.
/// What `weft launch` sets in the environment overrides config (withLaunchSettings: --arch,
/// --sync, --stages, --microbatches, --partitions).
Runner get_runner(Graph& graph, const Config& config = {});

}  // namespace weft::dist
