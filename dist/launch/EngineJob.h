// A job started by a cluster engine (srun, mpirun, torchrun, a Kubernetes Job) rather than by
// `weft launch`: each process turns the engine's view of it (dist/launch/Engine.h) into the identity
// weft's launcher would have given it, so joinJob and get_runner run unchanged, and the job's
// first process (local rank 0 of host 0) does what the launcher did besides starting processes:
// it serves the authenticated rendezvous and watches the members.
//
//   srun -N 2 --ntasks-per-node 3 weft train lm --secret-file ~/.weft/secret ...
//
// The job secret: on one host, the first process makes one (or reads --secret-file) and leaves
// it, with the rendezvous's port and the job id, in a 0600 file of a 0700 directory of the
// user's ($XDG_RUNTIME_DIR/weft, else /tmp/weft-UID), named after the engine's ids of the run;
// the others read it there, once the process that wrote it is alive (a file left by a killed run
// is passed over). Across hosts every process reads the same secret file (--secret-file,
// WEFT_SECRET_FILE: a Kubernetes Secret mount, a 0600 file on a shared path), and the rendezvous
// listens on the engine's master port (+1 under torchrun, whose own store holds that one), on
// WEFT_RENDEZVOUS's, or on a port from the job's ids (20000-39999).
//
// Exit statuses, for the engine's restart policies: 0 the member finished; 1 it failed (its
// message names it); kExitPeerFailed (75) it stopped because another member failed or left
// without finishing, which the first process names to every member before they stop.
#pragma once

#include "dist/launch/Engine.h"

#include <chrono>
#include <memory>
#include <string>

namespace weft::dist {

/// The exit status of a member that stopped because another member of its job failed.
inline constexpr int kExitPeerFailed = 75;

/// Whether this process joined a job through a cluster engine (EngineJob put WEFT_ENGINE in
/// its environment): its coordinator is its job's first process, not a launcher.
bool startedByEngine();

/// Where the rendezvous of the job `view` describes runs, and this host's address toward it.
struct EngineRendezvous {
  std::string host;         ///< "127.0.0.1" for a job on one host
  uint16_t port = 0;        ///< 0 on one host: the first process picks one and leaves it in the secret's file
  std::string selfAddress;  ///< where this host's processes listen
};
/// Throws when the job spans hosts and nothing says where the rendezvous runs, or its address
/// does not resolve or is a loopback address.
EngineRendezvous engineRendezvous(const EngineView& view);

/// What `weft env` prints: the engine `environment` names, this process's rank, host and role
/// in the job it would form with `serversPerHost`, where its rendezvous runs, and the variables
/// read; or that no engine started it. Throws as joining would, for a partial or contradictory
/// environment.
std::string describeEngineEnvironment(const Environment& environment, int serversPerHost);

/// Records that this process finished its part of the job (JobContext::leave calls it): the
/// first process's EngineJob then waits for the others instead of stopping them.
void noteProcessLeft();

struct EngineOptions {
  int serversPerHost = 0;  ///< the first K processes of each host serve; the others are workers
  std::string secretFile;  ///< the job secret's file; "" reads WEFT_SECRET_FILE
  std::chrono::milliseconds rendezvousTimeout{60000};
  /// A member silent this long while the others beat stops the job, named.
  std::chrono::milliseconds silenceLimit{20000};
  /// get_runner(graph, config): from SIGTERM to the exit of a process whose loop stops at a step
  /// on it (dist::TrainingLoop), at most; servers serve until their workers stopped.
  std::chrono::milliseconds termGrace{25000};
};

class EngineJob {
 public:
  /// Makes this process the member `view` describes: puts weft's launch identity in its
  /// environment (WEFT_COORDINATOR, WEFT_ROLE, WEFT_HOST, WEFT_SLOT, WEFT_JOB_ID,
  /// WEFT_JOB_SECRET_FD, WEFT_RESOURCES, WEFT_ENGINE), and in the job's first process starts
  /// the rendezvous and the watch over the members. Throws naming what is missing (a secret
  /// file across hosts, an address for the rendezvous) or does not resolve.
  EngineJob(EngineView view, const EngineOptions& options);
  /// In the first process: waits until every member has left (or stops the job when one
  /// failed); when an exception is unwinding, stops the job at once, saying this process failed.
  ~EngineJob();
  EngineJob(const EngineJob&) = delete;
  EngineJob& operator=(const EngineJob&) = delete;

  /// The job the engine's view lays out, and this process's place in it.
  const EngineLayout& layout() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace weft::dist
