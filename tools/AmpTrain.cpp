#include "tools/AmpTrain.h"

#include "core/Checkpoint.h"
#include "core/Error.h"
#include "core/JsonLimits.h"
#include "core/Trace.h"
#include "dist/amp/AmpRuntime.h"
#include "dist/launch/Engine.h"
#include "dist/launch/EngineJob.h"
#include "dist/launch/Job.h"
#include "dist/launch/Launcher.h"
#include "dist/launch/Preemption.h"
#include "models/AmpModels.h"
#include "tools/Train.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <random>

namespace weft::tools {
namespace {

struct AmpFlags {
  std::string model;
  bool amp = true;
  int workers = 2;
  std::string device = "cpu";
  int processes = 1;
  int maxActiveKeys = 4;
  int minUpdateFrequency = 8;
  int minibatch = 0;
  int replicas = 1;
  int replicaSyncEvery = 0;
  int64_t epochs = 0;
  int64_t steps = 0;
  double target = -1;
  std::string optimizer;
  double lr = 0;
  uint64_t seed = 1;
  std::string data;
  std::string dtype = "f32";
  std::string out;
  std::string trace;
  std::string save;
  std::string resume;  // "": start afresh; "on": from the checkpoint in --out; "auto": from it if there is one
  bool resumeChanged = false;
  int64_t checkpointEvery = 1;  // epochs
  std::string cluster;
  // A job a cluster engine started (srun, mpirun, torchrun, Kubernetes).
  std::string secretFile;
  double rendezvousTimeout = 60;
  double termGrace = 25;
  double timeout = 120;
  bool encrypt = false;
  bool dot = false;
};

/// A frozen process is named well before the runtime's own timeout would fire.
std::chrono::milliseconds silenceLimit(const AmpFlags& f) {
  return std::max(std::chrono::milliseconds(3000),
                  std::chrono::milliseconds(static_cast<int64_t>(f.timeout * 1000 / 3)));
}

std::vector<int64_t> epochOrder(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

nlohmann::json nodeStats(const amp::EpochReport& r) {
  nlohmann::json nodes = nlohmann::json::object();
  for (const amp::NodeReport& n : r.nodes)
    if (n.gradients > 0 || n.updates > 0)
      nodes[n.name] = {{"worker", n.worker},
                       {"updates", n.updates},
                       {"gradients", n.gradients},
                       {"staleness_mean", n.meanStaleness},
                       {"staleness_max", n.maxStaleness},
                       {"busy_s", n.busySeconds}};
  return nodes;
}

/// What identifies an AMP run in its checkpoints: every setting that changes the trained values
/// or the instances, except the number of epochs and the workers (synchronous training is the
/// same function on any number; asynchronous training is not repeatable on any).
std::map<std::string, std::string> runIdentity(models::AmpModel& model, const AmpFlags& f,
                                               const models::OptimizerSpec& spec) {
  std::map<std::string, std::string> id{{"run.seed", std::to_string(f.seed)},
                                        {"run.data", f.data},
                                        {"run.dtype", f.dtype},
                                        {"run.replicas", std::to_string(f.replicas)},
                                        {"run.optimizer", spec.name},
                                        {"run.lr", fmt::format("{}", spec.lr)},
                                        {"run.minibatch", std::to_string(f.minibatch)},
                                        {"run.min-update-frequency", std::to_string(f.minUpdateFrequency)},
                                        {"run.max-active-keys", std::to_string(f.maxActiveKeys)},
                                        {"run.replica-sync-every", std::to_string(f.replicaSyncEvery)}};
  for (const models::ModelOption& o : model.options()) id["run." + o.name] = optionValue(o);
  return id;
}

/// Drops the records of `path` (JSON lines) after epoch `epoch`: what the run a checkpoint of
/// that epoch continues wrote after it (epochs since, a summary).
void keepMetricsUpTo(const std::string& path, int64_t epoch) {
  std::ifstream in(path);
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    if (jsonNestingBeyond(line, kMaxJsonDepth)) continue;  // not a record this trainer wrote
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_object() && record.contains("epoch") && record["epoch"].is_number_integer() &&
        record["epoch"].get<int64_t>() <= epoch)
      kept += line + "\n";
  }
  in.close();
  std::ofstream(path, std::ios::trunc) << kept;
}

/// An AMP run's progress between epochs: where it stands and what its summary adds up.
struct AmpProgress {
  int64_t epoch = 0;  // epochs done
  double trainSeconds = 0;
};

/// Reads the checkpoint of an AMP run (the controller alone), checked against this run's settings.
std::optional<amp::ResumePoint> readCheckpoint(const std::string& path, const std::string& model,
                                               const std::map<std::string, std::string>& identity, const AmpFlags& f,
                                               AmpProgress& progress) {
  if (f.resume == "auto" && !f.resumeChanged && !std::filesystem::exists(path)) return std::nullopt;
  WEFT_CHECK(std::filesystem::exists(path), "--resume: no checkpoint at {}", path);
  TensorFile file = readSafetensors(path, Checksums::Required);
  WEFT_CHECK(file.metadata["model"] == model + " --amp", "--resume: {} holds a '{}' model, not '{} --amp'", path,
             file.metadata["model"], model);
  checkRunIdentity(identity, file.metadata, path, f.resumeChanged, true);
  progress.epoch = metadataInteger(file.metadata, path, "epoch", 1);
  try {
    progress.trainSeconds = std::stod(file.metadata["train_seconds"]);
  } catch (const std::exception&) {
    WEFT_THROW("checkpoint {}: metadata field 'train_seconds' is '{}', not a number", path,
               file.metadata["train_seconds"]);
  }
  return amp::ResumePoint{std::move(file.tensors), progress.epoch};
}

void writeCheckpoint(const std::string& path, const std::string& model, std::map<std::string, std::string> metadata,
                     const amp::Runtime& runtime, const AmpProgress& progress) {
  metadata["model"] = model + " --amp";
  metadata["epoch"] = std::to_string(progress.epoch);
  metadata["train_seconds"] = fmt::format("{}", progress.trainSeconds);
  writeSafetensors(path, {runtime.variables(), std::move(metadata)});
}

/// One process's part of an AMP run; every process of a --processes, --cluster or engine job
/// runs one alike, and the controller (rank 0) reports and writes the checkpoints.
class AmpTrainer {
 public:
  AmpTrainer(models::AmpModel& model, const AmpFlags& f, const amp::AmpProcesses& processes,
             const dist::Preemption* preemption);
  /// 0, or dist::kExitPreempted after SIGTERM.
  int run();

