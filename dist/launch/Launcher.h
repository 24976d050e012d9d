// `weft launch`: starts every process of a job and stops the whole job when any of them fails.
// It creates the job's id and secret (the secret goes to local processes in a sealed memory file
// they inherit, and through ssh's standard input to remote hosts; never onto a command line or
// into the file system), runs the rendezvous coordinator, and starts the same command once per
// worker and once per server, each with its identity in the environment (see Runner.h). Local
// hosts (127.x, localhost) get child processes; other hosts get `ssh HOST` in the launching
// directory.
//
// The job ends when every worker exited with status 0 (the servers then leave by themselves).
// When a process fails (non-zero status, a signal) or the launcher gets SIGINT or SIGTERM, every
// other process gets SIGTERM, then SIGKILL after a grace period: no process is left behind. Each
// member runs in a process group of its own, which is what is signalled, so a launch prefix that
// does not exec its command is stopped with it. Members die with their launcher even when it is
// killed with SIGKILL: a local member's first process has the parent-death signal, and every
// member ends itself when its coordinator connection closes. SIGTSTP (Ctrl-Z) stops the members
// and then the launcher; SIGCONT resumes them.
//
// Supervision judges by facts first: a process that ended (waitpid), a connection that closed.
// Silence alone names a member only when the others kept beating, on a clock that leaves out
// the coordinator's own scheduling gaps, so a busy machine or a job paused as a whole is not a
// failure. When a member gives up waiting on a peer, the heartbeats' progress counters name the
// member that stopped making progress (computing, or stopped) instead of the one that gave up.
//
// An elastic job (LaunchOptions::minWorkers) runs on the hosts that answer: before each start the
// launcher probes every host the way it starts members there (its launch prefix running `true`,
// or `ssh HOST true`), and starts the job on those that answer, from the last host backwards
// trimmed to the largest worker count the program admits, if that is minWorkers or more. A host
// lost mid-run (its members die and its probe fails) is left out at the restart; one that answers
// again (a host back, or one absent at the start) makes the launcher ask the running job for a
// checkpoint (Coordinator::requestCheckpoint), after which it starts the job again on more hosts.
// Such a resize is no failure and counts against no restart limit.
#pragma once

#include "dist/launch/ResourceSpec.h"

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace weft::dist {

/// How long a job's processes have to join the rendezvous (the launcher's default).
inline constexpr std::chrono::milliseconds kRendezvousTimeout{60000};

struct LaunchOptions {
  /// How long the processes have to join the rendezvous.
  std::chrono::milliseconds rendezvousTimeout = kRendezvousTimeout;
  /// How long the processes get between SIGTERM and SIGKILL, and the servers to leave.
  std::chrono::milliseconds grace{5000};
  /// A process that sends no heartbeat for this long while the others do (it froze, or the
  /// network cut it off) stops the job, named. Heartbeats come every second from a thread of
  /// their own, so a long step or evaluation never looks silent.
  std::chrono::milliseconds silenceLimit{20000};
  /// After a member fails, the job is started again (new id and secret, every process) up to
  /// this many times, with `restartCommand(n)` for the n-th start after the first (e.g. the
  /// command with --resume), and n in every process's WEFT_RESTART_COUNT (0 at the first start;
  /// an elastic job's resizes count there too, not against this limit), which
  /// dist::TrainingLoop resumes by. A stop signal to the launcher is never restarted.
  int maxRestarts = 0;
  std::function<std::vector<std::string>(int restart)> restartCommand;
  /// Variables every process of the job gets in its environment, beside its identity (on remote
  /// hosts too, where the launcher's own environment does not reach).
  std::map<std::string, std::string> environment;
  /// Elastic (> 0): the job runs on the hosts that answer, with at least this many workers (see
  /// above); its program stops at a checkpoint when asked (dist::TrainingLoop does).
  int minWorkers = 0;
  /// Whether the program can train with n workers (an even share of its batch); unset: any n.
  std::function<bool(int workers)> admitsWorkers;
  /// How often an elastic job probes the hosts it runs without.
  std::chrono::milliseconds hostProbeInterval{5000};
};

/// Runs the job and returns the launcher's exit status: 0 when every worker succeeded (in the
/// last start), else 1 (the failure is printed to stderr, naming the process and how it ended).
int launch(const ResourceSpec& spec, const std::vector<std::string>& command, const LaunchOptions& options = {});

}  // namespace weft::dist
