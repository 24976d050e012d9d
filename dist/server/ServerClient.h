// A worker's side of the parameter servers: sends requests (dist/server/ServerProtocol.h) as active
// messages of its Transport (UCX between processes) and waits for the replies, on the thread
// that calls it (the executor's) and over a transport of its own. Requests therefore never wait behind the collectives
// queued on the communication thread: a push made while the dense AllReduce runs travels beside it. It keeps the
// worker's clock per partition (gradients pushed so far), which every request carries. The graph ops that pull rows and
// push gradients find their client by id, like the collective ops find their backend. When a request waits is the
// SyncPolicy's to say (BSP by default).
#pragma once

#include "dist/Placement.h"
#include "dist/server/ServerProtocol.h"
#include "dist/server/SyncPolicy.h"
#include "dist/server/WireRows.h"
#include "dist/transport/Traffic.h"
#include "dist/transport/Transport.h"

#include <atomic>
#include <optional>
#include <unordered_map>
#include <chrono>
#include <cstdint>
#include <vector>

namespace weft::dist {

class ServerClient {
 public:
  /// `serverPeers[s]` is the transport's peer index of server s. With `relay` (a server index,
  /// or -1) every request goes to that server, the local aggregator of this worker's machine.
  /// `transport` is used by this client alone; its bytes count in `traffic`.
  /// `wire`: how pulled and pushed rows of f32 variables travel (dist/server/WireRows.h).
  ServerClient(TrafficLog& traffic, Transport& transport, int rank, std::vector<int> serverPeers,
               const ServerPlan& plan, std::chrono::milliseconds timeout, int relay = -1,
               std::shared_ptr<const SyncPolicy> sync = bspPolicy(), DType wire = DType::F32);
  ~ServerClient();
  ServerClient(const ServerClient&) = delete;
  ServerClient& operator=(const ServerClient&) = delete;

  struct Call {
    int partition = 0;
    RequestKind kind = RequestKind::PullAll;
    std::vector<uint8_t> payload;
  };
  /// Sends every call and waits for every reply; returns the reply payloads in call order.
  /// Throws the server's error message, or names the request, the partition and its variable
  /// when its server fails or does not answer within the timeout.
  std::vector<std::vector<uint8_t>> request(std::vector<Call> calls, TrafficKind kind);
  /// PULL_ROWS calls (each payload the partition's local row ids, int64, ascending, unique), as
  /// request() makes them, except that with keepPulledRows() only the rows not kept from an
  /// earlier pull at the same clock travel.
  std::vector<std::vector<uint8_t>> pullRows(std::vector<Call> calls, TrafficKind kind);
  /// PULL_ALL calls, as request() makes them, except that with keepPulledRows() a partition
  /// pulled whole at the same clock is not pulled again.
  std::vector<std::vector<uint8_t>> pullWhole(std::vector<Call> calls, TrafficKind kind);
  /// Under BSP the value a pull at a clock reads is fixed (the version of that clock) for a
  /// partition this worker pushes: from now on the rows (and whole partitions) pulled at a clock
  /// are kept until this worker next pushes their partition, so a pipeline stage's micro-batches
  /// and their backward runs fetch each row once a step. A partition it does not push is read at
  /// whatever version the servers hold: the caller forgets what is kept (forgetPulledRows)
  /// before each step.
  void keepPulledRows();
  void forgetPulledRows();
  /// Tells every server (or the relay) that this worker leaves the job, and waits until each has
  /// heard it (so that closing the connections afterwards is not taken for a failure).
  void goodbye();

  /// Whether the worker's session holds the servers' current values of every served variable
  /// (set after Runner::pullVariables; cleared by this worker's next push when the sync policy
  /// keeps values until then, and at once otherwise): pulls then read it locally.
  bool localCopyCurrent() const { return localCopyCurrent_; }
  void setLocalCopyCurrent(bool current) { localCopyCurrent_ = current && sync_->valuesWaitForOwnPush(); }

  /// Whether this worker applies its own pushes (the asynchronous modes), rather than worker 0
  /// applying the step's aggregate for every worker (BSP).
  bool appliesOwnPushes() const { return !sync_->synchronous(); }
  /// Whether this worker sends the step's APPLY for every worker under BSP: worker 0, or in a
  /// pipelined job the first replica's stages, each for the variables its stage holds.
  bool appliesForAll() const { return replica_ == 0; }
  /// Makes this worker a stage process of data-parallel replica `replica` of a pipeline.
  void setReplica(int replica) { replica_ = replica; }
  int rank() const { return rank_; }
  /// How the rows of `v` travel to and from the servers.
  RowWire wireOf(const ServedVariable& v) const { return RowWire::of(v, wire_); }
  TrafficLog& traffic() const { return traffic_; }
  const ServerPlan& plan() const { return plan_; }
  int64_t id() const { return id_; }
  /// The live client of this id, or nullptr once it is gone (the worker has left the job).
  static ServerClient* find(int64_t id);

 private:
  /// The server a call goes to: the partition's, or the relay.
  int destinationOf(const Call& call) const;
  std::string describe(const Call& call) const;
  int serverOf(const Call& call) const;

  TrafficLog& traffic_;
  Transport& transport_;
  int rank_;
  int replica_;
  std::vector<int> serverPeers_;
  const ServerPlan& plan_;
  std::chrono::milliseconds timeout_;
  int relay_;
  std::shared_ptr<const SyncPolicy> sync_;
  DType wire_;
  int64_t id_;
  std::vector<uint64_t> pushes_;  // per partition
  /// Rows pulled at a partition's clock (keepPulledRows): where each local id's row is in `rows`,
  /// and the whole partition once a PULL_ALL has brought it.
  struct KeptRows {
    uint64_t clock = 0;
    std::unordered_map<int64_t, size_t> at;
    std::vector<uint8_t> rows;
    std::optional<std::vector<uint8_t>> whole;
  };
  /// What is kept of `partition` at this worker's clock for it (emptied when the clock moved).
  KeptRows& keptAt(int partition);
  bool keepRows_ = false;
  std::vector<KeptRows> kept_;  // per partition
  uint64_t nextRequest_ = 1;
  std::atomic<bool> localCopyCurrent_{false};
};

}  // namespace weft::dist
