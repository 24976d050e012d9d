// The entry point of distributed training: get_runner() takes a single-device training graph and
// returns a Runner that trains it across the job's workers, with no change to the model code
// beyond sharding its input (each worker feeds its own part of the total batch).
//
//     auto runner = weft::dist::get_runner(g, weft::dist::ResourceSpec::load("cluster.json"), cfg);
//     for (...) runner.run({loss}, feedsFor(myShard), {step});
//
// Processes learn their place in a job from the environment the launcher (`weft launch`) sets:
//   WEFT_COORDINATOR  host:port of the rendezvous      WEFT_ROLE  worker | server
//   WEFT_HOST, WEFT_SLOT  the host's index in the specification and the slot among its workers (servers)
//   WEFT_JOB_ID  32 hex digits    WEFT_JOB_SECRET_FILE (a 0600 file) or WEFT_JOB_SECRET (hex)
// Without WEFT_COORDINATOR and with a one-worker specification, the runner trains locally.
#pragma once

#include "core/Session.h"
#include "dist/Communicator.h"
#include "dist/Coordinator.h"
#include "dist/Placement.h"
#include "dist/ResourceSpec.h"
#include "dist/Transform.h"

#include <chrono>
#include <memory>
#include <optional>
#include <string>

namespace weft::dist {

struct Config {
  Architecture architecture = Architecture::Auto;
  bool averageDense = true;   ///< average (rather than sum) dense gradients over the workers
  bool averageSparse = true;  ///< likewise for sparse gradients
  size_t bucketBytes = size_t{4} << 20;  ///< dense gradients are fused into AllReduce buckets of this size
  /// A served sparse variable of at least this many bytes is split into one row partition per server.
  size_t partitionBytes = size_t{1} << 20;
  /// Bounds the rendezvous and every collective: a stall this long is reported as an error
  /// naming the ranks involved, and the job stops.
  std::chrono::milliseconds timeout{60000};
  /// The workers of a machine with a server reach the servers through it, as one (their pushes
  /// summed, their pulls merged): see dist/LocalAggregator.h.
  bool localAggregation = true;
  /// Servers print the pushes and pulls that crossed between machines when the job ends.
  bool reportTraffic = false;
  SessionOptions session;
};

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

/// Runs one worker's replica of the distributed graph.
class Runner {
 public:
  Runner(Runner&&) noexcept;
  Runner& operator=(Runner&&) noexcept;
  /// Waits for the other workers to finish their last step, then leaves the job.
  ~Runner();

  /// Session::run on this worker's replica: collectives inside the step synchronise it with the
  /// other workers, so every worker must run the same fetches and targets, step by step.
  std::vector<Tensor> run(const std::vector<Output>& fetches, const FeedMap& feeds = {},
                          const std::vector<Node*>& targets = {});
  void run(Node* target, const FeedMap& feeds = {}) { run({}, feeds, {target}); }

  /// The mean of `value` over the workers (every worker must call it at the same point), e.g.
  /// the total batch's loss from each worker's part.
  double meanOverWorkers(double value);

  /// Leaves the job: waits until every worker has finished its last step, copies the servers'
  /// final values of the variables they hold into this worker's session, then says goodbye to
  /// the servers. Later runs are local to this worker (collectives fail; lookups of served
  /// variables read the local copy). Called by the destructor when not called before.
  void finish();

  /// Copies the servers' current values of the variables they hold, with their optimizer slots,
  /// into this worker's session (before saving a checkpoint). Nothing to do without servers.
  void pullVariables();
  /// Makes worker 0's values of the served variables and their slots the servers' values (after
  /// restoring a checkpoint). Every worker must call it at the same point.
  void publishVariables();

  /// This worker's rank (0 .. workers() - 1) and the number of workers.
  int rank() const;
  int workers() const;
  Session& session();
  /// What the distribution pass did.
  const DistributedGraph& distribution() const;
  /// Bytes this worker sent and received, per kind, since it started.
  Traffic traffic() const;

 private:
  struct State;
  explicit Runner(std::unique_ptr<State> state);
  friend Runner get_runner(Graph&, const ResourceSpec&, const Config&);
  std::unique_ptr<State> state_;
};

/// Distributes `graph` over the job's workers and returns this worker's runner. In a server
/// process it serves until the workers leave and then exits the process (status 0, or 1 after
/// an error, which it prints). Throws when the job cannot be joined (no launcher environment for
/// a multi-worker specification, refused, timed out) or the graph cannot be distributed.
Runner get_runner(Graph& graph, const ResourceSpec& resources, const Config& config = {});

}  // namespace weft::dist
