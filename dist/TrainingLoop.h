// What a training program does around its steps, the same alone, under `weft launch` and under
// a cluster engine, so that programs of one's own get what `weft train` does for the zoo:
//
//     dist::Runner runner = dist::get_runner(graph, config);
//     if (runner.served()) return runner.serverStatus();
//     dist::TrainingLoop loop(runner, steps, {.checkpoint = "out/checkpoint.safetensors", .checkpointEvery = 100});
//     for (; loop.running(); loop.stepDone()) {
//       const int64_t step = loop.step();      // from the checkpoint's step when resumed
//       runner.run({loss}, feedsFor(step, runner.replica()), {trainStep});
//     }
//     return loop.finish();                    // 0, or kExitPreempted after SIGTERM
//
// - Resuming: worker 0 alone reads the checkpoint and hands the job its values (variables,
//   optimizer slots, the step, the session's random step), so hosts need no shared file system.
//   A restart by `weft launch --max-restarts` or torchrun's resumes whenever a checkpoint exists.
// - Checkpoints: every `checkpointEvery` steps and when the loop ends, worker 0 writes the whole
//   model (dist::Runner::gatherModel) atomically, with the run's settings.
// - SIGTERM (Slurm's preemption and requeue, a pod's eviction), under a cluster engine or to a
//   process alone: the workers agree on the step to stop at (under the synchronous modes; their
//   own under the asynchronous ones), worker 0 writes a checkpoint, and finish() returns
//   kExitPreempted for the program to exit with. (Under `weft launch`, SIGTERM is the launcher
//   stopping a job whose member failed, and ends the process.)
// - `weft launch --partitions auto`: each sample of the search is a run of this loop that trains
//   a stretch, times its second half and reports to the launcher (dist/launch/PartitionSearch.h), each
//   continuing from the previous one's checkpoint.
#pragma once

#include "dist/launch/Preemption.h"
#include "dist/Runner.h"

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace weft::dist {

/// Whether a run continues from its checkpoint.
enum class Resume {
  Never,      ///< start afresh, removing an earlier run's checkpoint (a restart of this run resumes)
  IfPresent,  ///< continue when the checkpoint exists
  Always,     ///< continue; a missing checkpoint is an error
};

struct TrainingLoopOptions {
  /// The checkpoint's path, as worker 0 sees it; "" : no checkpoints, no resuming, and SIGTERM
  /// ends the process as it would without the loop.
  std::string checkpoint;
  /// Steps between checkpoints; 0: only when the loop ends or stops.
  int64_t checkpointEvery = 0;
  Resume resume = Resume::IfPresent;
  /// What makes the run what it is (learning rate, batch, data...), recorded in the checkpoint;
  /// resuming from a checkpoint of other settings is refused, naming each difference.
  std::map<std::string, std::string> settings;
  /// From SIGTERM to the exit of a process alone, at most (under an engine:
  /// Config::engine.termGrace, since get_runner catches the signal).
  std::chrono::milliseconds termGrace{25000};
};

class TrainingLoop {
 public:
  /// Resumes when the options (or a restart) say so: every worker of the job constructs its loop
  /// at the same point, after get_runner.
  TrainingLoop(Runner& runner, int64_t steps, TrainingLoopOptions options = {});
  ~TrainingLoop();
  TrainingLoop(const TrainingLoop&) = delete;
  TrainingLoop& operator=(const TrainingLoop&) = delete;

  /// The step to run next, counted from 0 (the checkpoint's step when resumed).
  int64_t step() const { return step_; }
  /// Whether the loop continued from a checkpoint.
  bool resumed() const { return resumed_; }
  /// Whether the run has trained all its steps (not when a sample of the partition search or
  /// SIGTERM ended it earlier): what a program reports its results after.
  bool completed() const { return step_ >= steps_; }
  /// Whether another step is to run: the steps are not done, SIGTERM did not stop the job, and
  /// a sample of the partition search has steps left.
  bool running() const { return !stopped_ && step_ < end_; }
  /// After every step, on every worker: counts it, and writes a checkpoint when one is due or
  /// SIGTERM stops the job.
  void stepDone();
  /// Ends the loop: the last checkpoint, the runner's finish(), a sample's report. Returns the
  /// exit status for the program: 0, or kExitPreempted when SIGTERM stopped it.
  int finish();

 private:
  void resume();
  void checkpoint();
  bool stopRequested();
  void reportSample();

  Runner* runner_;
  TrainingLoopOptions options_;
  std::unique_ptr<Preemption> preemption_;
  int64_t steps_, step_ = 0, end_ = 0, lastCheckpoint_ = -1;
  bool leader_, watchesTerm_ = false, resumed_ = false, stopped_ = false, finished_ = false;
  // A sample of `weft launch --partitions auto`: steps to train, where to report, and the timing.
  int64_t sampleSteps_ = 0, timedFrom_ = 0, timedSteps_ = 0;
  std::string sampleReport_;
  std::chrono::steady_clock::time_point stepStarted_;
  double timedSeconds_ = 0;
};

}  // namespace weft::dist
