// When a worker may go on under the stale-synchronous modes: a partition's gate counts each
// sender's updates applied (its clock) and answers a sender's pull only while the sender is
// close enough to the slowest one. SSP(s) allows s clocks; DSSP [s_L, s_U] (the DSSP paper,
// Algorithms 1 and 2) allows s_L, and lets the fastest sender, when it first goes beyond s_L, run
// r* more iterations, r* <= s_U - s_L chosen from the senders' last push intervals to minimise
// its predicted wait for the slowest. A pull is never answered beyond s_U clocks ahead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace weft::dist {

/// A sender's two latest push times, in seconds on one steady clock.
struct PushTimes {
  double latest = 0, previous = 0;
  int pushes = 0;
  bool intervalKnown() const { return pushes >= 2; }
  double interval() const { return latest - previous; }
};

/// Algorithm 2 of the DSSP paper: simulates the next `rMax` pushes of the fastest sender and of
/// the slowest from their latest intervals and returns the extra iterations r in [0, rMax] at
/// which the fastest would be closest in time to one of the slowest's pushes (the least wait);
/// ties go to the smaller r. 0 when either interval is not known yet.
int dsspExtraIterations(const PushTimes& fastest, const PushTimes& slowest, int rMax);

class StalenessGate {
 public:
  /// `senders` senders; pulls are answered up to `lower` clocks ahead of the slowest sender, and
  /// under DSSP (`upper` > `lower`) up to `upper` for the extra iterations the controller grants.
  StalenessGate(int senders, int lower, int upper);

  /// Sender `sender`'s update was applied; its push arrived at `pushTime` (seconds).
  void applied(int sender, double pushTime);
  /// Sender `sender` has left the job: it holds no one back any more.
  void leave(int sender);
  /// Whether the pull `sender` makes after its latest update may be answered now.
  bool mayProceed(int sender) const;
  /// The sender's clock minus the slowest present sender's.
  int64_t gap(int sender) const;
  uint64_t clock(int sender) const { return clocks_.at(static_cast<size_t>(sender)); }
  /// DSSP: the extra iterations `sender` may still run beyond `lower`.
  int allowance(int sender) const { return allowance_.at(static_cast<size_t>(sender)); }

 private:
  uint64_t slowestClock() const;
  int slowestSender() const;
  bool isFastest(int sender) const;

  int lower_, upper_;
  std::vector<uint64_t> clocks_;
  std::vector<PushTimes> times_;
  std::vector<int> allowance_;
  std::vector<bool> granted_, left_;
};

}  // namespace weft::dist