 private:
  amp::AmpOptions runtimeOptions() const;
  void prepareOutput();
  void resume();
  /// SIGTERM from the engine: every process stops between epochs, after the controller's
  /// checkpoint (none before the first epoch: the next start begins afresh). True when stopping.
  bool stopOnTerm();
  /// Trains epoch `epoch`, evaluates, checkpoints; true when the target accuracy was reached.
  bool trainEpoch(int64_t epoch);
  void logEpoch(int64_t epoch, const amp::EpochReport& held);
  void writeTrace() const;
  void writeSummary();

  models::AmpModel& model_;
  const AmpFlags& f_;
  const amp::AmpProcesses processes_;
  const dist::Preemption* preemption_;
  const bool leader_;
  models::OptimizerSpec spec_;
  std::unique_ptr<amp::Runtime> runtime_;
  std::string outDir_, checkpointPath_;
  std::map<std::string, std::string> identity_;
  AmpProgress progress_;
  std::ofstream metrics_;
  double target_ = 0;
  int64_t instances_ = 0, epochs_ = 0;  // a step is one training instance
  int64_t checkpointed_ = 0, reachedAt_ = 0;
  double reachedSeconds_ = 0, accuracy_ = 0;
  amp::EpochReport last_;
};

AmpTrainer::AmpTrainer(models::AmpModel& model, const AmpFlags& f, const amp::AmpProcesses& processes,
                       const dist::Preemption* preemption)
    : model_(model), f_(f), processes_(processes), preemption_(preemption), leader_(processes.rank == 0),
      spec_(model.defaultOptimizer()) {
  if (!f.optimizer.empty()) spec_.name = f.optimizer;
  if (f.lr > 0) spec_.lr = f.lr;
  const amp::AmpOptions options = runtimeOptions();
  if (options.trace) startTracing();
  runtime_ = std::make_unique<amp::Runtime>(model.graph(), options, processes);
  outDir_ = f.out.empty() ? "runs/" + f.model + "-amp" : f.out;
  checkpointPath_ = outDir_ + "/checkpoint.safetensors";
  identity_ = runIdentity(model, f, spec_);
  target_ = f.target >= 0 ? f.target : model.targetAccuracy();
  // As in the zoo, --epochs wins over --steps.
  instances_ = f.epochs > 0 || f.steps == 0 ? (f.epochs > 0 ? f.epochs : model.defaultEpochs()) * model.trainSize()
                                            : f.steps;
  epochs_ = (instances_ + model.trainSize() - 1) / model.trainSize();
}

amp::AmpOptions AmpTrainer::runtimeOptions() const {
  return {.workers = f_.workers,
          .device = f_.device,
          .maxActiveKeys = f_.maxActiveKeys,
          .minUpdateFrequency = f_.minUpdateFrequency,
          .minibatch = f_.minibatch,
          .optimizer = makeOptimizer(spec_),
          .replicaSyncEvery = f_.replicaSyncEvery,
          .timeout = std::chrono::milliseconds(static_cast<int64_t>(f_.timeout * 1000)),
          .trace = !f_.trace.empty()};
}

int AmpTrainer::run() {
  const std::string mode = f_.minibatch > 0 ? fmt::format("sync, minibatch {}", f_.minibatch)
                                            : fmt::format("async, min update frequency {}", f_.minUpdateFrequency);
  if (leader_)
    fmt::print(
        "{} --amp: {} process(es) of {} workers, {} max active keys, {}, {} training and {} held-out instances\n",
        f_.model, processes_.count, f_.workers, f_.maxActiveKeys, mode, model_.trainSize(), model_.evalSize());
  prepareOutput();
  if (progress_.epoch >= epochs_) {  // resumed with nothing left to train: the summary's accuracy is still measured
    accuracy_ = runtime_->evaluate(model_.evalSize(), [&](int64_t i) { return model_.evalInstance(i); }).accuracy;
    if (leader_) fmt::print("the checkpoint is of epoch {}: no epochs left of {}\n", progress_.epoch, epochs_);
  }
  checkpointed_ = progress_.epoch;
  for (int64_t epoch = progress_.epoch + 1; epoch <= epochs_; ++epoch) {
    if (stopOnTerm()) return dist::kExitPreempted;
    if (trainEpoch(epoch)) break;
  }
  writeTrace();
  if (leader_) writeSummary();
  return 0;
}

void AmpTrainer::prepareOutput() {
  if (leader_) {
    std::filesystem::create_directories(outDir_);
    removeStaleTemporaries(checkpointPath_);
  }
  if (!f_.resume.empty() || f_.resumeChanged) resume();
  if (!leader_) return;
  // A resumed run continues the metrics of the run it continues, up to the checkpoint's epoch.
  if (progress_.epoch > 0) keepMetricsUpTo(outDir_ + "/metrics.jsonl", progress_.epoch);
  metrics_.open(outDir_ + "/metrics.jsonl", progress_.epoch > 0 ? std::ios::app : std::ios::trunc);
}

void AmpTrainer::resume() {
  // The controller alone reads the checkpoint; the other processes take their transforms' part.
  std::optional<amp::ResumePoint> point;
  if (leader_) {
    try {
      point = readCheckpoint(checkpointPath_, f_.model, identity_, f_, progress_);
    } catch (const std::exception& e) {
      runtime_->abort(e.what());  // the other processes wait for their part: they stop, naming why
      throw;
    }
  }
  progress_.epoch = runtime_->resume(point);
  if (leader_ && point) fmt::print("resumed from {} after epoch {}\n", checkpointPath_, progress_.epoch);
}

bool AmpTrainer::stopOnTerm() {
  if (preemption_ == nullptr || !runtime_->anyProcess(preemption_->requested())) return false;
  if (leader_ && checkpointed_ != progress_.epoch && progress_.epoch > 0)
    writeCheckpoint(checkpointPath_, f_.model, identity_, *runtime_, progress_);
  // No process exits before the checkpoint is written: the engine may stop the rest at the first exit.
  runtime_->anyProcess(true);
  if (leader_)
    fmt::print("stopped on SIGTERM after epoch {}{}\n", progress_.epoch,
               progress_.epoch > 0
                   ? fmt::format(": checkpoint {} written (--resume auto continues from it)", checkpointPath_)
                   : ", before any checkpoint");
  return true;
}

bool AmpTrainer::trainEpoch(int64_t epoch) {
  const std::vector<int64_t> order = epochOrder(model_.trainSize(), f_.seed, epoch);
  const int64_t count = std::min(model_.trainSize(), instances_ - (epoch - 1) * model_.trainSize());
  last_ = runtime_->train(count, [&](int64_t i) { return model_.trainInstance(order[static_cast<size_t>(i)]); });
  progress_.trainSeconds += last_.seconds;
  const amp::EpochReport held =
      runtime_->evaluate(model_.evalSize(), [&](int64_t i) { return model_.evalInstance(i); });
  accuracy_ = held.accuracy;
  progress_.epoch = epoch;
  const bool reached = target_ > 0 && held.accuracy >= target_;
  if (leader_ && (epoch % f_.checkpointEvery == 0 || epoch == epochs_ || reached)) {
    writeCheckpoint(checkpointPath_, f_.model, identity_, *runtime_, progress_);
    checkpointed_ = epoch;
  }
  // Every process stops where the controller's accuracy reached the target.
  if (!leader_) return reached;
  logEpoch(epoch, held);
  if (reached) reachedAt_ = epoch, reachedSeconds_ = progress_.trainSeconds;
  return reached;
}

void AmpTrainer::logEpoch(int64_t epoch, const amp::EpochReport& held) {
  fmt::print("epoch {:>3} | train {} | held-out loss {:.4f} accuracy ({}) {:.4f}\n", epoch, last_.summary(), held.loss,
             model_.accuracyOf(), held.accuracy);
  std::fflush(stdout);
  metrics_ << nlohmann::json{{"epoch", epoch},
                             {"train_loss", last_.loss},
                             {"train_accuracy", last_.accuracy},
                             {"eval_loss", held.loss},
                             {"eval_accuracy", held.accuracy},
                             {"instances_per_s", last_.instancesPerSecond},
                             {"train_seconds", progress_.trainSeconds},
                             {"mean_active_keys", last_.meanActiveKeys},
                             {"worker_utilisation", last_.workerUtilisation},
                             {"replica_syncs", last_.replicaSyncs},
                             {"nodes", nodeStats(last_)}}
                  .dump()
           << "\n";
}

void AmpTrainer::writeTrace() const {
  if (f_.trace.empty()) return;
  const std::string path = processes_.count > 1 ? fmt::format("{}.process-{}", f_.trace, processes_.rank) : f_.trace;
  std::ofstream(path) << traceEventsJson(processes_.rank,
                                         fmt::format("{} --amp, process {}", f_.model, processes_.rank));
}

void AmpTrainer::writeSummary() {
  if (!f_.save.empty()) {
    TensorFile file;
    file.tensors = runtime_->variables();
    file.metadata["model"] = f_.model;
    writeSafetensors(f_.save, file);
  }
  nlohmann::json summary{{"model", f_.model},
                         {"mode", f_.minibatch > 0 ? "sync" : "async"},
                         {"processes", processes_.count},
                         {"workers", f_.workers},
                         {"max_active_keys", f_.maxActiveKeys},
                         {"min_update_frequency", f_.minUpdateFrequency},
                         {"minibatch", f_.minibatch},
                         {"replicas", f_.replicas},
                         {"eval_accuracy", accuracy_},
                         {"target", target_},
                         {"train_seconds", progress_.trainSeconds},
                         {"instances_per_s", last_.instancesPerSecond}};
  if (const auto [item, perInstance] = model_.itemsPerInstance(); !item.empty())
    summary[item + "_per_s"] = last_.instancesPerSecond * perInstance;
  if (reachedAt_ > 0) summary["epochs_to_target"] = reachedAt_, summary["seconds_to_target"] = reachedSeconds_;
  metrics_ << summary.dump() << "\n";
  fmt::print("{}\n", summary.dump());
}

/// Every process of a --processes job (the controller is rank 0) trains alike; rank 0 reports.
int train(models::AmpModel& model, const AmpFlags& f, const amp::AmpProcesses& processes,
          const dist::Preemption* preemption) {
  return AmpTrainer(model, f, processes, preemption).run();
}

/// A resource specification for an AMP job: CPU workers only (no parameter servers, no GPUs:
/// --device places the transforms).
dist::ResourceSpec ampCluster(const std::string& path) {
  dist::ResourceSpec spec = dist::ResourceSpec::load(path);
  for (size_t h = 0; h < spec.hosts().size(); ++h) {
    const dist::HostSpec& host = spec.hosts()[h];
    WEFT_CHECK(host.servers == 0,
               "--amp --cluster {}: host {} ({}) lists {} parameter server(s); AMP jobs run workers only "
               "(set \"servers\": 0)",
               path, h, host.address, host.servers);
    WEFT_CHECK(host.gpus.empty(),
               "--amp --cluster {}: host {} ({}) lists GPUs; an AMP job's processes are listed as cpu_workers, and "
               "--device cuda:N puts every process's transforms on that GPU",
               path, h, host.address);
  }
  return spec;
}

/// Under a cluster engine (a rank among several, and no launcher): makes this process that
/// rank's member of the AMP job, whose processes the engine started, and takes SIGTERM as the
/// request to stop at the next epoch's end; nothing otherwise.
std::unique_ptr<dist::EngineJob> joinEngineJob(const AmpFlags& f, std::unique_ptr<dist::Preemption>& preemption) {
  if (dist::launchIdentityFromEnvironment()) return nullptr;
  const std::optional<dist::EngineView> view = dist::detectEngine(dist::processEnvironment());
  if (!view || view->size == 1) return nullptr;
  WEFT_CHECK(f.processes == 1 && f.cluster.empty(),
             "--{} starts a job of its own, but {} started this process as rank {} of {}: drop it (the engine starts "
             "the job's processes)",
             f.processes > 1 ? "processes" : "cluster", view->engine, view->rank, view->size);
  dist::EngineOptions options;  // AMP jobs have no parameter servers
  options.secretFile = f.secretFile;
  options.rendezvousTimeout = std::chrono::milliseconds(static_cast<int64_t>(f.rendezvousTimeout * 1000));
  options.silenceLimit = silenceLimit(f);
  preemption = std::make_unique<dist::Preemption>(std::chrono::milliseconds(static_cast<int64_t>(f.termGrace * 1000)));
  return std::make_unique<dist::EngineJob>(*view, options);
}

/// The flags of `weft train MODEL --amp` beyond those `weft graph MODEL --amp` shares.
void addTrainingFlags(CLI::App& app, AmpFlags& f) {
  app.add_option("--workers", f.workers, "worker threads (of each process)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--device", f.device,
                 "cpu or cuda:N: where the transforms compute (each process's workers take turns on the GPU; "
                 "messages stay on the host)")
      ->capture_default_str();
  app.add_option("--processes", f.processes,
                 "worker processes on this machine, messages between them over UCX (rank 0 pumps the instances)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--save", f.save, "write the trained variables to this safetensors file");
  app.add_option("--checkpoint-every", f.checkpointEvery,
                 "epochs between checkpoints of variables and optimizer state in --out (and after the last)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  addResumeFlags(app, f.resume, f.resumeChanged,
                 "continue after the last epoch of the checkpoint in --out; a checkpoint of a run with other "
                 "settings is refused");
  app.add_option(
      "--cluster", f.cluster,
      "run the worker processes on the hosts of this resource specification (JSON; \"servers\": 0 on every host)");
  app.add_option("--max-active-keys", f.maxActiveKeys, "instances in flight at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--min-update-frequency", f.minUpdateFrequency, "gradients a transform gathers before it updates")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--minibatch", f.minibatch,
                 "train synchronously instead: every transform updates once per this many instances, after all of them")
      ->check(CLI::PositiveNumber);
  app.add_option("--replica-sync-every", f.replicaSyncEvery,
                 "replicas average after every this many updates each (0: each epoch)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--epochs", f.epochs, "passes over the training data (default: the model's)")
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", f.steps, "training instances, the last pass partial (default: --epochs passes)")
      ->check(CLI::PositiveNumber);
  app.add_option("--target", f.target, "stop when the held-out accuracy reaches this (default: the model's; 0: never)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--optimizer", f.optimizer, "adam, sgd, momentum or adagrad (default: the model's)")
      ->check(CLI::IsMember({"adam", "sgd", "momentum", "adagrad"}));
  app.add_option("--lr", f.lr, "learning rate (default: the model's)")->check(CLI::PositiveNumber);
  app.add_option("--out", f.out, "directory for metrics.jsonl and the checkpoint (default: runs/MODEL-amp)");
  app.add_option("--trace", f.trace,
                 "write each worker's forward, backward and update work as a trace-event JSON file");
  app.add_option("--timeout", f.timeout, "seconds without any message processed before the run stops with an error")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("--encrypt", f.encrypt,
               "encrypt the payloads between the job's processes (AES-256-GCM), not only authenticate them; the "
               "--cluster specification's \"encrypt\": true does the same");
  app.add_option("--secret-file", f.secretFile,
                 "under a cluster engine: the job secret's file (weft secret PATH); "
                 "needed across hosts")
      ->check(CLI::ExistingFile);
  app.add_option("--rendezvous-timeout", f.rendezvousTimeout,
                 "under a cluster engine: seconds the job's processes have to find each other")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--term-grace", f.termGrace,
                 "under a cluster engine, SIGTERM makes the job stop at the end of its epoch with a checkpoint and "
                 "exit with 143; a process not done this many seconds after the signal exits without one (keep it "
                 "above an epoch's duration and under the engine's own grace)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

/// Trains alone, or as one process of a job: launching it (--processes, --cluster), started by
/// the launcher, or started by a cluster engine.
int trainInJob(models::AmpModel& model, const AmpFlags& f, int argc, char** argv) {
  // Under a cluster engine each of its processes is one of the job's (the controller is rank 0).
  std::unique_ptr<dist::Preemption> preemption;
  const std::unique_ptr<dist::EngineJob> engine = joinEngineJob(f, preemption);
  if (!engine && f.processes == 1 && f.cluster.empty()) {
    WEFT_CHECK(!f.encrypt, "--encrypt encrypts what a job's processes send each other: it needs --processes, "
                           "--cluster or a cluster engine");
    return train(model, f, {}, nullptr);
  }
  WEFT_CHECK(f.processes == 1 || f.cluster.empty(),
             "--processes {} and --cluster: the specification says the processes", f.processes);
  const dist::ResourceSpec resources = engine              ? engine->layout().resources
                                       : f.cluster.empty() ? dist::ResourceSpec::localCpu(f.processes, 0)
                                                           : ampCluster(f.cluster);
  const int processes = static_cast<int>(resources.workers().size());
  if (!dist::launchIdentityFromEnvironment()) {
    // This process is the launcher: the same command line runs as each worker process.
    std::vector<std::string> command(argv, argv + argc);
    std::error_code noPath;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", noPath);
    if (!noPath) command[0] = self.string();
    dist::LaunchOptions launch;
    launch.silenceLimit = silenceLimit(f);
    const int status = dist::launch(resources, command, launch);
    if (!f.trace.empty()) {
      std::vector<std::string> parts;
      for (int r = 0; r < processes; ++r) {
        const std::string part = fmt::format("{}.process-{}", f.trace, r);
        std::ifstream in(part);
        parts.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        std::filesystem::remove(part);
      }
      std::ofstream(f.trace) << mergeTraces(parts);
    }
    return status == 0 ? 0 : 1;
  }
  dist::Config config;
  config.timeout = std::chrono::milliseconds(static_cast<int64_t>(f.timeout * 1000));
  config.encrypt = f.encrypt;
  std::optional<dist::JobContext> job = dist::joinJob(resources, config);
  WEFT_CHECK(job.has_value(), "--processes: this process was not started by the launcher");
  if (job->rank() == 0 && (config.encrypt || resources.encrypt()))
    fmt::print("the payloads between the job's processes are encrypted (AES-256-GCM)\n");
  const int status = train(model, f, {job->rank(), job->workers(), job->transport.get(), job->routes.workerPeers},
                           preemption.get());
  if (status == 0 || status == dist::kExitPreempted) job->leave();  // done, not failed: the job's watch lets it go
  job->transport->closeAll(std::chrono::steady_clock::now() + config.timeout);
  return status;
}

}  // namespace

