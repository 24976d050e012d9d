// How a parameter server turns one partition's pushes and APPLYs into updates: one class per
// family of synchronisation modes, each holding its own state and answering for its own rules,
// made by the job's SyncPolicy (SyncPolicy::makeUpdates). The server keeps what every mode
// shares (the partition's update chain, its values, its waiting pulls) and asks the strategy
// when a push or APPLY comes, which version a sender's clocks count against, and whether a pull
// that its version allows may be answered now.
//
// BSP (SynchronousUpdates): a version takes one push of every sender; once all are in, they are
// aggregated in sender order, every pusher hears the squared norm, and worker 0's APPLY makes
// the next version. The asynchronous modes (OwnUpdates): each sender's push is an update of its
// own, applied by its own APPLY; a StalenessGate (SSP, DSSP) holds a sender's pulls while it is
// too far ahead of the slowest, and every answered pull's distance from the slowest is counted.
// A new mode (local SGD, say) is one more class here and a SyncPolicy that makes it.
#pragma once

#include "core/Session.h"
#include "dist/server/ServerProtocol.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace weft::dist {

class SyncPolicy;
class StalenessGate;

/// What one sender's pulls met at a server under an asynchronous mode: how far ahead of the
/// slowest sender it was when each was answered (in clocks), and how long they were held.
struct SenderStaleness {
  uint64_t pulls = 0;
  uint64_t gapSum = 0;
  int64_t maxGap = 0;
  double waitedSeconds = 0;  ///< its partitions' waits overlap: the most any one partition held it
  double meanGap() const { return pulls > 0 ? static_cast<double>(gapSum) / static_cast<double>(pulls) : 0.0; }
};

/// What an update strategy acts on: one partition's update chain on its server.
class UpdateChain {
 public:
  using Payload = std::vector<uint8_t>;
  struct Gradient {
    FeedMap feeds;
    double squaredNorm = 0;
  };
  virtual ~UpdateChain() = default;
  /// Throws unless `payload` is a valid push for the partition (its sparse rows, or its dense
  /// bytes), or valid extra inputs of its update.
  virtual void checkGradient(const Payload& payload) const = 0;
  virtual void checkExtras(const Payload& payload) const = 0;
  /// The pushes `from` (checked), in order, aggregated as one process's gradient and scaled,
  /// with the squared norm of the dense gradient they stand for.
  virtual Gradient aggregate(const std::vector<const Payload*>& from) = 0;
  /// Runs the update on `gradient` with an APPLY's extra inputs (checked): the next version.
  virtual void update(FeedMap gradient, const Payload& extras) = 0;
  /// The updates applied so far.
  virtual uint64_t version() const = 0;
};

/// A reply a strategy releases: to the request `to`, carrying `payload` (empty: an acknowledgement).
struct Released {
  RequestHeader to;
  UpdateChain::Payload payload;
};

class PartitionUpdates {
 public:
  using Payload = UpdateChain::Payload;
  virtual ~PartitionUpdates() = default;
  /// Takes the push `h` of sender `sender`; returns the replies it releases (the pushers', and an
  /// APPLY's that was waiting for it). Throws, having changed nothing, when the mode refuses it
  /// or the chain finds the payload invalid.
  virtual std::vector<Released> push(UpdateChain& chain, const RequestHeader& h, int sender,
                                     const Payload& gradient) = 0;
  /// Takes the APPLY `h` of sender `sender`; likewise.
  virtual std::vector<Released> apply(UpdateChain& chain, const RequestHeader& h, int sender,
                                      const Payload& extras) = 0;
  /// The updates that hold `sender`'s pushes: what its clocks are counted against.
  virtual uint64_t versionOf(const UpdateChain& chain, int sender) const = 0;
  /// Whether no gradient has come yet (values are loaded only before training).
  virtual bool untouched(const UpdateChain& chain) const = 0;
  /// Whether a pull of `sender` that its version allows may be answered now.
  virtual bool mayProceed(int /*sender*/) const { return true; }
  /// Counts a pull of `sender` answered after `heldSeconds`, `left` saying which senders left.
  virtual void answered(int /*sender*/, double /*heldSeconds*/, const std::vector<bool>& /*left*/) {}
  /// `sender` has left the job: it holds nobody back any more.
  virtual void leave(int /*sender*/) {}
  /// What each sender's pulls met (empty where the mode counts nothing).
  virtual std::vector<SenderStaleness> staleness() const { return {}; }
};

/// BSP's updates for a partition of `senders` senders, under `policy`'s rules.
std::unique_ptr<PartitionUpdates> synchronousUpdates(const SyncPolicy& policy, int senders);
/// The asynchronous modes' updates (each sender's push its own update), with `gate` (null: ASP).
std::unique_ptr<PartitionUpdates> ownUpdates(const SyncPolicy& policy, int senders,
                                             std::unique_ptr<StalenessGate> gate);

}  // namespace weft::dist
