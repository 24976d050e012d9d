// `weft launch`: starts every process of a job and stops the whole job when any of them fails.
// It creates the job's id and secret (the secret goes to a mode-0600 file in a private
// directory, or through ssh's standard input to remote hosts; never onto a command line), runs
// the rendezvous coordinator, and starts the same command once per worker and once per server,
// each with its identity in the environment (see Runner.h). Local hosts (127.x, localhost) get
// child processes; other hosts get `ssh HOST` in the launching directory.
//
// The job ends when every worker exited with status 0 (the servers then leave by themselves).
// When a process fails (non-zero status, a signal) or the launcher gets SIGINT or SIGTERM, every
// other process gets SIGTERM, then SIGKILL after a grace period: no process is left behind.
#pragma once

#include "dist/ResourceSpec.h"

#include <chrono>
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
  /// A process that sends no heartbeat for this long (it froze, or the network cut it off)
  /// stops the job, named. Heartbeats come every second from a thread of their own, so a long
  /// step or evaluation never looks silent.
  std::chrono::milliseconds silenceLimit{20000};
};

/// Runs the job and returns the launcher's exit status: 0 when every worker succeeded, else 1
/// (the failure is printed to stderr, naming the process and how it ended).
int launch(const ResourceSpec& spec, const std::vector<std::string>& command, const LaunchOptions& options = {});

}  // namespace weft::dist
