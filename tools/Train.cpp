#include "tools/Train.h"

#include "core/Checkpoint.h"
#include "core/Hash.h"
#include "core/InputFile.h"
#include "core/TensorBoard.h"
#include "core/Trace.h"
#include "dist/launch/Launcher.h"
#include "dist/launch/PartitionSampling.h"
#include "dist/pipeline/Pipeline.h"
#include "dist/launch/Preemption.h"
#include "dist/Runner.h"
#include "models/AmpModels.h"
#include "models/ZooModel.h"
#include "ops/Blas.h"
#include "tools/Progress.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <thread>

namespace weft::tools {
namespace {

struct TrainFlags {
  int64_t steps = 0;   // 0: the model's default
  int64_t epochs = 0;  // when set: steps = epochs x batches per epoch
  int64_t batch = 0;  // 0: the model's default
  std::string optimizer;
  double lr = 0, momentum = -1, weightDecay = -1, clip = -1;  // negative / 0 / "": the model's default
  int threads = 2;
  std::string device = "cpu";
  std::string precision = "f32";
  std::string deterministic = "on";
  std::string dtype = "f32";
  std::string recompute = "none";
  int inputThreads = 1;
  uint64_t seed = 1;
  std::string data;
  std::string out;
  int64_t evalEvery = 0;  // 0: ten evaluations per run
  int64_t evalBatches = 50;
  int64_t checkpointEvery = 0;  // 0: at every evaluation
  int64_t logEvery = 100;
  std::string resume;  // "": start afresh; "on": from the checkpoint in --out; "auto": from it if there is one
  bool resumeChanged = false;  // resume although the checkpoint's run had other settings
  int64_t bench = 0;
  // Distribution: a job of `workers` local worker processes and `servers` servers, or `cluster`.
  int workers = 0;
  // Pipelined model parallelism: `stages` worker processes, each one stage of the model.
  int stages = 1;
  int microbatches = 1;
  std::string schedule = "1f1b";
  std::string scheduleFile;  // "": the built-in `schedule`
  int virtualStages = 1;
  bool postValidation = true;
  double memoryPerStage = 0;  // bytes; 0: no limit
  int servers = -1;  // -1: one for data-parallel workers, none for a pipeline
  std::string cluster;
  std::string arch = "auto";
  int64_t partitionBytes = int64_t{1} << 20;
  std::string partitions;  // "": one per server; "auto": searched; else a count
  int64_t partitionSearchSteps = 100;
  int64_t sparsityBatches = 4;
  std::string sync = "bsp";
  std::string slowWorker;  // "RANK:FACTOR"
  double timeout = 60;
  int maxRestarts = 0;
  int minWorkers = 0;  // > 0: an elastic job, on the hosts that answer
  double probeEvery = 5;  // seconds between an elastic job's probes of the hosts it runs without
  // A job a cluster engine started (srun, mpirun, torchrun, Kubernetes).
  int serversPerHost = -1;  // -1: one where the model updates embeddings sparsely, else none
  std::string secretFile;
  double rendezvousTimeout = 60;
  double termGrace = 25;  // seconds from SIGTERM to the checkpoint's end
  bool engine = false;  // set once this process joined its engine's job
  bool reportComm = false;
  bool encrypt = false;
  std::string wireDType = "f32";
  std::string shard = "none";
  std::string trace;  // a Chrome trace of every process's ops and pipeline actions
  std::string tensorboard;  // a directory for TensorBoard event files
  std::string localAggregation = "on";

  bool distributed() const { return workers > 0 || !cluster.empty() || stages > 1 || engine; }
  /// Worker processes of a local job: one per stage of each data-parallel replica.
  int localWorkers() const { return std::max(workers, 1) * stages; }
};

models::OptimizerSpec optimizerSpec(const models::ZooModel& model, const TrainFlags& f) {
  models::OptimizerSpec s = model.defaultOptimizer();
  if (!f.optimizer.empty()) s.name = f.optimizer;
  if (f.lr > 0) s.lr = f.lr;
  if (f.momentum >= 0) s.momentum = f.momentum;
  if (f.weightDecay >= 0) s.weightDecay = f.weightDecay;
  if (f.clip >= 0) s.clipNorm = f.clip;
  return s;
}

/// One JSON object per line, appended.
class MetricsLog {
 public:
  explicit MetricsLog(const std::string& path) : out_(path, std::ios::app) {
    WEFT_CHECK(out_.good(), "cannot open metrics file {}", path);
  }
  void write(const nlohmann::json& record) {
    out_ << record.dump() << "\n";
    out_.flush();
  }

 private:
  std::ofstream out_;
};

/// Worker 0's bytes sent and received per step since `before`, `steps` steps ago, by kind.
void writeBytesPerStep(TensorBoardWriter& board, const dist::Traffic& now, const dist::Traffic& before, int64_t steps,
                       int64_t step) {
  if (steps <= 0) return;
  constexpr std::pair<dist::TrafficKind, const char*> kKinds[] = {{dist::TrafficKind::Dense, "dense"},
                                                                  {dist::TrafficKind::Sparse, "sparse"},
                                                                  {dist::TrafficKind::Control, "control"}};
  double total = 0;
  for (const auto& [kind, name] : kKinds) {
    const auto k = static_cast<size_t>(kind);
    const double bytes = static_cast<double>((now.sent[k] - before.sent[k]) + (now.received[k] - before.received[k]));
    board.scalar(fmt::format("dist/{}_bytes_per_step", name), bytes / static_cast<double>(steps), step);
    total += bytes;
  }
  board.scalar("dist/bytes_per_step", total / static_cast<double>(steps), step);
}

/// The schedule --schedule-file lists, or else the built-in --schedule names with
/// --virtual-stages.
dist::StepSchedule chosenSchedule(const std::string& name, const std::string& file, int virtualStages) {
  return file.empty() ? dist::StepSchedule(dist::parseSchedule(name), virtualStages) : dist::StepSchedule::read(file);
}

class Trainer {
 public:
  Trainer(std::string name, models::ZooModel& model, const TrainFlags& flags, std::vector<std::string> commandLine)
      : name_(std::move(name)), model_(&model), flags_(flags), commandLine_(std::move(commandLine)) {}

  /// Trains; returns the process's exit status (a parameter server's, or 0).
  int run() {
    joinEngineJob();
    Setup setup = resolve();
    if (flags_.distributed() && !dist::launchIdentityFromEnvironment()) return launchJob(setup.resources);
    const models::OptimizerSpec spec = buildModel(setup);
    // Every process of the job (servers too) decides alike: from the specification, not its own device.
    const std::vector<dist::WorkerSlot> slots = setup.resources.workers();
    const bool cpuWorkers =
        std::all_of(slots.begin(), slots.end(), [](const dist::WorkerSlot& w) { return w.device == "cpu"; });
    if (setup.config.architecture == dist::Architecture::Auto && setup.config.sync->synchronous() &&
        flags_.stages == 1 && setup.resources.hosts().size() > 1 && cpuWorkers)
      setup.config.sparsity = measureSparsity(static_cast<int>(slots.size()));
    runner_.emplace(dist::get_runner(graph_, setup.resources, setup.config));  // a server serves here
    // A server stops with its workers; one of a preempted job says so, as they do.
    if (runner_->served())
      return runner_->serverStatus() == 0 && preempted() ? dist::kExitPreempted : runner_->serverStatus();
    session_ = &runner_->session();
    leader_ = runner_->rank() == 0;
    // Each replica reads (or generates) only its part of every total batch, where the data can.
    readsPart_ = runner_->replicas() > 1 && model_->trainData().readPart(runner_->replica(), runner_->replicas());
    if (!flags_.trace.empty()) startTracing();
    steps_ = flags_.epochs > 0   ? flags_.epochs * model_->trainData().batchesPerEpoch()
             : flags_.steps > 0 ? flags_.steps
                                : model_->defaultSteps();
    if (flags_.bench > 0) {
      bench();
      return 0;
    }
    return train(spec, setup);
  }

 private:
  /// --slow-worker RANK:FACTOR; rank -1 when unset.
  struct SlowWorker {
    int rank = -1;
    double factor = 1;
  };

  /// What the flags resolve to, checked against one another before anything starts.
  struct Setup {
    dist::ResourceSpec resources;
    DType precision;
    dist::Config config;  // the job's settings, the measured sparsity still to come
    SlowWorker slow;
  };

