// Local aggregation: the workers of one machine reach the parameter servers as one. Their
// requests go to their machine's first server, whose LocalAggregator
// - waits until the workers of the machine have pushed a partition's gradient for a clock (its
//   SyncPolicy says how many: under BSP every one, once per step), then forwards their sum (sparse rows
//   of one id added up, so each row touched on the machine crosses the network once), and hands
//   the owner's answer (the squared norm) back to each;
// - keeps the rows and partitions pulled for each clock, so a row crosses the network once per
//   version however many workers read it: a pull is answered from what is kept, and the rows
//   missing are fetched (those of pulls that arrive while a fetch is on its way are merged into
//   the next one). Pulls do not wait for the other workers: the chief worker also reads alone,
//   for evaluation;
// - forwards what one worker asks alone (APPLY and LOAD from worker 0, a FETCH) as it comes.
// So the bytes that leave a machine are those of one worker with the machine's whole batch: the
// sparsity-aware paper's two-level aggregation (its LocalAggN on the machine, GlobalAggN on the
// server).
//
// Like ParameterServer::handle, fromMember does no I/O: it steps from a message to what it
// releases, so every rule is testable in one process.
#pragma once

#include "dist/transport/Traffic.h"
#include "dist/Placement.h"
#include "dist/server/ServerProtocol.h"
#include "dist/server/SyncPolicy.h"
#include "dist/transport/Transport.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace weft::dist {

/// Which workers reach the servers together. A group is the workers of a machine whose first
/// server aggregates them (`relay` is that server's index), or a single worker that talks to
/// the servers itself (`relay` -1). A group's requests carry its first worker's rank.
///
/// In a pipelined job a group is one data-parallel replica of the pipeline, its stage processes
/// (`everyMemberSends`): each sends its own requests, for the variables its stage holds, so
/// every partition hears from one member of each group; the group is one sender of the step.
struct SenderGroups {
  std::vector<int> groupOfWorker;
  std::vector<std::vector<int>> members;  ///< worker ranks, ascending, per group
  std::vector<int> relay;                 ///< per group
  bool everyMemberSends = false;

  /// Every worker on its own.
  static SenderGroups separate(int workers);
  /// The replicas of a pipeline of `stages` stages: workers r·S .. r·S + S − 1 are replica r.
  static SenderGroups pipelineReplicas(int workers, int stages);
  int leader(int group) const { return members.at(static_cast<size_t>(group)).front(); }
  int groups() const { return static_cast<int>(members.size()); }
  /// Whether worker `worker` sends requests itself (rather than its group's leader for it).
  bool sends(int worker) const {
    return everyMemberSends || leader(groupOfWorker.at(static_cast<size_t>(worker))) == worker;
  }
};

class LocalAggregator {
 public:
  /// Aggregates for `members` (worker ranks, ascending; the first speaks for them all).
  /// `wire`: how pulled and pushed rows of f32 variables travel (dist/server/WireRows.h); the
  /// machine's pushes are summed in f32 and narrowed again.
  LocalAggregator(const ServerPlan& plan, std::vector<int> members, int serverCount,
                  std::shared_ptr<const SyncPolicy> sync = bspPolicy(), DType wire = DType::F32);

  /// What a message releases: replies to members (by worker rank) and requests for servers (by
  /// server index).
  struct Released {
    std::vector<std::pair<int, Message>> replies;
    std::vector<std::pair<int, Message>> forwards;
  };
  /// A member's request. A request that cannot be served (a partition outside the plan, a
  /// malformed payload, a second push for one clock) gets an error reply and changes nothing;
  /// a message that is not a request from a member throws.
  Released fromMember(const Message& message);
  /// A server's reply to a forwarded request; throws when it answers nothing in flight.
  Released fromServer(const Message& message);

  bool isMember(int worker) const;
  bool hasLeft(int worker) const;
  /// Whether every member has left and the goodbyes for the group have gone to every server.
  bool saidGoodbye() const { return goodbyesSent_; }
  /// Whether, besides, every server has acknowledged them.
  bool finished() const { return goodbyesSent_ && inFlight_.empty(); }
  /// The server a forwarded request in flight went to, and its kind.
  std::pair<int, RequestKind> destinationOf(uint64_t forwardedId) const;
  /// Rows of the sparse gradients that reached the aggregator (lookups: summed over members) and
  /// left it (touched), per variable.
  const std::map<std::string, SparseRows>& sparseRows() const { return sparseRows_; }
  /// Pushes forwarded, the most for any partition: the steps taken.
  int64_t steps() const;

 private:
  struct Request {
    RequestHeader header;
    std::vector<uint8_t> payload;
  };
  using Key = std::tuple<RequestKind, uint32_t, uint64_t>;  // kind, partition, clock
  struct InFlight {
    int server = 0;
    RequestKind kind = RequestKind::Push;
    std::vector<Request> requests;  // the members' requests it answers, in member order
    Key pull{};                     // for pulls: what the answer fills
    std::vector<int64_t> rows;      // for row pulls: the rows asked for
  };
  /// A partition's values at one version, as far as they have been pulled.
  struct Pulled {
    std::vector<uint8_t> rows;                   // the rows kept, in the order they came
    std::unordered_map<int64_t, size_t> slotOf;  // row id -> index in `rows`
    std::optional<std::vector<uint8_t>> whole;   // the partition, once pulled whole
    bool fetching = false;
    std::vector<Request> waiting;
  };

  int indexOf(int worker) const;
  void check(const RequestHeader& h, const std::vector<uint8_t>& payload) const;
  Released forward(std::vector<Request> requests, std::vector<uint8_t> payload);
  Released pull(const Request& request);
  /// Answers the waiting pulls of `key` that its kept values cover; fetches the rest.
  Released servePulls(const Key& key);
  Released pulled(InFlight done, const ReplyHeader& reply, std::vector<uint8_t> payload);
  std::vector<uint8_t> sumPushes(const std::vector<Request>& pushes);
  Released sayGoodbye();

  const ServerPlan& plan_;
  std::vector<int> members_;
  int serverCount_;
  std::shared_ptr<const SyncPolicy> sync_;
  DType wire_;
  std::map<std::pair<uint32_t, uint64_t>, std::vector<std::optional<Request>>>
      pushes_;  // by (partition, clock), per member
  std::map<Key, Pulled> pulled_;
  std::map<uint64_t, InFlight> inFlight_;
  std::vector<bool> left_;
  bool goodbyesSent_ = false;
  uint64_t nextId_ = 1;
  std::vector<int64_t> pushesForwarded_;  // per partition
  std::map<std::string, SparseRows> sparseRows_;
};

}  // namespace weft::dist
