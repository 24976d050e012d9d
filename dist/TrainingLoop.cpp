// The training loop's checkpoints, resumption, preemption and partition samples (see the header).
#include "dist/TrainingLoop.h"

#include "core/Checkpoint.h"
#include "core/Error.h"
#include "dist/Config.h"
#include "dist/launch/Job.h"
#include "dist/launch/PartitionSampling.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

namespace weft::dist {
namespace {

/// Whether a launcher or engine restarted this job after a failure: its last checkpoint is the
/// place to go on from, whatever the program asked for.
bool restarted() {
  return integerFromEnvironment(kRestartCountVariable, 0) > 0 ||
         integerFromEnvironment("TORCHELASTIC_RESTART_COUNT", 0) > 0;
}

/// The launcher's word (a partition sample after the first, the run after the search) wins.
Resume resumeFor(Resume asked) {
  if (launcherResumes()) return Resume::Always;
  if (asked == Resume::Never && restarted()) return Resume::IfPresent;
  return asked;
}

/// "on SIGTERM", or "for the launcher: host 2 (10.0.0.3) answers again ...".
std::string stopCause() { return checkpointRequested() ? "for the launcher: " + checkpointReason() : "on SIGTERM"; }

std::map<std::string, std::string> recordedSettings(const std::map<std::string, std::string>& settings) {
  std::map<std::string, std::string> recorded;
  for (const auto& [name, value] : settings) recorded["run." + name] = value;
  return recorded;
}

}  // namespace

TrainingLoop::TrainingLoop(Runner& runner, int64_t steps, TrainingLoopOptions options)
    : runner_(&runner), options_(std::move(options)), steps_(steps), leader_(runner.rank() == 0) {
  WEFT_CHECK(steps >= 0, "TrainingLoop: {} steps", steps);
  WEFT_CHECK(options_.checkpointEvery >= 0, "TrainingLoop: a checkpoint every {} steps", options_.checkpointEvery);
  sampleSteps_ = partitionSampleSteps();
  WEFT_CHECK(sampleSteps_ == 0 || !options_.checkpoint.empty(),
             "this run is a sample of the partition search, which continues from one sample's checkpoint to the "
             "next, but its TrainingLoop has no checkpoint path (TrainingLoopOptions::checkpoint)");
  if (!options_.checkpoint.empty()) {
    if (leader_) {
      const std::filesystem::path directory = std::filesystem::path(options_.checkpoint).parent_path();
      if (!directory.empty()) std::filesystem::create_directories(directory);
      removeStaleTemporaries(options_.checkpoint);
    }
    // SIGTERM from an engine asks for a checkpoint (get_runner caught it from the start, for the
    // servers' sake), as it does to a process alone; from weft's launcher it stops a job whose
    // member failed, which has nothing to agree on.
    // An elastic job's launcher asks for the same stop when it grows the job.
    watchesTerm_ = runner.handleStopRequests() || elasticJob();
    if (!watchesTerm_ && !launchIdentityFromEnvironment()) {
      preemption_ = std::make_unique<Preemption>(options_.termGrace);
      watchesTerm_ = true;
    }
    resume();
  }
  end_ = sampleSteps_ > 0 ? std::min(steps_, step_ + sampleSteps_) : steps_;
  timedFrom_ = step_ + (end_ - step_) / 2;
  lastCheckpoint_ = step_;
  stepStarted_ = std::chrono::steady_clock::now();
}

TrainingLoop::~TrainingLoop() = default;

void TrainingLoop::resume() {
  const Resume mode = resumeFor(options_.resume);
  const std::string& path = options_.checkpoint;
  if (mode == Resume::Never) {
    // The earlier run's checkpoint must not be what a restart of this one continues from.
    if (leader_ && std::filesystem::remove(path))
      fmt::print("starting afresh: removed the checkpoint {} of an earlier run\n", path);
    return;
  }
  const bool present = leader_ && std::filesystem::exists(path);
  WEFT_CHECK(!leader_ || present || mode != Resume::Always, "resuming: no checkpoint at {}", path);
  if (runner_->fromWorker0({present ? 1 : 0})[0] == 0) return;
  // Worker 0 alone reads the checkpoint and hands the job its values: no other host needs it.
  std::vector<int64_t> position{0, 0};  // the step, the session's random step
  WholeValues wholes;  // of the variables workers keep shards of
  if (leader_) {
    const std::map<std::string, std::string> metadata = restoreCheckpoint(runner_->session(), path, &wholes);
    const std::vector<std::string> differences =
        settingDifferences(recordedSettings(options_.settings), metadata,
                           [](const std::string& key) { return fmt::format("'{}'", key.substr(4)); });
    std::string list;
    for (const std::string& d : differences) list += "\n  " + d;
    WEFT_CHECK(differences.empty(), "resuming: checkpoint {} was written by a run with other settings:{}", path, list);
    position = {metadataInteger(metadata, path, "step", 0, steps_), static_cast<int64_t>(runner_->session().step())};
  }
  position = runner_->fromWorker0(position);
  runner_->session().setStep(static_cast<uint64_t>(position[1]));
  runner_->publishVariables(wholes);
  step_ = position[0];
  resumed_ = true;
}

void TrainingLoop::stepDone() {
  WEFT_CHECK(running(), "TrainingLoop::stepDone after the loop ended (step {} of {})", step_, end_);
  const auto now = std::chrono::steady_clock::now();
  if (step_ >= timedFrom_) timedSeconds_ += std::chrono::duration<double>(now - stepStarted_).count(), ++timedSteps_;
  ++step_;
  if (stopRequested()) {
    stopped_ = true;
    checkpoint();
    if (leader_)
      fmt::print("stopped {} after step {}: checkpoint {} written\n", stopCause(), step_, options_.checkpoint);
  } else if (!options_.checkpoint.empty() && options_.checkpointEvery > 0 && step_ % options_.checkpointEvery == 0) {
    checkpoint();
  }
  stepStarted_ = std::chrono::steady_clock::now();
}

bool TrainingLoop::stopRequested() {
  if (!watchesTerm_) return false;
  const bool mine = preemption_ ? preemption_->requested() : runner_->stopRequested();
  // SIGTERM reaches the workers at different steps: under the synchronous modes they agree on
  // one; under the asynchronous ones each is at a step of its own anyway.
  if (!runner_->synchronous() || runner_->workers() == 1) return mine;
  return runner_->meanOverWorkers(mine ? 1.0 : 0.0) > 0;
}

void TrainingLoop::checkpoint() {
  runner_->gatherModel();  // worker 0's session takes the servers' and the other stages' values
  const WholeValues wholes = runner_->gatherShards();
  lastCheckpoint_ = step_;
  // The others wait for the save however long a large model's takes.
  runner_->runOnWorker0([&] {
    std::map<std::string, std::string> metadata = recordedSettings(options_.settings);
    metadata["step"] = std::to_string(step_);
    saveCheckpoint(runner_->session(), options_.checkpoint, std::move(metadata), wholes);
  });
}

int TrainingLoop::finish() {
  WEFT_CHECK(!finished_, "TrainingLoop::finish called twice");
  finished_ = true;
  if (!options_.checkpoint.empty() && lastCheckpoint_ != step_) checkpoint();
  runner_->finish();
  preemption_.reset();  // SIGTERM from here on ends the process as usual
  if (sampleSteps_ > 0 && leader_) reportSample();
  return stopped_ ? kExitPreempted : 0;
}

void TrainingLoop::reportSample() {
  PartitionSampleReport report;
  report.partitions = integerFromEnvironment(kPartitionsVariable, 0);
  report.effective = runner_->serverPlan().largestPartitionCount();
  report.timedSteps = timedSteps_;
  report.secondsPerStep = timedSteps_ > 0 ? timedSeconds_ / static_cast<double>(timedSteps_) : 0;
  report.step = step_;
  report.steps = steps_;
  reportPartitionSample(report);
}

}  // namespace weft::dist