  /// Under a cluster engine (a rank among several, and no launcher): becomes that rank's member
  /// of the job, whose processes the engine started; the job's first process serves the
  /// rendezvous (dist/launch/EngineJob.h).
  void joinEngineJob() {
    if (dist::launchIdentityFromEnvironment()) return;
    const std::optional<dist::EngineView> view = dist::detectEngine(dist::processEnvironment());
    if (!view || view->size == 1) return;
    const std::string started =
        fmt::format("{} started this process as rank {} of {}", view->engine, view->rank, view->size);
    WEFT_CHECK(flags_.workers == 0 && flags_.cluster.empty(),
               "--{} starts a job of its own, but {}: drop it (the engine starts the job's processes)",
               flags_.workers > 0 ? "workers" : "cluster", started);
    WEFT_CHECK(flags_.partitions != "auto",
               "--partitions auto restarts the job with each candidate, which only weft's launcher can, but {}: give "
               "--partitions a count", started);
    WEFT_CHECK(flags_.maxRestarts == 0 && flags_.minWorkers == 0,
               "--{} restarts the job from weft's launcher, but {}: the engine's own restarts apply (sbatch "
               "--requeue, torchrun --max-restarts and --nnodes MIN:MAX, a Job's backoffLimit), resuming with "
               "--resume at whatever size the engine starts",
               flags_.maxRestarts != 0 ? "max-restarts" : "min-workers", started);
    dist::EngineOptions options;
    // By default a host's first process serves the embeddings where the host has workers besides.
    const bool roomForServers = *std::min_element(view->tasksPerNode.begin(), view->tasksPerNode.end()) > 1;
    const bool servesEmbeddings = flags_.stages == 1 && model_->updatesSparsely() && roomForServers;
    options.serversPerHost = flags_.serversPerHost >= 0 ? flags_.serversPerHost : servesEmbeddings ? 1 : 0;
    options.secretFile = flags_.secretFile;
    options.rendezvousTimeout = std::chrono::milliseconds(static_cast<int64_t>(flags_.rendezvousTimeout * 1000));
    options.silenceLimit = silenceLimit();
    preemption_ = std::make_unique<dist::Preemption>(
        std::chrono::milliseconds(static_cast<int64_t>(flags_.termGrace * 1000)));
    engine_ = std::make_unique<dist::EngineJob>(*view, options);
    flags_.engine = true;
  }

  bool preempted() const { return preemption_ && preemption_->requested(); }
  /// SIGTERM under an engine, or the launcher's request in an elastic job.
  bool askedToStop() const { return preempted() || dist::checkpointRequested(); }

  /// Whether the job stops after this step, on SIGTERM to its processes or the request of an
  /// elastic job's launcher: every worker's verdict under the synchronous modes (the request
  /// reaches them at different steps), its own under the asynchronous ones, whose workers are at
  /// different steps anyway.
  bool stopRequested(const dist::Config& config) {
    if (!preemption_ && !dist::elasticJob()) return false;
    if (!config.sync->synchronous()) return askedToStop();
    return runner_->meanOverWorkers(askedToStop() ? 1.0 : 0.0) > 0;
  }

  /// A frozen process is named well before the collectives' own timeout would fire.
  std::chrono::milliseconds silenceLimit() const {
    return std::max(std::chrono::milliseconds(3000),
                    std::chrono::milliseconds(static_cast<int64_t>(flags_.timeout * 1000 / 3)));
  }

  /// The flags resolved and checked: the rules between the job's settings are dist::checkConfig's
  /// (the same for every process of the job and for programs of one's own); these are the
  /// trainer's own.
  Setup resolve() const {
    // A pipeline's stages update their own variables unless servers are asked for.
    const int servers = flags_.servers >= 0 ? flags_.servers : flags_.stages > 1 ? 0 : 1;
    // A launched process runs in the job the launcher started, which may be part of --cluster's
    // hosts (an elastic job's).
    const std::optional<dist::ResourceSpec> launched =
        dist::launchIdentityFromEnvironment() ? dist::ResourceSpec::fromEnvironment() : std::nullopt;
    dist::ResourceSpec resources = engine_    ? engine_->layout().resources
                                   : launched ? *launched
                                   : flags_.cluster.empty()
                                       ? dist::ResourceSpec::localCpu(flags_.localWorkers(), servers)
                                       : dist::ResourceSpec::load(flags_.cluster);
    WEFT_CHECK(Device::parse(flags_.device).type == DeviceType::CPU || !flags_.distributed(),
               "--device {} trains in one process; a distributed job's workers compute where its resource "
               "specification says (a host's \"gpus\", or its \"cpu_workers\")",
               flags_.device);
    const DType precision = parseDType(flags_.precision);
    WEFT_CHECK(flags_.dtype == "f32" || precision == f32,
               "--dtype {} computes everything in {}; mixed precision (--precision {}) needs f32", flags_.dtype,
               flags_.dtype, flags_.precision);
    dist::Config config = jobConfig();
    const int workers = flags_.distributed() ? static_cast<int>(resources.workers().size()) : 1;
    dist::checkConfig(config, {workers, flags_.distributed() ? resources.serverCount() : 0,
                               flags_.distributed() ? resources.sharedGpu() : ""});
    const SlowWorker slow = parseSlowWorker(flags_.slowWorker);
    WEFT_CHECK(slow.rank < workers, "--slow-worker {}: the job has {} worker{} (rank 0{})", flags_.slowWorker, workers,
               workers == 1 ? "" : "s", workers == 1 ? "" : fmt::format(" to {}", workers - 1));
    if (flags_.minWorkers > 0) checkElastic(workers);
    if (flags_.partitions == "auto") {
      WEFT_CHECK(flags_.bench == 0,
                 "--bench times one configuration, and --partitions auto runs several: give --partitions a count");
      WEFT_CHECK(flags_.distributed() && flags_.stages == 1 && config.architecture != dist::Architecture::AllReduce,
                 "--partitions auto splits variables on parameter servers, which this run has none of (they need "
                 "--workers or --cluster, one pipeline stage and --arch auto or ps)");
    }
    allowNondeterministicConvolutions(flags_.deterministic == "off");
    return {std::move(resources), precision, std::move(config), slow};
  }

  /// --min-workers: an elastic data-parallel job over --cluster's hosts, of a given total batch.
  void checkElastic(int workers) const {
    WEFT_CHECK(!flags_.cluster.empty(),
               "--min-workers {}: an elastic job runs on the --cluster hosts that answer; a --workers job's are all "
               "this machine's",
               flags_.minWorkers);
    WEFT_CHECK(flags_.minWorkers <= workers, "--min-workers {} is more than the {} workers of {}", flags_.minWorkers,
               workers, flags_.cluster);
    WEFT_CHECK(flags_.batch > 0,
               "--min-workers {}: the total batch stays the same when the job resizes, each worker taking an even "
               "share: give it with --batch",
               flags_.minWorkers);
    WEFT_CHECK(flags_.stages == 1, "--min-workers with --stages {}: a pipeline's stages are not resized",
               flags_.stages);
    WEFT_CHECK(flags_.partitions != "auto",
               "--min-workers with --partitions auto: the search times one size of the job; give --partitions a "
               "count");
  }

  /// The job's settings from the flags (dist::Config), without the measured sparsity.
  dist::Config jobConfig() const {
    dist::Config config;
    config.architecture = dist::parseArchitecture(flags_.arch);
    config.sync = dist::parseSyncPolicy(flags_.sync);
    // Under the asynchronous modes auto means ps: AllReduce would wait for every worker.
    if (!config.sync->synchronous() && config.architecture == dist::Architecture::Auto)
      config.architecture = dist::Architecture::ParameterServer;
    config.partitioning = {static_cast<size_t>(flags_.partitionBytes), partitionCount()};
    config.timeout = std::chrono::milliseconds(static_cast<int64_t>(flags_.timeout * 1000));
    config.session = SessionOptions{flags_.threads, false};
    config.localAggregation = flags_.localAggregation == "on";
    config.reportTraffic = flags_.reportComm;
    config.encrypt = flags_.encrypt;
    config.wireDType = parseDType(flags_.wireDType);
    config.sharding = dist::parseSharding(flags_.shard);
    config.pipeline.stages = flags_.stages;  // with one stage and micro-batches: gradient accumulation
    config.pipeline.microbatches = flags_.microbatches;
    config.pipeline.schedule = chosenSchedule(flags_.schedule, flags_.scheduleFile, flags_.virtualStages);
    config.pipeline.postValidation = flags_.postValidation;
    config.pipeline.memoryPerStage = flags_.memoryPerStage;
    return config;
  }

  /// The launcher of a distributed job: the same command line runs as every worker and server.
  int launchJob(const dist::ResourceSpec& resources) {
    dist::LaunchOptions launch;
    launch.silenceLimit = silenceLimit();
    // After a member fails the whole job starts again, from the last checkpoint once there is one.
    launch.maxRestarts = flags_.maxRestarts;
    launch.minWorkers = flags_.minWorkers;
    launch.hostProbeInterval = std::chrono::milliseconds(static_cast<int64_t>(flags_.probeEvery * 1000));
    // The total batch stays the same at every size: each worker takes an even share of it.
    launch.admitsWorkers = [batch = flags_.batch](int workers) { return batch % workers == 0; };
    launch.restartCommand = [this](int) {
      std::vector<std::string> command = commandLine_;
      if (flags_.resume.empty() && hasCheckpoint(outDir())) command.push_back("--resume");
      return command;
    };
    if (flags_.partitions == "auto") {
      searchPartitions(resources, launch);
    } else {
      WEFT_CHECK(dist::launch(resources, commandLine_, launch) == 0,
                 "the distributed job failed (see the messages above)");
    }
    if (!flags_.trace.empty()) mergeWorkerTraces(static_cast<int>(resources.workers().size()));
    return 0;
  }