bool wantsAmp(int argc, char** argv) {
  if (argc < 2 || (std::strcmp(argv[1], "train") != 0 && std::strcmp(argv[1], "graph") != 0)) return false;
  for (int i = 2; i < argc; ++i)
    if (std::strcmp(argv[i], "--amp") == 0) return true;
  return false;
}

int runAmp(int argc, char** argv) {
  const bool training = std::strcmp(argv[1], "train") == 0;
  // The model is known before parsing: its own options join the command line's.
  std::string name;
  for (int i = 2; i < argc && name.empty(); ++i)
    if (argv[i][0] != '-') name = argv[i];
  CLI::App app(training ? "weft train MODEL --amp: asynchronous model-parallel training (AMPNet)"
                        : "weft graph MODEL --amp: the AMP graph of a model");
  AmpFlags f;
  std::vector<std::string> accepted = models::ampModelNames();
  accepted.push_back("ggsnn");  // the paper's name of the GGSNN
  app.add_option("model", f.model, "gnn (the GGSNN; also: ggsnn), list_reduction, mlp or tree_lstm")
      ->required()
      ->check(CLI::IsMember(accepted));
  app.add_flag("--amp", f.amp, "the AMP trainer (required to get here)");
  std::unique_ptr<models::AmpModel> model;
  if (!name.empty() && std::find(accepted.begin(), accepted.end(), name) != accepted.end())
    model = models::makeAmpModel(name);
  app.add_option("--seed", f.seed, "seed of weights, data and instance order")->capture_default_str();
  app.add_option("--data", f.data, "real data: a graph file (ggsnn) or a bracketed tree file (tree_lstm); see README");
  app.add_option("--dtype", f.dtype, "f32 or f64")->capture_default_str()->check(CLI::IsMember({"f32", "f64"}));
  app.add_option("--replicas", f.replicas, "copies of the heaviest transform (list_reduction)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  if (training) addTrainingFlags(app, f);
  else app.add_flag("--dot", f.dot, "Graphviz DOT instead of text");
  if (model) addModelFlags(app, name, model->options());
  try {
    app.parse(argc - 1, argv + 1);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    model->build({f.seed, f.data, f.dtype == "f64" ? f64 : f32, f.replicas});
    if (!training) {
      model->graph().verify();
      std::fputs(model->graph().describe(f.dot).c_str(), stdout);
      return 0;
    }
    return trainInJob(*model, f, argc, argv);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "weft: error: {}\n", e.what());
    return 1;
  }
}

}  // namespace weft::tools
