// A parameter server: holds the partitions the placement plan gives it, with their optimizer
// slots, and answers workers' requests (dist/ServerProtocol.h). Synchronisation is BSP: a push
// for step t is accepted while the partition is at version t; when every worker has pushed, the
// gradients are aggregated in worker order (sparse rows concatenated, as one worker with the
// total batch would have them; dense gradients summed) and scaled, their squared norm goes back
// to the pushers (clipping by global norm needs it), and worker 0's APPLY runs the update chain
// — the same ops the single-device graph would run — on the server's own copy of the variable
// and slots, making version t + 1. A pull for clock c waits until the version reaches c.
//
// handle() is a pure step from a message to the replies it releases, so every rule is testable
// in one process; serve() is the loop around it over a UCX transport.
#pragma once

#include "core/Session.h"
#include "dist/Placement.h"
#include "dist/ServerProtocol.h"
#include "dist/UcxTransport.h"

#include <memory>
#include <string>
#include <vector>

namespace weft::dist {

class ParameterServer {
 public:
  struct Options {
    int workers = 1;
    double denseScale = 1.0;   ///< applied to the summed dense gradients (1 / workers to average)
    double sparseScale = 1.0;  ///< likewise for sparse rows
    SessionOptions session;
  };
  /// The partitions of `plan` assigned to server `server`.
  ParameterServer(const ServerPlan& plan, int server, Options options);
  ~ParameterServer();
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  /// A reply for worker `worker`.
  struct Reply {
    int worker = 0;
    std::vector<uint8_t> header;
    std::vector<uint8_t> payload;
  };
  /// Handles one message and returns the replies it releases (its own, and those of requests
  /// that were waiting for it). A request the server cannot serve (wrong partition, sizes, ids
  /// out of range, out-of-order clock) gets an error reply and changes nothing; a message whose
  /// header is not a valid request from a worker of the job throws, and changes nothing.
  std::vector<Reply> handle(const UcxTransport::Message& message);
  /// Whether every worker has said goodbye, and whether worker `worker` has.
  bool finished() const;
  bool hasLeft(int worker) const;
  /// The partitions this server holds (indices into the plan).
  std::vector<int> partitions() const;

 private:
  struct PartitionState;
  PartitionState& partitionFor(const RequestHeader& h);
  std::vector<Reply> serve(PartitionState& p, const RequestHeader& h, const std::vector<uint8_t>& payload);
  std::vector<Reply> push(PartitionState& p, const RequestHeader& h, const std::vector<uint8_t>& payload);
  std::vector<Reply> apply(PartitionState& p, const RequestHeader& h, const std::vector<uint8_t>& payload);
  /// Replies to the pulls that the partition's version now allows.
  void releaseWaiting(PartitionState& p, std::vector<Reply>& out);

  const ServerPlan& plan_;
  int server_;
  Options options_;
  std::vector<std::unique_ptr<PartitionState>> states_;  // by plan partition index (null: another server's)
  std::vector<bool> leftJob_;
};

/// Serves on `transport` until every worker has said goodbye, then closes the connections. A
/// message that is not a valid request is logged (naming `who`) and dropped; a dead worker or a
/// failed send throws. `workerPeers[r]` is the transport's peer index of worker rank r.
void serve(ParameterServer& server, UcxTransport& transport, const std::vector<int>& workerPeers,
           const std::string& who);

}  // namespace weft::dist