  /// Builds the model, its gradients and its updates on this process's device; returns the
  /// optimizer's settings.
  models::OptimizerSpec buildModel(const Setup& setup) {
    models::CommonOptions common;
    common.batchSize = flags_.batch;
    common.seed = flags_.seed;
    common.data = flags_.data;
    common.dtype = flags_.dtype;
    common.recompute = parseRecompute(flags_.recompute);
    WEFT_CHECK(flags_.inputThreads == 1 || name_ == "resnet",
               "--input-threads {}: {} makes its examples cheaply on the prefetch thread; the option is for resnet, "
               "whose image folders are decoded as batches are made",
               flags_.inputThreads, name_);
    common.inputThreads = flags_.inputThreads;
    graph_.setSeed(flags_.seed);
    const Device device = Device::parse(flags_.distributed() ? dist::processDevice(setup.resources) : flags_.device);
    // One process on a GPU is fed from there; a distributed worker's feeds stay on the host, where
    // its requests to the servers read the ids. Micro-batches are cut from a batch on the host,
    // then each goes where the batch would have.
    microbatchDevice_ = flags_.distributed() ? cpu() : device;
    feedDevice_ = flags_.microbatches > 1 ? cpu() : microbatchDevice_;
    // The whole model, its gradients and its updates run on the device.
    auto placed = graph_.onDevice(device.type == DeviceType::CPU ? "" : device.str());
    {
      // A CPU computes bf16 products fast (AVX512_BF16) but convolutions only in f32, where
      // 16-bit copies would add casts and no speed: there bf16 covers the products alone,
      // which round their operands as they pack them.
      const bool cpuBf16 = device.type == DeviceType::CPU && setup.precision == bf16;
      auto mixed = graph_.mixedPrecision(setup.precision, cpuBf16 ? Graph::MixedOps::RoundInProducts
                                                                 : Graph::MixedOps::CastOperands);
      model_->build(graph_, common);
    }
    const models::OptimizerSpec spec = optimizerSpec(*model_, flags_);
    optim::MinimizeOptions minimize;
    minimize.clipGlobalNorm = spec.clipNorm;
    if (setup.precision == f16) minimize.lossScaling = optim::LossScaling{};
    trainStep_ = makeOptimizer(spec)->minimize(model_->loss(), minimize);
    return spec;
  }

  /// What the training loop reports as it goes (the leader's logs; every worker's loss sums).
  struct Reporting {
    std::optional<MetricsLog> metrics;
    std::optional<TensorBoardWriter> board;
    dist::Traffic trafficAtLog;
    int64_t stepAtLog = 0;
    double lossSum = 0, items = 0;
    int64_t lossCount = 0;
    std::string unit = "items";
    double evaluationSeconds = 0;
  };

  /// The training loop, from the checkpoint when resuming: steps, logs, evaluations and
  /// checkpoints, then the final evaluation.
  int train(const models::OptimizerSpec& spec, const Setup& setup) {
    const std::string out = prepareOutput(spec);
    data::PrefetchOptions prefetch;
    prefetch.transform = [this](const data::Batch& batch) { return myPart(batch); };
    prefetch.device = feedDevice_;
    data::Prefetcher batches(model_->trainData(), prefetch);
    int64_t step = 0;
    if (resuming()) step = resume(batches);
    Reporting report;
    if (leader_) report.metrics.emplace(out + "/metrics.jsonl");
    if (leader_) recordRestart(*report.metrics, step, setup.resources.serverCount());
    if (leader_ && !flags_.tensorboard.empty()) report.board.emplace(flags_.tensorboard);
    report.trafficAtLog = runner_->traffic();
    report.stepAtLog = step;
    const int64_t evalEvery = flags_.evalEvery > 0 ? flags_.evalEvery : std::max<int64_t>(1, steps_ / 10);
    const int64_t checkpointEvery = flags_.checkpointEvery > 0 ? flags_.checkpointEvery : evalEvery;
    if (leader_) announce(spec, setup.config, out);
    std::string sharded = runner_->shardingReport();  // a pipeline's shards come with its first step
    if (leader_ && !sharded.empty()) fmt::print("{}\n", sharded);
    if (leader_ && !runner_->sparsityChoices().empty()) reportSparsity(*report.metrics);
    Progress progress(steps_, step);
    // A sample of the partition search trains a stretch and times its second half.
    const int64_t sample = dist::partitionSampleSteps();
    const int64_t stop = sample > 0 ? std::min(steps_, step + sample) : steps_;
    const int64_t timedFrom = step + (stop - step) / 2;
    double timedSeconds = 0;
    bool evaluateAtEnd = false;
    // Sharded parameters are gathered for an evaluation, a collective: every worker evaluates,
    // before the job ends; otherwise worker 0 alone does, and the last ones after the job.
    const bool together = runner_->shardsParameters();
    while (step < stop) {
      const data::Prefetched batch = batches.nextPrefetched();
      const auto [what, count] = itemsIn(batch.source);
      report.unit = what;
      report.items += count;
      const auto started = std::chrono::steady_clock::now();
      const double loss = trainOn(stepFeeds(batch.prepared));
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - started;
      if (step >= timedFrom) timedSeconds += took.count();
      // An emulated slower machine: this worker's steps take FACTOR times as long.
      if (runner_->rank() == setup.slow.rank) std::this_thread::sleep_for(took * (setup.slow.factor - 1));
      WEFT_CHECK(std::isfinite(loss), "{}: the loss became {} at step {}", name_, loss, step + 1);
      report.lossSum += loss;
      ++report.lossCount;
      ++step;
      const bool logNow = step % flags_.logEvery == 0 || step == steps_;
      // The workers' mean is the total batch's loss; the progress line between logs shows rank 0's part.
      // Under the asynchronous modes the workers are not kept together: worker 0 logs its own part.
      if (logNow && setup.config.sync->synchronous()) report.lossSum = runner_->meanOverWorkers(report.lossSum);
      if (stopRequested(setup.config)) {
        runner_->gatherModel();
        const WholeValues wholes = runner_->gatherShards();
        if (leader_) {
          checkpoint(step, batches.position(), wholes);
          if (dist::checkpointRequested()) {
            fmt::print("stopped for the launcher after step {} ({}): checkpoint {} written\n", step,
                       dist::checkpointReason(), checkpointPath_);
          } else {
            fmt::print("stopped on SIGTERM after step {}: checkpoint {} written (--resume auto continues from it)\n",
                       step, checkpointPath_);
          }
        }
        runner_->finish(dist::ServedValues::Leave);  // the checkpoint is written; the process ends
        return dist::kExitPreempted;
      }
      const bool evaluateNow = step % evalEvery == 0 || step == steps_;
      const bool checkpointNow = step % checkpointEvery == 0 || step == stop;
      // Worker 0's session takes the whole model (the servers' variables, the other stages'),
      // for evaluation and the checkpoint.
      if (evaluateNow || checkpointNow) runner_->gatherModel();
      const WholeValues wholes = checkpointNow ? runner_->gatherShards() : WholeValues{};
      if (leader_) {
        if (step == 1 && !runner_->pipelinePlan().empty()) fmt::print("pipeline cut:\n{}", runner_->pipelinePlan());
        if (sharded.empty() && runner_->stages() > 1 && !(sharded = runner_->shardingReport()).empty())
          fmt::print("{}\n", sharded);
        progress.update(step, report.lossSum / static_cast<double>(report.lossCount), report.items, report.unit);
        if (logNow) logStep(report, progress, spec, step);
      } else if (logNow) {
        report.lossSum = 0, report.lossCount = 0;
      }
      // The other workers wait through worker 0's evaluation and checkpoint, however long they
      // take; the last step's evaluation follows the job's end, so that no one waits through it.
      const bool evaluateHere = evaluateNow && step < stop;
      evaluateAtEnd = evaluateNow && step == stop;
      if (evaluateHere && together) evaluate(report, progress, step);
      if ((evaluateHere && !together) || checkpointNow) {
        runner_->runOnWorker0([&] {
          if (evaluateHere && !together) evaluate(report, progress, step);
          if (checkpointNow) checkpoint(step, batches.position(), wholes);
        });
      }
    }
    if (together) {
      if (evaluateAtEnd) evaluate(report, progress, step);
      if (sample == 0) finalEvaluation(report, progress, step);
    }
    // Every worker is done with its last step; the evaluations from here on are rank 0's alone
    // (it pulls nothing when its last gatherModel left it current, as under bsp).
    runner_->finish(leader_ ? dist::ServedValues::Pull : dist::ServedValues::Leave);
    if (flags_.reportComm) reportCommunication(step);
    writeTrace();
    if (!leader_) return 0;
    if (evaluateAtEnd && !together) evaluate(report, progress, step);
    if (sample > 0) {
      reportSample(report,
                   {partitionCount(), runner_->serverPlan().largestPartitionCount(), 0, stop - timedFrom, step, steps_},
                   timedSeconds);
      return 0;
    }
    if (!together) finalEvaluation(report, progress, step);
    return 0;
  }

