// Joining a job: where a launched process stands (its identity from the launcher's environment),
// its transports, the coordinator's roster, and the routes to every other worker and server.
// Whatever a process of a job then does — serve (dist/server/ServerProcess.h) or run a worker's replica
// of the model (dist/Runner.h) — starts from the JobContext that joinJob() returns.
//
// Processes learn their place in a job from the environment the launcher (`weft launch`) sets:
//   WEFT_COORDINATOR  host:port of the rendezvous      WEFT_ROLE  worker | server
//   WEFT_HOST, WEFT_SLOT  the host's index in the specification and the slot among its workers (servers)
//   WEFT_JOB_ID  32 hex digits    WEFT_JOB_SECRET_FD (an inherited descriptor holding it in hex; the
//   launcher's sealed memfd), WEFT_JOB_SECRET_FILE (a 0600 file) or WEFT_JOB_SECRET (hex)
#pragma once

#include "core/Device.h"
#include "core/Graph.h"
#include "dist/Config.h"
#include "dist/launch/Coordinator.h"
#include "dist/server/LocalAggregator.h"
#include "dist/launch/ResourceSpec.h"
#include "dist/transport/Transport.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace weft::dist {

/// Where a launched process stands in its job.
struct LaunchIdentity {
  MemberId id;
  std::string coordinatorHost;
  uint16_t coordinatorPort = 0;
  JobId job{};
  Secret secret{};
};
/// The identity the launcher put in the environment; nullopt when WEFT_COORDINATOR is unset.
/// Throws naming the variable when one is missing or malformed.
std::optional<LaunchIdentity> launchIdentityFromEnvironment();

/// The device the calling process computes on in the job `resources` describes: a launched
/// worker's GPU ("cuda:N") when its host lists gpus, else "cpu" (servers, CPU workers). A process
/// started without the launcher is the specification's only worker. A GPU worker builds its
/// model under `graph.onDevice(processDevice(spec))`, so its dense gradients sum through NCCL.
std::string processDevice(const ResourceSpec& resources);

/// Where a process's peers are: the transport peer index of each worker rank and each server
/// (-1 where the process does not talk to it, or for itself), and the machine of each.
struct PeerRoutes {
  int self = -1;  ///< a server's own index
  std::vector<int> workerPeers, serverPeers;
  std::vector<int> workerHosts, serverHosts;
};

/// A process's place in the job it has joined.
struct JobContext {
  LaunchIdentity identity;
  Roster roster;
  Device device;            ///< where this process computes
  bool gpuWorkers = false;  ///< the job's workers are GPUs, summing dense gradients through NCCL
  /// A worker's transport to the other workers; a server's to everyone.
  std::unique_ptr<Transport> transport;
  /// A worker's requests to the servers (null in a job without servers, and in a server).
  std::unique_ptr<Transport> clientTransport;
  PeerRoutes routes;  ///< peer indices (on the transport that reaches them) and machines
  SenderGroups groups;  ///< who reaches the servers together (local aggregation)
  /// Opens another transport of this process on `channel` (2 and above: 0 and 1 are those of
  /// `transport` and `clientTransport`), which hears only the roster's members' transports on
  /// that channel: for a thread of the process's own (the sums among a pipeline stage's
  /// replicas) while its main thread talks through `transport`. The caller hands its address to
  /// the peers (over `transport`, which is sealed) and connects to theirs with workerEndpoint.
  std::function<std::unique_ptr<Transport>(uint8_t channel)> openTransport;

  bool isServer() const { return identity.id.role == Role::Server; }
  /// A worker's rank among the workers (0 .. workers() - 1).
  int rank() const { return roster.rank; }
  int workers() const { return static_cast<int>(routes.workerPeers.size()); }
  int servers() const { return static_cast<int>(routes.serverPeers.size()); }
  /// Machines of the job: one more than the highest host index of a worker or server.
  int machines() const;
  /// The relay (a server index, or -1) through which this worker reaches the servers.
  int relay() const;
  /// The name in the job of worker `rank`'s transport on `channel`.
  EndpointName workerEndpoint(int rank, uint8_t channel) const;
  /// Tells the coordinator that this process finished its part of the job: its exit is then no
  /// failure (a job started by a cluster engine tells the two apart only so).
  void leave();
};

/// The network interface of host `host`'s address in the specification, where its processes'
/// UCX transports listen ("lo" for a job on loopback): not every interface of the machine.
/// Throws naming the address and the machine's interfaces when none carries it.
std::string listeningDevice(const ResourceSpec& resources, int host);

/// The largest payload a request or reply of a job training `graph` may declare: twice all its
/// variables' bytes (optimizer slots included), and 1 MiB for small requests. A LOAD carries one
/// partition and its slots; no pull or push carries more. (A collective's data, such as an
/// AllGather of sparse rows, grows with the batch: it is fetched only into a receive of the size
/// the collective expects, and is not limited here.)
uint64_t payloadLimit(const Graph& graph);
/// Makes the job's transports drop messages that declare more than payloadLimit(graph).
void limitPayloads(JobContext& job, const Graph& graph);

/// Joins the job the launcher started this process in: checks the specification against this
/// machine, makes the transports, takes part in the rendezvous (within the config's timeout) and
/// connects to the peers it will talk to. nullopt when the process was not launched
/// (WEFT_COORDINATOR unset). Throws naming the reason when the job cannot be joined.
std::optional<JobContext> joinJob(const ResourceSpec& resources, const Config& config);

/// The last step of joining, once `job` has its identity, transports and roster: connects to
/// the peers this process talks to and works out the routes and the sender groups. joinJob
/// calls it after the rendezvous; tests call it on rosters of their own over in-process
/// transports (dist/transport/LoopbackTransport.h), to run a whole job in one process.
void connectJob(JobContext& job, const Config& config);

}  // namespace weft::dist
