// A parameter server: holds the partitions the placement plan gives it, with their optimizer
// slots, and answers workers' requests (dist/server/ServerProtocol.h). The workers of a machine may
// reach it as one sender, through their machine's local aggregator (dist/server/LocalAggregator.h).
// Its SyncPolicy (dist/server/SyncPolicy.h) says when a push is taken and when a pull is answered, and
// makes each partition's update strategy (dist/server/PartitionUpdates.h): under BSP a version's pushes,
// once complete, are aggregated in sender order (sparse rows concatenated, as one worker with
// the total batch would have them; dense gradients summed) and scaled, their squared norm goes
// back to the pushers (clipping by global norm needs it), and worker 0's APPLY runs the update
// chain — the same ops the single-device graph would run — on the server's own copy of the
// variable and slots, making the next version; then the moving averages of the variable, if any.
// Under the asynchronous modes each sender's push is an update of its own, applied by its own
// APPLY, and a StalenessGate holds its pulls. The server itself holds what every mode shares:
// each partition's update chain and values, and the pulls waiting for a version.
//
// handle() does no I/O: it steps from a message to the replies it releases (reading the clock
// only for the synchronisation modes' timing), so every rule is testable in one process; handleAll() takes a batch and
// serves its partitions in parallel. The loop around them (dist/server/ServerProcess.h) moves messages over a
// transport.
#pragma once

#include "core/Session.h"
#include "core/ThreadPool.h"
#include "dist/transport/Deadline.h"
#include "dist/server/LocalAggregator.h"
#include "dist/transport/Message.h"
#include "dist/server/PartitionUpdates.h"
#include "dist/Placement.h"
#include "dist/server/ServerProtocol.h"
#include "dist/server/SyncPolicy.h"

#include <map>
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
    /// Who sends: empty means every worker on its own.
    SenderGroups groups;
    std::shared_ptr<const SyncPolicy> sync = bspPolicy();
    /// How pulled and pushed rows of f32 variables travel (dist/server/WireRows.h).
    DType wire = DType::F32;
  };
  /// The partitions of `plan` assigned to server `server`.
  ParameterServer(const ServerPlan& plan, int server, Options options);
  ~ParameterServer();
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  /// A reply for worker `worker` (for a group's request, its first worker: the group's sender).
  struct Reply {
    int worker = 0;
    RequestKind kind = RequestKind::PullAll;  ///< of the request it answers
    std::vector<uint8_t> header;
    std::vector<uint8_t> payload;
  };
  /// Handles one message and returns the replies it releases (its own, and those of requests
  /// that were waiting for it). A request the server cannot serve (wrong partition, sizes, ids
  /// out of range, out-of-order clock) gets an error reply and changes nothing; a message whose
  /// header is not a valid request from a worker of the job throws, and changes nothing.
  std::vector<Reply> handle(const Message& message);
  /// Messages that arrived together, handled as handle() would one by one, except that the
  /// requests of different partitions are served in parallel (each partition's in arrival
  /// order, a sender's goodbye after its requests): this is where partitioning a variable pays.
  /// `rejected` holds, for each message that is not a valid request from a worker of the job,
  /// why; such a message changes nothing.
  struct Handled {
    std::vector<Reply> replies;
    std::vector<std::string> rejected;
  };
  Handled handleAll(const std::vector<Message>& messages);
  /// Whether every sender has said goodbye, and whether the sender of worker `worker` has (the
  /// worker itself, or its machine's aggregator).
  bool finished() const;
  bool hasLeft(int worker) const;
  const SenderGroups& groups() const { return options_.groups; }
  /// The partitions this server holds (indices into the plan).
  std::vector<int> partitions() const;
  /// The most updates applied to any partition it holds.
  int64_t steps() const;
  /// Asynchronous modes: what each sender group's pulls met, over the partitions held here.
  std::vector<SenderStaleness> staleness() const;

 private:
  struct PartitionState;
  /// Throws unless `h` may come from its worker now (in the job, its group's sender, still in).
  void admit(const RequestHeader& h) const;
  PartitionState& partitionFor(const RequestHeader& h);
  /// serve(), with a failure answered by an error reply naming the request.
  std::vector<Reply> serveOrRefuse(const RequestHeader& h, const std::vector<uint8_t>& payload);
  std::vector<Reply> serve(PartitionState& p, const RequestHeader& h, const std::vector<uint8_t>& payload);
  /// The replies the partition's update strategy released, then those of the pulls it now allows.
  std::vector<Reply> release(PartitionState& p, std::vector<Released> released);
  /// The sender group of `h`'s worker.
  int senderOf(const RequestHeader& h) const;
  /// The updates that hold the pushes of `h`'s sender (the strategy's to say).
  uint64_t versionFor(const PartitionState& p, const RequestHeader& h) const;
  /// Whether the pull `h` may be answered now (its version is there; the gate lets it by).
  bool pullAnswerable(const PartitionState& p, const RequestHeader& h) const;
  /// The reply to pull `h`, counting what it met under an asynchronous mode.
  Reply answerPull(PartitionState& p, const RequestHeader& h, const std::vector<uint8_t>& payload,
                   Clock::time_point since);
  /// Replies to the pulls that the partition's version (and gate) now allows.
  void releaseWaiting(PartitionState& p, std::vector<Reply>& out);
  /// Worker `h.worker` says goodbye; its group leaves with its last sending member.
  void sayGoodbye(const RequestHeader& h, std::vector<Reply>& out);
  /// A sender group leaves: it holds no other sender's pulls back any more.
  void leave(int group, std::vector<Reply>& out);

  const ServerPlan& plan_;
  int server_;
  Options options_;
  std::vector<std::unique_ptr<PartitionState>> states_;  // by plan partition index (null: another server's)
  std::vector<bool> leftJob_;  // by sender group
  std::vector<bool> saidGoodbye_;  // by worker
  ThreadPool pool_;            // serves partitions in parallel
};

}  // namespace weft::dist