  /// The run's identity, output directory and checkpoint path; removes what interrupted saves
  /// left. Returns the directory.
  std::string prepareOutput(const models::OptimizerSpec& spec) {
    identity_ = runIdentity(spec);
    const std::string out = outDir();
    checkpointPath_ = out + "/checkpoint.safetensors";
    if (!leader_) return out;
    std::filesystem::create_directories(out);
    const RemovedFiles stale = removeStaleTemporaries(checkpointPath_);
    if (stale.files > 0) {
      fmt::print("removed {} temporary files ({} bytes) that interrupted saves of {} left\n", stale.files, stale.bytes,
                 checkpointPath_);
    }
    return out;
  }

  /// After the launcher started the job again: why, and at what size, from which step.
  void recordRestart(MetricsLog& metrics, int64_t step, int servers) const {
    const char* cause = std::getenv(dist::kRestartCauseVariable);
    if (cause == nullptr) return;
    metrics.write({{"restart", dist::integerFromEnvironment(dist::kRestartCountVariable, 0)},
                   {"cause", cause},
                   {"workers", runner_->workers()},
                   {"servers", servers},
                   {"step", step}});
  }

  /// The line that starts a run: model, steps, threads, optimizer, the job's shape, output.
  void announce(const models::OptimizerSpec& spec, const dist::Config& config, const std::string& out) const {
    fmt::print("training {} for {} steps ({} threads, optimizer {} lr {}{}); output in {}\n", name_, steps_,
               flags_.threads, spec.name, spec.lr,
               runner_->stages() > 1 ? fmt::format(", {} pipeline stages, {} micro-batches, schedule {}, {} replicas",
                                                   runner_->stages(), flags_.microbatches,
                                                   config.pipeline.schedule.name(),
                                                   runner_->replicas())
               : runner_->workers() > 1 ? fmt::format(", {} workers, {} architecture, {}", runner_->workers(),
                                                       dist::architectureName(config.architecture), config.sync->name())
                                        : "",
               out);
  }

  /// The mean loss and rate since the last log, to metrics.jsonl, TensorBoard and the console.
  void logStep(Reporting& report, Progress& progress, const models::OptimizerSpec& spec, int64_t step) {
    const double meanLoss = report.lossSum / static_cast<double>(report.lossCount), rate = progress.rate(report.items);
    report.metrics->write({{"step", step}, {"loss", meanLoss}, {report.unit + "_per_s", rate}});
    if (report.board) {
      report.board->scalar("train/loss", meanLoss, step);
      report.board->scalar("train/" + report.unit + "_per_s", rate, step);
      report.board->scalar("train/learning_rate", spec.lr, step);
      if (runner_->workers() > 1) {
        const dist::Traffic traffic = runner_->traffic();
        writeBytesPerStep(*report.board, traffic, report.trafficAtLog, step - report.stepAtLog, step);
        report.trafficAtLog = traffic;
      }
      report.stepAtLog = step;
    }
    progress.log(step, meanLoss, report.items, report.unit);
    report.lossSum = 0;
    report.lossCount = 0;
    report.items = 0;
    progress.resetRate();
  }

  /// A periodic evaluation on --eval-batches held-out batches.
  void evaluate(Reporting& report, Progress& progress, int64_t step) {
    const auto started = std::chrono::steady_clock::now();
    const std::map<std::string, double> result = model_->evaluate(*session_, flags_.evalBatches);
    report.evaluationSeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (!leader_) return;
    // The time so far without worker 0's evaluations, for time-to-accuracy curves.
    report.metrics->write(
        {{"step", step}, {"seconds", progress.elapsed() - report.evaluationSeconds}, {"eval", result}});
    if (report.board)
      for (const auto& [metric, value] : result) report.board->scalar("eval/" + metric, value, step);
    progress.report(step, result);
  }

  /// Writes the checkpoint; `wholes`: the sharded variables whole (Runner::gatherShards).
  void checkpoint(int64_t step, int64_t dataPosition, const WholeValues& wholes) {
    std::map<std::string, std::string> metadata = identity_;
    metadata["model"] = name_;
    metadata["step"] = std::to_string(step);
    metadata["data_position"] = std::to_string(dataPosition);
    saveCheckpoint(*session_, checkpointPath_, std::move(metadata), wholes);
  }

  /// The last evaluation, on the whole held-out set, and the run's summary line.
  void finalEvaluation(Reporting& report, const Progress& progress, int64_t step) {
    const std::map<std::string, double> result = model_->evaluate(*session_, 0);
    if (!leader_) return;
    nlohmann::json summary{{"model", name_}, {"steps", steps_}, {"seconds", progress.elapsed()}, {"eval", result}};
    if (runner_->workers() > 1) summary["workers"] = runner_->workers();
    report.metrics->write(summary);
    if (report.board)  // on the whole held-out set, unlike the evaluations during training
      for (const auto& [metric, value] : result) report.board->scalar("final/" + metric, value, step);
    fmt::print("{}\n", summary.dump());
  }

  static SlowWorker parseSlowWorker(const std::string& text) {
    if (text.empty()) return {};
    const size_t colon = text.find(':');
    SlowWorker slow;
    try {
      size_t used = 0;
      slow.rank = std::stoi(text.substr(0, colon), &used);
      WEFT_CHECK(used == colon && colon != std::string::npos, "");
      slow.factor = std::stod(text.substr(colon + 1), &used);
      WEFT_CHECK(used == text.size() - colon - 1, "");
    } catch (const std::exception&) {
      WEFT_THROW("--slow-worker {}: expected RANK:FACTOR, such as 1:3 (worker 1's steps take three times as long)",
                 text);
    }
    WEFT_CHECK(slow.rank >= 0 && slow.factor >= 1 && slow.factor <= 1000,
               "--slow-worker {}: the rank must be 0 or more and the factor between 1 and 1000", text);
    return slow;
  }

  /// The job's partition count (--partitions N; 0: one per server); under --partitions auto,
  /// the count the search's launcher gave this run (0 in the launcher itself).
  int partitionCount() const {
    if (flags_.partitions.empty()) return 0;
    if (flags_.partitions == "auto")
      return static_cast<int>(dist::integerFromEnvironment(dist::kPartitionsVariable, 0));
    return std::stoi(flags_.partitions);
  }

  /// A sample of the partition search done (worker 0): its record in metrics.jsonl, and its
  /// report to the search's launcher.
  void reportSample(Reporting& report, dist::PartitionSampleReport sample, double timedSeconds) {
    sample.secondsPerStep = sample.timedSteps > 0 ? timedSeconds / static_cast<double>(sample.timedSteps) : 0.0;
    report.metrics->write({{"partition_sample",
                            {{"partitions", sample.partitions},
                             {"effective", sample.effective},
                             {"seconds_per_step", sample.secondsPerStep},
                             {"timed_steps", sample.timedSteps},
                             {"step", sample.step},
                             {"steps", sample.steps}}}});
    dist::reportPartitionSample(sample);
  }

  std::string outDir() const { return flags_.out.empty() ? "runs/" + name_ : flags_.out; }

  /// --partitions auto (the launcher): the job's samples and its run on with the chosen count
  /// (dist/launch/PartitionSampling.h); the samples and the choice go to metrics.jsonl.
  void searchPartitions(const dist::ResourceSpec& resources, const dist::LaunchOptions& launch) {
    const std::string out = outDir();
    const bool resume =
        flags_.resume == "on" || flags_.resumeChanged || (flags_.resume == "auto" && hasCheckpoint(out));
    dist::PartitionSearchOptions search;
    search.sampleSteps = flags_.partitionSearchSteps;
    search.resume = resume;
    // Beside the run's output, which worker 0 writes: a shared --out serves workers on other hosts.
    search.reportFile = std::filesystem::absolute(out + "/partition-sample.json").string();
    search.chosen = [&](const dist::PartitionSearchRun& run) {
      nlohmann::json samples = nlohmann::json::array();
      for (const dist::PartitionSample& s : run.samples)
        samples.push_back({{"partitions", s.partitions}, {"seconds_per_step", s.seconds}});
      nlohmann::json record{{"samples", samples}, {"partitions", run.choice.partitions}, {"reason", run.choice.reason}};
      if (run.choice.model)
        record["theta"] = {run.choice.model->theta0, run.choice.model->theta1, run.choice.model->theta2};
      MetricsLog(out + "/metrics.jsonl").write({{"partition_search", record}});
    };
    std::filesystem::create_directories(out);
    dist::launchSearchingPartitions(resources, commandLine_, launch, search);
  }

  static bool hasCheckpoint(const std::string& out) { return std::filesystem::exists(out + "/checkpoint.safetensors"); }

