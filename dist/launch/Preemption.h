// SIGTERM as cluster engines mean it: Slurm's preemption, scancel and `scontrol requeue`, a
// Kubernetes pod's eviction, torchrun stopping its workers. Each sends SIGTERM and, a grace
// period later (Slurm's KillWait, a pod's terminationGracePeriodSeconds), SIGKILL. A process
// that holds a Preemption takes the SIGTERM as a request: the trainer finishes its step, the
// workers agree on the step to stop at, worker 0 writes a checkpoint, and every member leaves the
// job and exits with kExitPreempted, which the next start resumes from (`--resume auto`). A
// process still running `grace` after the signal exits at once, saying that it could not stop
// in time.
//
//   dist::Preemption preemption(std::chrono::seconds(25));
//   for (...) { step(); if (runner.meanOverWorkers(preemption.requested()) > 0) { save(); break; } }
//
// The same stop, asked by weft's launcher of an elastic job (`--min-workers`) when a host it
// runs without answers again: the coordinator's CHECKPOINT reaches every member's heartbeat
// thread, which records it here; the workers stop at a step as on SIGTERM and the launcher starts
// the job again on more hosts, from that checkpoint.
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace weft::dist {

/// The exit status of a member that stopped on SIGTERM, after its job's checkpoint.
inline constexpr int kExitPreempted = 143;

/// Whether this process belongs to an elastic job (kElasticVariable is "1"): its training loop
/// looks at checkpointRequested() between steps.
bool elasticJob();
/// Records the launcher's request to stop at a checkpoint, and why (from any thread).
void requestCheckpoint(const std::string& reason);
/// Whether the launcher asked this process to stop at a checkpoint.
bool checkpointRequested();
/// Why it asked ("" when it did not).
std::string checkpointReason();

class Preemption {
 public:
  /// Catches SIGTERM from now on (one Preemption at a time). Unless `handled`, a SIGTERM still
  /// ends the process as it would without one, until handle() says that a loop looks at
  /// requested() between its steps (a program's own loop may not).
  explicit Preemption(std::chrono::milliseconds grace, bool handled = true);
  /// Restores the previous handling of SIGTERM.
  ~Preemption();
  Preemption(const Preemption&) = delete;
  Preemption& operator=(const Preemption&) = delete;

  /// Whether SIGTERM arrived.
  bool requested() const;
  /// From now on SIGTERM is a request (see the constructor).
  void handle();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace weft::dist
