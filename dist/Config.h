// How a job distributes a model: the architecture that synchronises its variables, and the
// settings of the runtime (dist::get_runner takes a Config).
#pragma once

#include "core/Session.h"
#include "dist/launch/EngineJob.h"
#include "dist/pipeline/Schedule.h"
#include "dist/Sparsity.h"
#include "dist/server/SyncPolicy.h"

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <string>

namespace weft::dist {

/// How variables are synchronised.
enum class Architecture {
  Auto,             ///< AllReduce for dense variables, parameter servers for sparse ones (Parallax)
  AllReduce,        ///< AllReduce for dense, AllGather for sparse (Horovod)
  ParameterServer,  ///< every variable on the servers
};
/// "auto", "ar", "ps".
const char* architectureName(Architecture a);
/// Parses "auto", "ar", "ps" (the --arch flag); throws naming the value otherwise.
Architecture parseArchitecture(const std::string& name);
/// The environment variable through which `weft launch --arch` chooses the architecture of a
/// program that calls get_runner(graph, config).
inline constexpr char kArchitectureVariable[] = "WEFT_ARCH";

/// What data-parallel workers shard of their dense training state (ZeRO, dist/Transform.h).
enum class Sharding {
  None,       ///< every worker holds everything
  Optimizer,  ///< each worker holds 1/N of each dense variable's optimizer slots and summed gradient
  Parameters,  ///< and 1/N of the variable itself, gathered whole for its readers (ZeRO-3, FSDP)
};
/// "none", "optimizer", "parameters".
const char* shardingName(Sharding s);
/// Parses "none", "optimizer", "parameters" (the --shard flag); throws naming the value
/// otherwise, and saying that "gradients" is what "optimizer" does already.
Sharding parseSharding(const std::string& name);

/// Pipelined model parallelism (dist/pipeline/PipelineStage.h): with more than one stage, each worker of
/// the job runs one stage of the model.
struct PipelineConfig {
  int stages = 1;
  int microbatches = 1;  ///< each step's batch is cut into this many along its first axis
  StepSchedule schedule = PipelineSchedule::OneFOneB;
  /// The link speed the automatic cut (without Graph::stage scopes) weighs boundary transfers by.
  double linkBytesPerSecond = 1.25e9;
  /// The most bytes a stage may hold (StageMemory::total): the automatic cut keeps within it,
  /// and the author's stage scopes are checked against it; 0: no limit.
  double memoryPerStage = 0;
  /// Stages update at once on the last steps' clip scale and redo the rare step where it changed
  /// (PipelineOptions::postValidation), holding a copy of their updated state meanwhile.
  bool postValidation = true;
};

/// How the sparse variables on the parameter servers are split into row partitions (the
/// sparsity-aware Parallax paper, section 3.2): a variable's partitions are updated in parallel,
/// and spread over the servers by bytes, so their number is independent of the servers'.
struct Partitioning {
  /// A sparse variable outside every partitioner scope (Graph::partitioner) is split when it
  /// takes at least this many bytes; smaller ones stay whole.
  size_t bytes = size_t{1} << 20;
  /// The partitions of a split variable, and of the variables of a partitioner scope that leaves
  /// the count to the job; 0: one per server. At most the variable's rows.
  int count = 0;
};

struct Config {
  Architecture architecture = Architecture::Auto;
  /// How a job started by a cluster engine (srun, mpirun, torchrun, Kubernetes) forms: servers
  /// per host, the secret's file (dist/launch/EngineJob.h). get_runner(graph, config) reads the engine.
  EngineOptions engine;
  bool averageDense = true;   ///< average (rather than sum) dense gradients over the workers
  bool averageSparse = true;  ///< likewise for sparse gradients
  size_t bucketBytes = size_t{4} << 20;  ///< dense gradients are fused into AllReduce buckets of this size
  /// How served sparse variables are split into row partitions.
  Partitioning partitioning;
  /// Bounds the rendezvous and every wait for another process (collectives, requests to the
  /// servers, the servers' replies): a stall this long is reported as an error naming the
  /// processes involved, and the job stops.
  std::chrono::milliseconds timeout{60000};
  /// The workers of a machine with a server reach the servers through it, as one (their pushes
  /// summed, their pulls merged): see dist/server/LocalAggregator.h.
  bool localAggregation = true;
  /// Servers print the pushes and pulls that crossed between machines when the job ends.
  bool reportTraffic = false;
  /// The data plane's payloads travel as AES-256-GCM ciphertext (dist/transport/Seal.h), as
  /// under a resource specification's "encrypt": true; every process of the job must agree.
  bool encrypt = false;
  /// How CPU workers' dense f32 gradients travel in the ring AllReduce: f32, or bf16 / f16 with
  /// the sums accumulated in f32 (dist/collective/Ring.h); half the bytes, not the same sums.
  DType wireDType = DType::F32;
  /// ZeRO: what each data-parallel CPU worker keeps a shard of, rather than the whole.
  Sharding sharding = Sharding::None;
  /// When the parameter servers take pushes and answer pulls (dist/server/SyncPolicy.h). The
  /// asynchronous modes (aspPolicy, sspPolicy, dsspPolicy) need Architecture::ParameterServer and
  /// one pipeline stage; a machine's workers then reach the servers each on its own.
  std::shared_ptr<const SyncPolicy> sync = bspPolicy();
  /// Under Auto: the sparse variables' measured alpha, by name (measureSparsity). Each one
  /// that a dense AllReduce synchronises with fewer bytes per machine than the servers
  /// (chooseBySparsity) is summed by AllReduce; without a measure a sparse variable is served.
  std::map<std::string, double> sparsity;
  SessionOptions session;
  PipelineConfig pipeline;
};

/// What a launcher (`weft launch`, `weft train`'s own) tells each process of a job beyond its
/// identity, in its environment: get_runner(graph, config) takes the settings over the
/// program's Config, and TrainingLoop the rest.
inline constexpr char kSyncVariable[] = "WEFT_SYNC";                  ///< Config::sync (--sync)
inline constexpr char kStagesVariable[] = "WEFT_STAGES";              ///< Config::pipeline.stages
inline constexpr char kMicrobatchesVariable[] = "WEFT_MICROBATCHES";  ///< Config::pipeline.microbatches
inline constexpr char kPartitionsVariable[] = "WEFT_PARTITIONS";      ///< Config::partitioning.count
/// "on": continue from the checkpoint (a sample of the partition search after the first, the
/// run after the search).
inline constexpr char kResumeVariable[] = "WEFT_RESUME";
/// How many times the launcher started the job again, after a failure or to resize an elastic
/// job (0 at its first start): a later start resumes from the checkpoint.
inline constexpr char kRestartCountVariable[] = "WEFT_RESTART_COUNT";
/// Why the launcher started the job again and at what size, for worker 0's metrics (unset at
/// the first start).
inline constexpr char kRestartCauseVariable[] = "WEFT_RESTART_CAUSE";
/// "1" in every process of an elastic job (`weft launch --min-workers`): the launcher may ask
/// it to stop at a checkpoint, to start it again on more hosts (dist/launch/Preemption.h).
inline constexpr char kElasticVariable[] = "WEFT_ELASTIC";
/// A sample of `--partitions auto`: the steps it trains, and the file worker 0 reports to
/// (dist/launch/PartitionSearch.h).
inline constexpr char kPartitionSampleVariable[] = "WEFT_PARTITION_SAMPLE";
inline constexpr char kPartitionReportVariable[] = "WEFT_PARTITION_REPORT";

/// `config` with the settings a launcher put in this process's environment (WEFT_ARCH,
/// WEFT_SYNC, WEFT_STAGES, WEFT_MICROBATCHES, WEFT_PARTITIONS); throws naming a variable whose
/// value does not parse.
Config withLaunchSettings(Config config);
/// The non-negative integer of environment variable `name`, or `otherwise` when it is unset;
/// throws naming the variable and its value when it is not such an integer.
int64_t integerFromEnvironment(const char* name, int64_t otherwise);

/// The size of a job, as the rules between a Config's settings see it.
struct JobShape {
  int workers = 1;  ///< worker processes: data-parallel workers, or pipeline stages times replicas
  int servers = 0;  ///< parameter-server processes
  std::string sharedGpu;  ///< where two workers share a GPU (ResourceSpec::sharedGpu), or ""
};

/// Throws, naming the settings (and the `weft train` flags that set them), where `config`
/// contradicts itself or the job it runs in: an asynchronous synchronisation mode needs
/// parameter servers holding every trained variable and one pipeline stage (AllReduce and
/// pipeline stages wait for every worker at every step); sharding needs dense variables summed
/// among data-parallel workers in full precision; data-parallel workers do not cut their
/// parts into micro-batches; a pipeline has a whole number of replicas;
/// partitions need variables on servers; only a pipeline's stages share a GPU. get_runner
/// checks every process's configuration this way, and `weft train` checks its flags before it
/// launches anything.
void checkConfig(const Config& config, const JobShape& job);

}  // namespace weft::dist