  /// The sparse gradients of the first --sparsity-batches batches, every worker's part of each,
  /// measured the same way in every process of the job (the data stream is then rewound).
  std::map<std::string, double> measureSparsity(int workers) {
    data::BatchSource& source = model_->trainData();
    std::vector<FeedMap> feeds;
    for (int64_t b = 0; b < std::min(flags_.sparsityBatches, source.batchesPerEpoch()); ++b) {
      const data::Batch batch = source.next();
      for (int r = 0; r < workers; ++r) feeds.push_back(models::feedsFor(graph_, model_->shard(batch, r, workers)));
    }
    source.seek(0);
    return dist::measureSparsity(graph_, feeds);
  }

  /// How each measured sparse variable is synchronised: printed, and a "sparsity" metrics record.
  void reportSparsity(MetricsLog& metrics) const {
    nlohmann::json record = nlohmann::json::array();
    for (const dist::SparsityChoice& c : runner_->sparsityChoices()) {
      fmt::print("{}\n", c.describe());
      record.push_back({{"variable", c.variable},
                        {"alpha", c.alpha},
                        {"machines", c.machines},
                        {"servers_bytes", c.bytes.servers},
                        {"allreduce_bytes", c.bytes.allReduce},
                        {"synchronised_by", c.allReduce ? "allreduce" : "servers"}});
    }
    std::fflush(stdout);
    metrics.write({{"sparsity", record}});
  }

  /// This worker's part of a total batch (the batch itself when the data gives only the part).
  data::Batch myPart(const data::Batch& batch) const {
    // A pipeline's stages each see their replica's whole part.
    return runner_->replicas() > 1 && !readsPart_ ? model_->shard(batch, runner_->replica(), runner_->replicas())
                                                  : batch;
  }

  /// What the total batch of `batch` holds, for throughput.
  std::pair<std::string, double> itemsIn(const data::Batch& batch) const {
    auto [what, count] = model_->itemsIn(batch);
    return {what, readsPart_ ? count * runner_->replicas() : count};
  }

  /// This process's trace (--trace): the file itself in one process, a part for the launcher
  /// to merge in a job.
  void writeTrace() const {
    if (flags_.trace.empty()) return;
    const std::string process = runner_->stages() > 1 ? fmt::format("stage {}", runner_->rank())
                                                      : fmt::format("worker {}", runner_->rank());
    const std::string path = flags_.distributed() ? partPath(runner_->rank()) : flags_.trace;
    std::ofstream out(path);
    out << traceEventsJson(runner_->rank(), process);
    WEFT_CHECK(out.good(), "cannot write the trace {}", path);
  }
  std::string partPath(int rank) const { return fmt::format("{}.worker-{}", flags_.trace, rank); }

  /// The launcher's one trace of the job: every worker's part, in rank order.
  void mergeWorkerTraces(int workers) const {
    std::vector<std::string> parts;
    for (int r = 0; r < workers; ++r)
      parts.push_back(InputFile(partPath(r), "trace part", uint64_t{1} << 34).readAll());
    std::ofstream out(flags_.trace);
    out << mergeTraces(parts);
    WEFT_CHECK(out.good(), "cannot write the trace {}", flags_.trace);
    for (int r = 0; r < workers; ++r) std::filesystem::remove(partPath(r));
    fmt::print("trace of {} processes in {}\n", workers, flags_.trace);
  }

  /// A step's feeds: the batch's, or a pipeline's micro-batches, cut as the model cuts a batch
  /// among data-parallel workers (so their mean gradient is the batch's), each without the
  /// padding all its sequences have.
  std::vector<FeedMap> stepFeeds(const data::Batch& batch) {
    if (flags_.microbatches == 1) return {models::feedsFor(graph_, batch)};
    std::vector<FeedMap> parts;
    for (int i = 0; i < flags_.microbatches; ++i)
      parts.push_back(models::feedsFor(
          graph_, data::uploadBatch(model_->trimmed(model_->shard(batch, i, flags_.microbatches)), microbatchDevice_)));
    return parts;
  }

  /// One training step; returns its loss.
  double trainOn(const std::vector<FeedMap>& feeds) {
    return runner_->runMicrobatches({model_->loss()}, feeds, {trainStep_})[0].item();
  }

  /// Bytes this worker moved per step, by kind (--report-comm).
  void reportCommunication(int64_t steps) const {
    const dist::Traffic t = runner_->traffic();
    const double n = static_cast<double>(std::max<int64_t>(steps, 1));
    fmt::print(stderr,
               "communication of worker {}: per step {:.0f} dense + {:.0f} sparse bytes sent, {:.0f} dense + {:.0f} "
               "sparse received; setup and control {} bytes sent\n",
               runner_->rank(), t.sent[0] / n, t.sent[1] / n, t.received[0] / n, t.received[1] / n, t.sent[2]);
    fmt::print(stderr,
               "collectives of worker {} with other machines: per step {:.0f} dense + {:.0f} sparse bytes sent, "
               "{:.0f} dense + {:.0f} sparse received\n",
               runner_->rank(), t.sentAcross[0] / n, t.sentAcross[1] / n, t.receivedAcross[0] / n,
               t.receivedAcross[1] / n);
    for (const auto& [variable, rows] : t.sparseRows) {
      fmt::print(stderr, "sparse gradient of {} on worker {}: alpha {:.6f} (distinct rows per step / {} rows), {:.6f} "
                 "with repeats\n",
                 variable, runner_->rank(), rows.alpha(), rows.rows, rows.lookupFraction());
    }
  }

  /// What identifies the run in its checkpoints: every setting that changes the trained values
  /// or the batches, except the number of steps. Keys "run.FLAG" by flag name (the model's
  /// options included), and "run.data-hash" for the training data the loader produced.
  std::map<std::string, std::string> runIdentity(const models::OptimizerSpec& spec) {
    std::map<std::string, std::string> id{
        {"run.seed", std::to_string(flags_.seed)},
        {"run.batch", flags_.batch > 0 ? std::to_string(flags_.batch) : "default"},
        {"run.optimizer", spec.name},
        {"run.lr", fmt::format("{}", spec.lr)},
        {"run.momentum", fmt::format("{}", spec.momentum)},
        {"run.weight-decay", fmt::format("{}", spec.weightDecay)},
        {"run.clip", fmt::format("{}", spec.clipNorm)},
        {"run.precision", flags_.precision},
        {"run.dtype", flags_.dtype},
        {"run.data-hash", hex64(model_->trainData().dataHash())},
    };
    for (const models::ModelOption& o : model_->options()) id["run." + o.name] = optionValue(o);
    // Narrowed gradients change the values (full ones leave no key: checkpoints before it match).
    if (flags_.wireDType != "f32") id["run.wire-dtype"] = flags_.wireDType;
    return id;
  }

  /// Refuses a checkpoint of a run with other settings, naming each, unless --resume-changed.
  void checkIdentity(const std::map<std::string, std::string>& meta) const {
    checkRunIdentity(identity_, meta, checkpointPath_, flags_.resumeChanged, leader_);
  }

  /// Whether this run continues from a checkpoint: --resume, --resume-changed, or --resume auto
  /// where worker 0 finds one in --out (its answer is every worker's).
  bool resuming() {
    // A sample of the partition search after the first, or the run after the search.
    if (dist::launcherResumes()) return true;
    if (flags_.resume != "auto") return flags_.resume == "on" || flags_.resumeChanged;
    return runner_->fromWorker0({leader_ && hasCheckpoint(outDir()) ? 1 : 0})[0] != 0;
  }

  /// Restores variables, the session's run counter and the data position; returns the step.
  /// Worker 0 alone reads the checkpoint and hands the rest of the job its values, so the job's
  /// other hosts need no copy of --out.
  int64_t resume(data::Prefetcher& batches) {
    std::vector<int64_t> position{0, 0};  // the step (every step takes one batch), the session's step
    WholeValues wholes;  // of the variables workers keep shards of
    if (leader_) {
      WEFT_CHECK(std::filesystem::exists(checkpointPath_), "--resume: no checkpoint at {}", checkpointPath_);
      std::map<std::string, std::string> meta = restoreCheckpoint(*session_, checkpointPath_, &wholes);
      WEFT_CHECK(meta["model"] == name_, "--resume: {} holds a '{}' model, not '{}'", checkpointPath_, meta["model"],
                 name_);
      checkIdentity(meta);
      const int64_t step = metadataInteger(meta, checkpointPath_, "step", 0);
      const int64_t consumed = metadataInteger(meta, checkpointPath_, "data_position");
      WEFT_CHECK(consumed == step,
                 "checkpoint {}: metadata field 'data_position' is {}, but a run at step {} has consumed {} batches",
                 checkpointPath_, consumed, step, step);
      position = {step, static_cast<int64_t>(session_->step())};
    }
    position = runner_->fromWorker0(position);
    session_->setStep(static_cast<uint64_t>(position[1]));
    runner_->publishVariables(wholes);
    batches.seek(position[0]);
    if (leader_) fmt::print("resumed from {} at step {}\n", checkpointPath_, position[0]);
    return position[0];
  }

  /// Runs `bench` batches once untimed, then the same batches again timed; one JSON line with
  /// percentiles and throughput. The first pass pays what a training run pays once per batch
  /// shape (compiling a plan, growing the memory arenas), so the timed pass is the steady state.
  /// The batches are uploaded first, as the prefetcher of a training run does ahead of each step.
  void bench() {
    data::BatchSource& source = model_->trainData();
    std::vector<std::vector<FeedMap>> feeds;
    double items = 0;
    std::string unit;
    for (int64_t i = 0; i < flags_.bench; ++i) {
      const data::Batch batch = source.next();
      feeds.push_back(stepFeeds(data::uploadBatch(myPart(batch), feedDevice_)));
      const auto [what, count] = itemsIn(batch);
      unit = what;
      items += count;
    }
    // One process repeats the untimed pass for at least kBenchWarmup: a new thread team's threads
    // start on their creator's core, and the kernel takes milliseconds to spread them, longer
    // than a pass of a small model's steps. A job's processes must run the same steps, so they
    // make one pass.
    constexpr std::chrono::milliseconds kBenchWarmup{200};
    const auto warmupEnd = std::chrono::steady_clock::now() + kBenchWarmup;
    do {
      for (const std::vector<FeedMap>& f : feeds) trainOn(f);
    } while (runner_->workers() * runner_->stages() == 1 && std::chrono::steady_clock::now() < warmupEnd);
    std::vector<double> times;
    for (const std::vector<FeedMap>& f : feeds) {
      const auto start = std::chrono::steady_clock::now();
      trainOn(f);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    runner_->finish(dist::ServedValues::Leave);  // the report reads no variable's value
    writeTrace();
    if (runner_->stages() > 1) {
      // Every stage's own bubble: the share of its steps it waited rather than computed.
      const auto [guessed, redone] = runner_->pipelineGuesses();
      fmt::print(stderr,
                 "pipeline stage {}: idle {:.1f}% of its steps, at most {} bytes of activations kept, {} updates made "
                 "on a guess ({} redone)\n",
                 runner_->rank(), 100 * runner_->pipelineIdleFraction(), runner_->pipelinePeakKeptBytes(), guessed,
                 redone);
    }
    if (!leader_) return;
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    auto at = [&](double q) { return sorted[static_cast<size_t>(q * static_cast<double>(sorted.size() - 1))] * 1e3; };
    double total = 0;
    for (double t : times) total += t;
    const blas::KernelReport kernels = blas::kernelReport();
    const nlohmann::json line{{"model", name_},
                              {"steps", flags_.bench},
                              {"threads", flags_.threads},
                              {"median_ms", at(0.5)},
                              {"p10_ms", at(0.1)},
                              {"p90_ms", at(0.9)},
                              {unit + "_per_s", items / total},
                              {"isa", kernels.vectorIsa},
                              {"gemm_f32", kernels.f32Gemm},
                              {"gemm_bf16", kernels.bf16Gemm},
                              {"peak_plan_bytes", session_->largestPlanPeakBytes()},
                              {"variable_bytes", heldVariableBytes()}};
    fmt::print("{}\n", line.dump());
  }

  /// Bytes of the variables (parameters, optimizer slots, shards of them) this process's session
  /// has made: what it holds between steps.
  size_t heldVariableBytes() {
    size_t bytes = 0;
    for (Node* v : graph_.variables())
      if (session_->holdsVariable(v)) bytes += session_->variable(v).bytes();
    return bytes;
  }

  std::string name_;
  Device feedDevice_;        // where batches are fed from
  Device microbatchDevice_;  // where a pipeline's micro-batches are fed from
  models::ZooModel* model_;
  TrainFlags flags_;
  std::vector<std::string> commandLine_;
  Graph graph_;
  Node* trainStep_ = nullptr;
  std::unique_ptr<dist::Preemption> preemption_;  // under a cluster engine: SIGTERM checkpoints and stops
  std::unique_ptr<dist::EngineJob> engine_;  // before runner_: the rendezvous outlives the runner
  std::optional<dist::Runner> runner_;
  Session* session_ = nullptr;
  bool leader_ = true;  // worker rank 0: prints, logs, evaluates and checkpoints
  bool readsPart_ = false;  // the training data gives this replica's part of each batch, not the batch
  int64_t steps_ = 0;
  std::string checkpointPath_;
  std::map<std::string, std::string> identity_;  // see runIdentity
};

}  // namespace

void addResumeFlags(CLI::App& cmd, std::string& resume, bool& resumeChanged, const std::string& what) {
  cmd.add_option("--resume", resume,
                 what +
                     ". --resume auto: resume when --out holds a checkpoint, else start (a job its engine restarts, "
                     "e.g. sbatch --requeue)")
      ->expected(0, 1)
      ->default_str("on")
      ->check(CLI::IsMember({"on", "auto"}));
  cmd.add_flag("--resume-changed", resumeChanged,
               "resume as --resume does, but continue with the settings of this command line where they differ from "
               "the checkpoint's run (each difference is printed)");
}

std::string optionValue(const models::ModelOption& option) {
  return std::visit(
      [](auto* value) -> std::string {
        using T = std::remove_pointer_t<decltype(value)>;
        if constexpr (std::is_same_v<T, bool>) {
          return *value ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::string>) {
          return *value;
        } else {
          return fmt::format("{}", *value);
        }
      },
      option.target);
}

void checkRunIdentity(const std::map<std::string, std::string>& identity,
                      const std::map<std::string, std::string>& meta, const std::string& path, bool continueChanged,
                      bool announce) {
  const std::vector<std::string> differences = settingDifferences(identity, meta, [](const std::string& key) {
    return key == "run.data-hash" ? std::string("the training data's hash") : "--" + key.substr(4);
  });
  if (differences.empty()) return;
  std::string list;
  for (const std::string& d : differences) list += "\n  " + d;
  WEFT_CHECK(continueChanged,
             "--resume: checkpoint {} was written by a run with other settings:{}\n"
             "resume with --resume-changed to continue with the new ones",
             path, list);
  if (announce)
    fmt::print("--resume-changed: continuing from {} with settings it was not written with:{}\n", path, list);
}

namespace {

/// The flags of the step: its length, batch, optimizer, threads, device, precision and seed.
void addTrainingFlags(CLI::App& cmd, TrainFlags& f) {
  CLI::Option* steps =
      cmd.add_option("--steps", f.steps, "training steps (default: the model's)")->check(CLI::PositiveNumber);
  cmd.add_option("--epochs", f.epochs, "train for this many passes over the training data instead of --steps")
      ->check(CLI::PositiveNumber)
      ->excludes(steps);
  cmd.add_option("--batch", f.batch, "examples per step (default: the model's)")->check(CLI::PositiveNumber);
  cmd.add_option("--optimizer", f.optimizer, "adam, sgd, momentum or adagrad (default: the model's)")
      ->check(CLI::IsMember({"adam", "sgd", "momentum", "adagrad"}));
  cmd.add_option("--lr", f.lr, "learning rate (default: the model's)")->check(CLI::PositiveNumber);
  cmd.add_option("--momentum", f.momentum, "momentum of the momentum optimizer")->check(CLI::Range(0.0, 1.0));
  cmd.add_option("--weight-decay", f.weightDecay, "L2 weight decay")->check(CLI::NonNegativeNumber);
  cmd.add_option("--clip", f.clip, "clip gradients to this global norm (0: off)")->check(CLI::NonNegativeNumber);
  cmd.add_option("--threads", f.threads, "intra-op threads")->capture_default_str()->check(CLI::PositiveNumber);
  cmd.add_option("--device", f.device, "cpu or cuda:N (the GPU runs ops that have CUDA kernels; see README)")
      ->capture_default_str();
  cmd.add_option("--precision", f.precision,
                 "f32, or mixed precision: bf16 or f16 matrix products and convolutions with f32 weights "
                 "(f16 adds dynamic loss scaling; on the CPU, bf16 covers the products alone)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  cmd.add_option("--deterministic", f.deterministic,
                 "on: every GPU kernel gives the same bits every run; off: GPU convolutions may take cuDNN's faster "
                 "non-deterministic algorithms, as PyTorch's cudnn.benchmark does")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  cmd.add_option("--dtype", f.dtype, "f32, or f64 for every variable and computation (to check numerics)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "f64"}));
  cmd.add_option("--seed", f.seed, "seed of weights, data order and dropout")->capture_default_str();
  cmd.add_option("--input-threads", f.inputThreads,
                 "threads that make each training batch's examples (resnet: reading and decoding an image folder's "
                 "files, cropping and flipping them); the batches are the same at any count")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd.add_option("--recompute", f.recompute,
                 "activations recomputed in the backward pass instead of kept: none, selective (each layer's "
                 "element-wise and normalisation values) or full (everything but each layer's input)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "selective", "full"}));
}

/// The flags of data, evaluation, checkpoints, logs and what a run writes besides.
void addOutputFlags(CLI::App& cmd, TrainFlags& f) {
  cmd.add_option("--data", f.data, "real data (file or directory, see README); default: the built-in generator");
  cmd.add_option("--out", f.out, "output directory for metrics.jsonl and checkpoint.safetensors (default: runs/MODEL)");
  cmd.add_option("--eval-every", f.evalEvery, "steps between evaluations (default: a tenth of the run)")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--eval-batches", f.evalBatches, "held-out batches per periodic evaluation (the final one uses all)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd.add_option("--checkpoint-every", f.checkpointEvery, "steps between checkpoints (default: at every evaluation)")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--log-every", f.logEvery, "steps between progress lines")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  addResumeFlags(cmd, f.resume, f.resumeChanged,
                 "continue from the checkpoint in --out, exactly where it stopped; a checkpoint of a run with other "
                 "settings (seed, batch, optimizer, model options, data) is refused");
  cmd.add_option("--bench", f.bench, "run N batches untimed, then time them again; print one JSON line")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--trace", f.trace,
                 "write a Chrome trace (chrome://tracing, Perfetto) of every op and pipeline action of every process, "
                 "one track per process");
  cmd.add_option(
      "--tensorboard", f.tensorboard,
      "also write TensorBoard event files into DIR: train/loss, train/learning_rate, the throughput, eval/ "
      "and final/ metrics, and in a distributed job worker 0's dist/ bytes per step (tensorboard --logdir DIR)");
  cmd.add_flag(
      "--report-comm", f.reportComm,
      "print each worker's bytes sent and received per step, and each server's bytes to and from other machines");
}

/// The flags of a distributed job: its processes, pipeline stages, cluster and failures.
void addJobFlags(CLI::App& cmd, TrainFlags& f) {
  CLI::Option* workers =
      cmd.add_option(
             "--workers", f.workers,
             "train data-parallel with N local worker processes (--batch is the total); with --stages, N replicas "
             "of the pipeline, N x S processes")
          ->check(CLI::PositiveNumber);
  CLI::Option* stages = cmd.add_option("--stages", f.stages,
                                       "train pipelined: the model cut into S stages, each a local worker process "
                                       "(cut by profiling one step, or where the model's Graph::stage scopes say)")
                            ->capture_default_str()->check(CLI::PositiveNumber);
  cmd.add_option("--microbatches", f.microbatches,
                 "each step's batch is cut into M micro-batches, whose gradients are summed before the update "
                 "(--batch is the total): a pipeline's, or one process's gradient accumulation")
      ->capture_default_str()->check(CLI::PositiveNumber);
  CLI::Option* schedule =
      cmd.add_option(
             "--schedule", f.schedule,
             "the pipeline's schedule: gpipe (all forwards, then all backwards), 1f1b (one forward, one backward: at "
             "most S micro-batches held), zb (zero bubble: weight gradients fill the bubbles), interleaved (1f1b "
             "over --virtual-stages V stages per process: a V times smaller bubble) or zbv (zero bubble over two "
             "stages per process in a V: half zb's bubble at 1f1b's memory)")
          ->capture_default_str()
          ->check(CLI::IsMember(kScheduleNames))
          ->needs(stages);
  CLI::Option* file = addScheduleFileFlag(cmd, f.scheduleFile)->needs(stages)->excludes(schedule);
  addVirtualStagesFlag(cmd, f.virtualStages)->needs(schedule)->excludes(file);
  cmd.add_flag("!--no-post-validation", f.postValidation,
               "every pipeline stage waits for the others' last backward before its update, instead of updating at "
               "once on the last steps' clip scale and redoing the rare step where it changed (which holds a copy "
               "of each stage's parameters and optimizer state during the update)")
      ->needs(stages);
  addMemoryPerStageFlag(cmd, f.memoryPerStage)->needs(stages);
  cmd.add_option("--servers", f.servers,
                 "parameter-server processes of a --workers job (default 1, or 0 with --stages: a pipeline's "
                 "stages keep their variables unless told to serve them)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--cluster", f.cluster, "train data-parallel on the hosts of this resource specification (JSON)")
      ->excludes(workers);
  cmd.add_option("--servers-per-host", f.serversPerHost,
                 "under a cluster engine (srun, mpirun, torchrun, Kubernetes): the first K processes of each host are "
                 "parameter servers, the others workers (default: 1 for a model with sparsely updated embeddings "
                 "where every host runs two processes or more, else 0)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--secret-file", f.secretFile,
                 "under a cluster engine: the file holding the job's secret (64 hex digits, mode 0600), the same on "
                 "every host; needed across hosts (default: WEFT_SECRET_FILE)");
  cmd.add_option("--term-grace", f.termGrace,
                 "under a cluster engine: SIGTERM (preemption, scancel, scontrol requeue, a pod's eviction) makes the "
                 "job checkpoint after its current step and exit with 143; a process not done this many seconds "
                 "after the signal exits without one (keep it under the engine's own grace: Slurm's KillWait, a "
                 "pod's terminationGracePeriodSeconds)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd.add_option("--rendezvous-timeout", f.rendezvousTimeout,
                 "under a cluster engine: seconds the job's processes have to find each other")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd.add_option("--timeout", f.timeout,
                 "seconds a distributed step may wait for another process before the job stops; a process silent for a "
                 "third of it (at least 3 s) stops the job at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--wire-dtype", f.wireDType,
                 "how dense gradients travel in the workers' ring AllReduce: f32, or bf16 / f16 (half the bytes; the "
                 "sums still accumulate in f32, but are rounded on the way, so the job no longer computes exactly what "
                 "one process computes)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  cmd.add_option("--shard", f.shard,
                 "what each data-parallel CPU worker keeps a shard of (ZeRO): none; optimizer (1/N of every dense "
                 "variable's optimizer slots and summed gradient; the gradients are reduce-scattered and the updated "
                 "shards all-gathered); or parameters (1/N of the variables too, gathered whole layer by layer for "
                 "the forward and again for the backward; evaluations run on every worker). Checkpoints stay whole")
      ->capture_default_str();
  cmd.add_flag("--encrypt", f.encrypt,
               "encrypt the data plane's payloads (AES-256-GCM) between the job's processes, not only authenticate "
               "them; the resource specification's \"encrypt\": true does the same");
  cmd.add_option("--max-restarts", f.maxRestarts,
                 "after a process of a distributed job fails, start the whole job again from its last checkpoint, up "
                 "to this many times")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd.add_option("--min-workers", f.minWorkers,
                 "an elastic --cluster job: it runs on the hosts that answer, with at least N workers; a restart "
                 "leaves out a host that is gone, and a host that answers again joins after a checkpoint (the total "
                 "--batch, which must be given, stays the same)")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--probe-every", f.probeEvery,
                 "seconds between an elastic job's probes of the hosts it runs without (--min-workers)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

/// The flags of how a data-parallel job moves its variables: architecture, partitions, synchronisation.
void addParallaxFlags(CLI::App& cmd, TrainFlags& f) {
  cmd.add_option("--arch", f.arch,
                 "how variables are synchronised: auto (AllReduce dense, parameter servers for sparse), ar (AllReduce "
                 "dense, AllGather sparse) or ps (every variable on the parameter servers)")
      ->capture_default_str()->check(CLI::IsMember({"auto", "ar", "ps"}));
  cmd.add_option("--partition-bytes", f.partitionBytes,
                 "a sparse variable on the servers of at least this many bytes, outside every partitioner scope, is "
                 "split into row partitions (--partitions)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd.add_option("--partitions", f.partitions,
                 "row partitions of each split sparse variable on the servers, independent of the servers' number "
                 "(default: one per server), or auto: searched by timing samples of the job")
      ->check([](const std::string& value) -> std::string {
        if (value == "auto" || (value.find_first_not_of("0123456789") == std::string::npos && value.size() < 7 &&
                                std::stoi(value) > 0)) {
          return "";
        }
        return "auto or a positive count, not '" + value + "'";
      });
  cmd.add_option("--partition-search-steps", f.partitionSearchSteps,
                 "steps each sample of --partitions auto trains; the second half is timed")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd.add_option("--sparsity-batches", f.sparsityBatches,
                 "under --arch auto on several machines: batches whose sparse gradients are measured before training, "
                 "so that a sparse variable that a dense AllReduce moves in fewer bytes than the servers is summed by "
                 "AllReduce (0: every sparse variable on the servers)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd.add_option(
         "--sync", f.sync,
         "how the parameter servers synchronise the workers: bsp (every step together), asp (every push "
         "applied as it comes), ssp:S (at most S steps ahead of the slowest worker) or dssp:SL:SU (SL, and up to "
         "SU when the DSSP controller predicts less waiting); all but bsp serve every variable (--arch ps)")
      ->capture_default_str();
  cmd.add_option("--slow-worker", f.slowWorker,
                 "RANK:FACTOR: worker RANK's steps take FACTOR times as long (it sleeps after each), to emulate a "
                 "slower machine");
  cmd.add_option("--local-aggregation", f.localAggregation,
                 "on: the workers of a machine reach the parameter servers through its server, as one (pushes summed, "
                 "pulls merged); off: each worker on its own")
      ->capture_default_str()->check(CLI::IsMember({"on", "off"}));
}

void addCommonFlags(CLI::App& cmd, TrainFlags& f) {
  addTrainingFlags(cmd, f);
  addOutputFlags(cmd, f);
  addJobFlags(cmd, f);
  addParallaxFlags(cmd, f);
}

}  // namespace

std::unique_ptr<optim::Optimizer> makeOptimizer(const models::OptimizerSpec& s) {
  if (s.name == "adam") return std::make_unique<optim::Adam>(s.lr, 0.9, 0.999, 1e-8, s.weightDecay);
  if (s.name == "sgd") return std::make_unique<optim::SGD>(s.lr, s.weightDecay);
  if (s.name == "momentum") return std::make_unique<optim::Momentum>(s.lr, s.momentum, false, s.weightDecay);
  if (s.name == "adagrad") return std::make_unique<optim::Adagrad>(s.lr, 1e-10, s.weightDecay);
  WEFT_THROW("unknown optimizer '{}' (adam, sgd, momentum, adagrad)", s.name);
}

void addModelFlags(CLI::App& cmd, const std::string& model, const std::vector<models::ModelOption>& options) {
  for (const models::ModelOption& o : options) {
    const std::string flag = "--" + o.name;
    WEFT_CHECK(cmd.get_option_no_throw(flag) == nullptr, "model '{}' declares option {}, which the trainer already has",
               model, flag);
    std::visit(
        [&](auto* target) {
          using T = std::remove_pointer_t<decltype(target)>;
          if constexpr (std::is_same_v<T, bool>) {
            cmd.add_flag(flag, *target, o.help);
          } else {
            cmd.add_option(flag, *target, o.help)->capture_default_str();
          }
        },
        o.target);
  }
}

void addTrainCommands(CLI::App& train, const std::vector<std::string>& commandLine, int& status) {
  train.footer("Asynchronous model-parallel training (AMPNet): weft train MODEL --amp, MODEL one of gnn, "
               "list_reduction, mlp or tree_lstm (see weft train MODEL --amp --help)");
  // A model that exists only as an AMP graph is named here too, so asking for it says how.
  for (const std::string& name : models::ampModelNames()) {
    const std::vector<std::string> zoo = models::zooModelNames();
    if (std::find(zoo.begin(), zoo.end(), name) != zoo.end()) continue;
    CLI::App* cmd = train.add_subcommand(name, "train the " + name + " model (with --amp only)");
    cmd->allow_extras();
    cmd->callback([name] { WEFT_THROW("{} trains asynchronously only: weft train {} --amp", name, name); });
  }
  for (const std::string& name : models::zooModelNames()) {
    // The model lives as long as the command line: its options are bound to its fields.
    std::shared_ptr<models::ZooModel> model = models::makeZooModel(name);
    auto flags = std::make_shared<TrainFlags>();
    CLI::App* cmd = train.add_subcommand(name, "train the " + name + " model");
    addCommonFlags(*cmd, *flags);
    addModelFlags(*cmd, name, model->options());
    cmd->callback([name, model, flags, commandLine, &status] {
      status = Trainer(name, *model, *flags, commandLine).run();
    });
  }
}

double parseByteSize(const std::string& text) {
  static const std::map<std::string, double> units{{"", 1},
                                                   {"kB", 1e3},
                                                   {"MB", 1e6},
                                                   {"GB", 1e9},
                                                   {"TB", 1e12},
                                                   {"KiB", 1024.0},
                                                   {"MiB", 1048576.0},
                                                   {"GiB", 1073741824.0},
                                                   {"TiB", 1099511627776.0}};
  size_t end = 0;
  double number = -1;
  try {
    number = std::stod(text, &end);
  } catch (const std::exception&) {
  }
  const auto unit = units.find(end > 0 ? text.substr(end) : "?");
  WEFT_CHECK(number >= 0 && std::isfinite(number) && std::isdigit(static_cast<unsigned char>(text[0])) &&
                 unit != units.end(),
             "'{}' is not a number of bytes: write digits, optionally with a unit (kB, MB, GB, TB or KiB, MiB, GiB, "
             "TiB), such as 512MB or 2GiB",
             text);
  return number * unit->second;
}

CLI::Option* addMemoryPerStageFlag(CLI::App& cmd, double& bytes) {
  return cmd.add_option_function<std::string>(
         "--memory-per-stage", [&bytes](const std::string& text) { bytes = parseByteSize(text); },
         "the automatic pipeline cut keeps each stage's parameters, gradients, optimizer state and the activations "
         "its schedule holds within BYTES (such as 4GB or 512MiB), refusing, with what the leanest cut needs, when "
         "none fits")
      ->check([](const std::string& text) -> std::string {
        try {
          parseByteSize(text);
          return "";
        } catch (const Error& e) {
          return e.what();
        }
      });
}

CLI::Option* addScheduleFileFlag(CLI::App& cmd, std::string& path) {
  return cmd
      .add_option("--schedule-file", path,
                  "the pipeline's schedule as a file: one line per stage process, process 0 first, each its actions in "
                  "one step, such as 'F0 F1 B0 B1' (W's split the backward as zb does; with several stages per "
                  "process each action names its stage first, such as '2F0'); checked before the job starts (every "
                  "action once, no deadlock). Every process reads it at this path")
      ->check(CLI::ExistingFile);
}

CLI::Option* addVirtualStagesFlag(CLI::App& cmd, int& virtualStages) {
  return cmd
      .add_option("--virtual-stages", virtualStages,
                  "model stages per process (interleaved: 2 or more; zbv: 2): the model is cut into S x V stages, "
                  "process s holding stages s, s + S, ... (interleaved) or s and 2S - 1 - s (zbv)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

namespace {

/// Each process's actions of the schedule and how a step of it goes when a (stage's) forward
/// takes one unit of time, and its backward two (its input gradients one, its weight gradients one).
std::string describeSchedule(const dist::StepSchedule& schedule, int stages, int microbatches) {
  const dist::SimulatedStep step = schedule.simulate(stages, microbatches, {1, 1, 1});
  std::string out = fmt::format(
      "schedule {}, {} micro-batches: a step of {:g} units when a forward takes 1 and a backward 2 (B and W 1 each)\n",
      schedule.name(), microbatches, step.makespan);
  const dist::PipelineOrders orders = schedule.orders(stages, microbatches);
  const std::vector<int> processOf = dist::processOfStage(orders);
  for (size_t p = 0; p < orders.size(); ++p) {
    std::vector<int> held;
    for (size_t c = 0; c < processOf.size(); ++c)
      if (processOf[c] == static_cast<int>(p)) held.push_back(static_cast<int>(c));
    const std::string who = held.size() == 1 ? fmt::format("stage {}", p)
                                             : fmt::format("process {} (stages {})", p, fmt::join(held, ", "));
    out += fmt::format("{}: idle {:.0f}%, holds the activations of at most {} {}micro-batch{}: {}", who,
                       100 * step.idle[p] / step.makespan, step.peakInFlight[p], held.size() == 1 ? "" : "stage ",
                       step.peakInFlight[p] == 1 ? "" : "es", dist::formatOrders({orders[p]}));
  }
  return out;
}

}  // namespace

std::string describePipelineCut(Graph& graph, models::ZooModel& model, Node* trainStep,
                                const PipelineCutOptions& options) {
  const dist::StepSchedule schedule = chosenSchedule(options.schedule, options.scheduleFile, options.virtualStages);
  Session session(graph, SessionOptions{options.threads, false});
  const data::Batch batch = model.trainData().next();
  const FeedMap feeds = models::feedsFor(graph, model.shard(batch, 0, options.microbatches));
  const std::vector<Output> fetches{model.loss()};
  const auto seconds = session.profile(fetches, feeds, {trainStep});
  int64_t rows = 1;
  for (const auto& [placeholder, value] : feeds)
    if (placeholder.shape().rank() >= 1 && placeholder.shape()[0] == -1) rows = value.shape()[0];
  const dist::StagePlan plan = dist::planStages(
      graph, fetches, trainStep, seconds,
      {.stages = options.stages,
       .valueBytes = dist::valueBytes(session.valueTypes(fetches, feeds, {trainStep})),
       .rows = rows, .microbatches = options.microbatches,
       .schedule = schedule, .linkBytesPerSecond = options.linkGbps * 1e9 / 8,
       .memoryPerStage = options.memoryPerStage});
  dist::applyStages(graph, fetches, trainStep, plan.firstOp);
  const dist::PipelineCut cut =
      dist::cutPipeline(graph, schedule.modelStages(options.stages), fetches, trainStep, false);
  std::string out = plan.describe();
  for (const dist::Transfer& t : cut.transfers) {
    out += fmt::format("transfer {} ({}) from stage {} to stage {}, in its {}\n", t.value.name(), t.value.type().str(),
                       t.from, t.to, dist::phaseName(t.receivedIn));
  }
  for (const dist::TiedVariable& t : cut.tied) {
    out += fmt::format("tied variable {} ({}): updated by stage {}, copied to stage{} {} after each update\n",
                       t.variable->name, t.variable->output().type().str(), t.owner, t.copies.size() == 1 ? "" : "s",
                       fmt::join(t.copies, ", "));
  }
  return out + describeSchedule(schedule, options.stages, options.microbatches);
}

}  // namespace weft::tools
